/*
 * store_write.c: the async writers of store.h (agents, jobs, events,
 * keys, usage), queued for the DB thread.
 */
#include "server/store/store_priv.h"

#include <string.h>

#include "common/gp_util.h"

/* ------------------------------------------------------------------------ */
/* Async writes                                                             */
/* ------------------------------------------------------------------------ */

int gps_store_agent_upsert(gps_store *s, gps_store_agent_row r)
{
    if (!r.id || !r.state)
        return -1;
    if (r.labels)
        return store_write_op(s, K_AGENT_UPSERT, "tttttjjti", r.id, r.name, r.version, r.platform,
                              r.state, r.labels, r.facts, r.key_id, (int64_t)r.last_seen);
    return store_write_op(s, K_AGENT_UPSERT, "ttttttjti", r.id, r.name, r.version, r.platform,
                          r.state, "{}", r.facts, r.key_id, (int64_t)r.last_seen);
}

int gps_store_agent_state(gps_store *s, const char *agent_id, const char *state,
                          int64_t last_seen)
{
    if (!agent_id || !state)
        return -1;
    return store_write_op(s, K_AGENT_STATE, "tti", agent_id, state, last_seen);
}

int gps_store_agent_models(gps_store *s, const char *agent_id, const gps_store_model_row *models,
                           size_t n)
{
    if (!agent_id || (n && !models))
        return -1;
    opb b;
    store_b_spec(&b, K_MODELS_CLEAR, "t", agent_id);
    op *head = store_b_pack(&b), *tail = head;
    if (!head)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        const gps_store_model_row *m = &models[i];
        if (!m->model)
            continue;
        json_t *al = json_array();
        for (size_t k = 0; al && k < m->n_aliases; k++)
            if (m->aliases[k])
                json_array_append_new(al, json_string(m->aliases[k]));
        if (!al)
            goto oom;
        store_b_spec(&b, K_MODEL_INSERT, "ttjtzzi", agent_id, m->model, al, m->quantization,
                     (int64_t)m->context_length, (int64_t)m->vram_bytes,
                     (int64_t)(m->loaded ? 1 : 0));
        json_decref(al);
        op *o = store_b_pack(&b);
        if (!o)
            goto oom;
        tail->next = o;
        tail = o;
    }
    /* One chain: the delete and the inserts land in the same transaction
     * unless the batch boundary falls between them (then the next commit
     * follows within milliseconds). */
    return store_enqueue(s, head, true);
oom:
    store_free_chain(head);
    store_count_drop(s);
    return -1;
}

int gps_store_agent_delete(gps_store *s, const char *agent_id)
{
    if (!agent_id)
        return -1;
    return store_write_op(s, K_AGENT_DELETE, "t", agent_id);
}

int gps_store_job_insert(gps_store *s, gps_store_job_row r)
{
    if (!r.id || !r.api || !r.model || !r.status)
        return -1;
    if (r.has_seed)
        return store_row_op(s, r.coalesce, K_JOB_INSERT, "ttttttitiij", r.id, r.api, r.kind,
                            r.model, r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                            (int64_t)r.seed, (int64_t)r.created_at, r.request);
    return store_row_op(s, r.coalesce, K_JOB_INSERT, "ttttttit-ij", r.id, r.api, r.kind, r.model,
                        r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                        (int64_t)r.created_at, r.request);
}

int gps_store_job_insert_owned(gps_store *s, gps_store_job_row r, const char *owner_server)
{
    if (!owner_server || !*owner_server || !s || !s->w.ok[K_JOB_INSERT_OWNED])
        return gps_store_job_insert(s, r);
    if (!r.id || !r.api || !r.model || !r.status)
        return -1;
    if (r.has_seed)
        return store_row_op(s, r.coalesce, K_JOB_INSERT_OWNED, "ttttttitiijt", r.id, r.api, r.kind,
                            r.model, r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                            (int64_t)r.seed, (int64_t)r.created_at, r.request, owner_server);
    return store_row_op(s, r.coalesce, K_JOB_INSERT_OWNED, "ttttttit-ijt", r.id, r.api, r.kind,
                        r.model, r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                        (int64_t)r.created_at, r.request, owner_server);
}

bool gps_store_has_job_owners(gps_store *s)
{
    return s && s->w.ok[K_JOB_INSERT_OWNED] && s->w.ok[K_JOBS_FAIL_ORPHANS];
}

/* How much of an error message the row keeps: STORE_ERROR_MESSAGE_MAX
 * bytes at most, cut before a character the limit would split (a hostile
 * agent's message must not bloat the row, nor leave it invalid UTF-8). */
static size_t error_message_len(const char *m)
{
    size_t n = strlen(m);
    if (n <= STORE_ERROR_MESSAGE_MAX)
        return n;
    n = STORE_ERROR_MESSAGE_MAX;
    while (n > 0 && ((unsigned char)m[n] & 0xC0) == 0x80)
        n--;
    return n;
}

/* K_JOB_UPDATE(_FENCED) with the message too (migration 0014). Never
 * folded: fold_pack knows the plain update's values only. */
static int job_update_msg(gps_store *s, const gps_store_job_update *u)
{
    size_t len = error_message_len(u->error_message);
    if (u->lease_attempt > 0)
        return store_row_op(s, false, K_JOB_UPDATE_FENCED_MSG, "tttnnnnnnttnTi", u->id,
                            u->status, u->agent_id, (int64_t)u->attempts,
                            (int64_t)u->prompt_tokens, (int64_t)u->completion_tokens,
                            (int64_t)u->queue_ms, (int64_t)u->ttft_ms, (int64_t)u->total_ms,
                            u->finish_reason, u->error_code,
                            (int64_t)(u->finished_at > 0 ? u->finished_at : -1),
                            u->error_message, len, (int64_t)u->lease_attempt);
    return store_row_op(s, false, K_JOB_UPDATE_MSG, "tttnnnnnnttnT", u->id, u->status,
                        u->agent_id, (int64_t)u->attempts, (int64_t)u->prompt_tokens,
                        (int64_t)u->completion_tokens, (int64_t)u->queue_ms,
                        (int64_t)u->ttft_ms, (int64_t)u->total_ms, u->finish_reason,
                        u->error_code, (int64_t)(u->finished_at > 0 ? u->finished_at : -1),
                        u->error_message, len);
}

int gps_store_job_update_async(gps_store *s, gps_store_job_update u)
{
    if (!u.id)
        return -1;
    if (u.error_message && s &&
        s->w.ok[u.lease_attempt > 0 ? K_JOB_UPDATE_FENCED_MSG : K_JOB_UPDATE_MSG])
        return job_update_msg(s, &u);
    if (u.lease_attempt > 0)
        return store_row_op(s, false, K_JOB_UPDATE_FENCED, "tttnnnnnnttni", u.id, u.status,
                            u.agent_id, (int64_t)u.attempts, (int64_t)u.prompt_tokens,
                            (int64_t)u.completion_tokens, (int64_t)u.queue_ms, (int64_t)u.ttft_ms,
                            (int64_t)u.total_ms, u.finish_reason, u.error_code,
                            (int64_t)(u.finished_at > 0 ? u.finished_at : -1),
                            (int64_t)u.lease_attempt);
    return store_row_op(s, u.coalesce, K_JOB_UPDATE, "tttnnnnnnttn", u.id, u.status, u.agent_id,
                        (int64_t)u.attempts, (int64_t)u.prompt_tokens, (int64_t)u.completion_tokens,
                        (int64_t)u.queue_ms, (int64_t)u.ttft_ms, (int64_t)u.total_ms,
                        u.finish_reason, u.error_code,
                        (int64_t)(u.finished_at > 0 ? u.finished_at : -1));
}

int gps_store_checkpoint(gps_store *s, const char *job_id, const char *text, size_t len,
                         long long last_seq)
{
    if (!job_id || (len && !text))
        return -1;
    return store_write_op(s, K_CHECKPOINT, "tTii", job_id, text ? text : "", len, (int64_t)last_seq,
                          (int64_t)gp_now_wall_ms());
}

int gps_store_checkpoint_fenced(gps_store *s, const char *job_id, const char *text, size_t len,
                                long long last_seq, int64_t attempt)
{
    if (!job_id || (len && !text))
        return -1;
    if (attempt <= 0)
        return gps_store_checkpoint(s, job_id, text, len, last_seq);
    return store_write_op(s, K_CHECKPOINT_FENCED, "tTiii", job_id, text ? text : "", len,
                          (int64_t)last_seq, (int64_t)gp_now_wall_ms(), attempt);
}

int gps_store_job_events(gps_store *s, const char *job_id, const json_t *events)
{
    return gps_store_job_events_seq(s, job_id, events, NULL);
}

/* A batch of job_events: the job, its first and last seq, the events, the
 * time; a fenced batch also binds the lease attempt. */
static int events_add(gps_store *s, const char *job_id, const json_t *events, bool fenced,
                      int64_t attempt, uint64_t *op_seq)
{
    size_t n = json_array_size(events);
    if (!job_id || n == 0)
        return -1;
    int64_t first = json_integer_value(json_object_get(json_array_get(events, 0), "seq"));
    int64_t last = json_integer_value(json_object_get(json_array_get(events, n - 1), "seq"));
    opb b;
    if (fenced)
        store_b_spec(&b, K_EVENTS_ADD_FENCED, "tiijii", job_id, first, last, events,
                     (int64_t)gp_now_wall_ms(), attempt);
    else
        store_b_spec(&b, K_EVENTS_ADD, "tiiji", job_id, first, last, events,
                     (int64_t)gp_now_wall_ms());
    return store_enqueue_b(s, &b, op_seq);
}

int gps_store_job_events_seq(gps_store *s, const char *job_id, const json_t *events,
                             uint64_t *op_seq)
{
    return events_add(s, job_id, events, false, 0, op_seq);
}

int gps_store_job_events_fenced(gps_store *s, const char *job_id, const json_t *events,
                                int64_t attempt, uint64_t *op_seq)
{
    return events_add(s, job_id, events, true, attempt, op_seq);
}

bool gps_store_has_task_leases(gps_store *s)
{
    return s && s->w.ok[K_TASK_OWN] && s->w.ok[K_TASK_RENEW] && s->w.ok[K_TASK_CLAIM] &&
           s->w.ok[K_EVENTS_ADD_FENCED] && s->w.ok[K_TASK_FOLLOW] && s->w.ok[K_TASK_LEASE_GET] &&
           s->w.ok[K_JOB_UPDATE_FENCED] && s->w.ok[K_CHECKPOINT_FENCED];
}

int gps_store_task_own(gps_store *s, const char *job_id, const char *server_id,
                       int64_t lease_until, int64_t attempt)
{
    if (!job_id || !server_id)
        return -1;
    return store_write_op(s, K_TASK_OWN, "ttii", job_id, server_id, lease_until, attempt);
}

int gps_store_task_renew(gps_store *s, const char *server_id, int64_t lease_until)
{
    if (!server_id)
        return -1;
    /* ahead of the queue, as the server's heartbeat (store_enqueue_front): a
     * backlog of request-log writes must not let the lease run out */
    op *o = store_read_op(K_TASK_RENEW, "ti", server_id, lease_until);
    return o ? store_enqueue_front(s, o) : -1;
}

int gps_store_purge_jobs(gps_store *s, int64_t before_wall_ms)
{
    return store_write_op(s, K_PURGE, "i", before_wall_ms);
}

bool store_key_row_has_extras(const gps_store_key_row *r)
{
    return r->rpm || r->tokens_per_day || r->max_concurrent || r->max_uses;
}

int gps_store_key_insert(gps_store *s, gps_store_key_row r)
{
    if (!r.id || !r.hash || !r.role)
        return -1;
    if (store_write_op(s, K_KEY_INSERT, KEY_ROW_SPEC, KEY_ROW_ARGS(&r)) != 0)
        return -1;
    /* Both land in the same FIFO, in order. */
    if (!store_key_row_has_extras(&r))
        return 0;
    return gps_store_key_limits(s, r.id, r.rpm, r.tokens_per_day, r.max_concurrent, r.max_uses);
}

int gps_store_key_limits(gps_store *s, const char *key_id, int64_t rpm, int64_t tokens_per_day,
                         int64_t max_concurrent, int64_t max_uses)
{
    if (!key_id)
        return -1;
    return store_write_op(s, K_KEY_LIMITS, KEY_LIMITS_SPEC, key_id, rpm, tokens_per_day,
                          max_concurrent, max_uses);
}

int gps_store_key_uses(gps_store *s, const char *key_id, int64_t uses)
{
    if (!key_id)
        return -1;
    return store_write_op(s, K_KEY_USES, "ti", key_id, uses);
}

int gps_store_usage_add(gps_store *s, const char *key_id, int64_t day, int64_t requests,
                        int64_t prompt_tokens, int64_t completion_tokens, int64_t rate_limited)
{
    /* Counts only add: a negative one would make a fold's sum able to
     * overflow (store_usage_fold_locked clamps positive sums only). */
    if (!key_id || !*key_id || requests < 0 || prompt_tokens < 0 || completion_tokens < 0 ||
        rate_limited < 0)
        return -1;
    opb b;
    store_b_spec(&b, K_USAGE_ADD, "tiiiii", key_id, day, requests, prompt_tokens, completion_tokens,
                 rate_limited);
    op *o = store_b_pack(&b);
    if (!o) {
        store_count_drop(s);
        return -1;
    }
    return store_enqueue_ex(s, o, true, NULL, ENQ_USAGE);
}

int gps_store_key_revoke(gps_store *s, const char *key_id, int64_t revoked_at)
{
    if (!key_id)
        return -1;
    return store_write_op(s, K_KEY_REVOKE, "ti", key_id, revoked_at);
}

int gps_store_key_used(gps_store *s, const char *key_id, int64_t used_at)
{
    if (!key_id)
        return -1;
    return store_write_op(s, K_KEY_USED, "ti", key_id, used_at);
}

int gps_store_key_bind_agent(gps_store *s, const char *key_id, const char *agent_id)
{
    if (!key_id || !agent_id)
        return -1;
    return store_write_op(s, K_KEY_BIND, "tt", key_id, agent_id);
}
