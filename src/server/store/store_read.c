/*
 * store_read.c: the async readers of store.h, and the reads and writes of
 * servers sharing one DB (re-reads, native tasks, hand-offs, cancels).
 */
#include "server/store/store_priv.h"

#include <stdlib.h>

#include "common/gp_util.h"

/* ------------------------------------------------------------------------ */
/* Async reads                                                              */
/* ------------------------------------------------------------------------ */

int gps_store_job_get_async(gps_store *s, const char *id, gps_store_job_fn cb, void *arg)
{
    if (!s->ev_wake || !id || !cb)
        return -1;
    op *o = store_read_op(K_JOB_GET, "t", id);
    if (!o)
        return -1;
    o->job_cb = cb;
    o->arg = arg;
    return store_enqueue(s, o, false);
}

int gps_store_ping_async(gps_store *s, gps_store_ping_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = store_read_op(K_PING, "");
    if (!o)
        return -1;
    o->ping_cb = cb;
    o->arg = arg;
    return store_enqueue(s, o, false);
}

/* ---- servers sharing the DB, and the re-reads that keep them in step ---- */

int gps_store_server_beat_async(gps_store *s, const gps_store_server_row *r,
                                gps_store_status_fn cb, void *arg)
{
    if (!s->ev_wake || !r || !r->id || !r->name || !r->version || !cb)
        return -1;
    op *o = store_read_op(K_SERVER_BEAT, "tttitiii", r->id, r->name, r->url, r->pid, r->version,
                          r->started_at, r->heartbeat_at, r->lease_until);
    if (!o)
        return -1;
    o->status_cb = cb;
    o->arg = arg;
    return store_enqueue_front(s, o);
}

bool gps_store_has_servers(gps_store *s) { return s && s->w.ok[K_SERVER_BEAT]; }

int gps_store_server_stop(gps_store *s, const char *id, int64_t at)
{
    return id ? store_write_op(s, K_SERVER_STOP, "ti", id, at) : -1;
}

int gps_store_server_purge(gps_store *s, int64_t before)
{
    return store_write_op(s, K_SERVER_PURGE, "i", before);
}

/* A read of kind with one callback of the shared-state family. */
static int shared_read(gps_store *s, op *o, void *arg)
{
    if (!o)
        return -1;
    o->arg = arg;
    return store_enqueue(s, o, false);
}

int gps_store_servers_async(gps_store *s, gps_store_servers_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = store_read_op(K_SERVER_LIST, "");
    if (o)
        o->servers_cb = cb;
    return shared_read(s, o, arg);
}

int gps_store_keys_async(gps_store *s, gps_store_keys_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = store_read_op(K_KEYS_GET, "");
    if (o)
        o->keys_cb = cb;
    return shared_read(s, o, arg);
}

int gps_store_usage_async(gps_store *s, int64_t day, gps_store_usage_rows_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = store_read_op(K_USAGE_GET, "i", day);
    if (o)
        o->usage_cb = cb;
    return shared_read(s, o, arg);
}

/* Filters of GET /admin/jobs: NULL binds NULL, "any". */
int gps_store_jobs_list_async(gps_store *s, const gps_store_job_filter *f, gps_store_jobs_fn cb,
                              void *arg)
{
    if (!s->ev_wake || !f || !cb || f->limit < 1)
        return -1;
    op *o = store_read_op(K_JOB_LIST, "ttttzi", f->status, f->model, f->agent_id, f->key_id,
                          (int64_t)f->before, (int64_t)f->limit);
    if (!o)
        return -1;
    o->jobs_cb = cb;
    o->arg = arg;
    return store_enqueue(s, o, false);
}

/* Stored responses (migration 0006)                                        */

int gps_store_response_put(gps_store *s, const gps_store_response_row *r)
{
    if (!r || !r->id || !r->key_id || (!r->object && !r->object_text) ||
        (!r->context && !r->context_text))
        return -1;
    /* Values given as trees are dumped here; Responses writes its own text
     * (issue 24: the trees were most of a stored reply's cost). */
    gp_buf d[3];
    const json_t *tree[3] = {r->object, r->context, r->items};
    const char *txt[3] = {r->object_text, r->context_text, r->items_text};
    size_t len[3] = {r->object_len, r->context_len, r->items_len};
    int rc = -1;
    for (int i = 0; i < 3; i++)
        gp_buf_init(&d[i]);
    for (int i = 0; i < 3; i++) {
        if (!tree[i])
            continue;
        if (gp_json_dump_append(&d[i], tree[i]) < 0)
            goto done;
        txt[i] = d[i].data;
        len[i] = d[i].len;
    }
    if (store_write_op(s, K_RESP_PUT, "ttiiTT", r->id, r->key_id, r->created_at, r->expires_at,
                       txt[0], len[0], txt[1], len[1]) != 0)
        goto done;
    /* Same FIFO: the items and the trim follow the row they belong to. An
     * empty array ("[]") has none. */
    if ((r->items ? json_array_size(r->items) > 0 : r->items_text && len[2] > 2) &&
        store_write_op(s, K_RESP_ITEMS_PUT, "ttT", r->id, r->key_id, txt[2], len[2]) != 0)
        goto done;
    rc = 0;
done:
    for (int i = 0; i < 3; i++)
        gp_buf_free(&d[i]);
    if (rc < 0)
        return -1;
    if (r->keep_per_key > 0)
        return store_write_op(s, K_RESP_TRIM, "ti", r->key_id, r->keep_per_key);
    return 0;
}

static int cells_op(gps_store *s, op *o, gps_store_cells_fn cb, void *arg)
{
    if (!o)
        return -1;
    o->cells_cb = cb;
    o->arg = arg;
    return store_enqueue(s, o, false);
}

int gps_store_response_get_async(gps_store *s, const char *id, const char *key_id,
                                 int64_t now_ms, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !id || !key_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_RESP_GET, "tti", id, key_id, now_ms), cb, arg);
}

int gps_store_response_items_async(gps_store *s, const char *key_id, const json_t *ids,
                                   int64_t now_ms, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !key_id || !json_is_array(ids) || !cb)
        return -1;
    return cells_op(s, store_read_op(K_RESP_ITEMS_GET, "tji", key_id, ids, now_ms), cb, arg);
}

int gps_store_response_delete_async(gps_store *s, const char *id, const char *key_id,
                                    gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !id || !key_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_RESP_DELETE, "tt", id, key_id), cb, arg);
}

int gps_store_task_claim_async(gps_store *s, const char *server_id, int64_t lease_until,
                               int64_t now_ms, const json_t *models, int limit,
                               gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(models) || limit < 1 || !cb)
        return -1;
    return cells_op(s, store_read_op(K_TASK_CLAIM, "tiiji", server_id, lease_until, now_ms, models,
                                     (int64_t)limit),
                    cb, arg);
}

int gps_store_jobs_fail_orphans_async(gps_store *s, int64_t now_ms, int64_t dead_before,
                                      gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    return cells_op(s, store_read_op(K_JOBS_FAIL_ORPHANS, "ii", now_ms, dead_before), cb, arg);
}

int gps_store_task_lease_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                               void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_TASK_LEASE_GET, "t", job_id), cb, arg);
}

int gps_store_task_follow_async(gps_store *s, const char *job_id, long long after_seq,
                                gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_TASK_FOLLOW, "ti", job_id, (int64_t)after_seq), cb, arg);
}

/* ---- the hand-off of a job to another server (migration 0011) ---- */

int gps_store_notify(gps_store *s, const char *channel, const char *payload)
{
    if (!s || s->eng == &gps_store__sqlite)
        return 0;
    return store_write_op(s, K_NOTIFY, "tt", channel, payload ? payload : "");
}

gps_store_listener *gps_store_listen(gps_store *s, struct event_base *base,
                                     const char *const *channels, gps_store_notify_fn fn,
                                     void *arg)
{
    if (!s || s->eng == &gps_store__sqlite)
        return NULL;
    return gps_store__listener_new(&s->listen_hub, s->target, s->path, base, channels, fn,
                                   arg);
}

bool gps_store_has_handoffs(gps_store *s)
{
    return s && s->w.ok[K_HANDOFF_OFFER] && s->w.ok[K_HANDOFF_CLAIM] &&
           s->w.ok[K_HANDOFF_PEEK] && s->w.ok[K_HANDOFF_CLAIM_IDS] &&
           s->w.ok[K_HANDOFF_WITHDRAW] &&
           s->w.ok[K_HANDOFF_EVENTS] && s->w.ok[K_SERVER_MODELS];
}

int gps_store_server_models(gps_store *s, const char *server_id, const json_t *models)
{
    if (!server_id || !json_is_array(models))
        return -1;
    return store_write_op(s, K_SERVER_MODELS, "tj", server_id, models);
}

bool gps_store_has_server_free(gps_store *s)
{
    return s && s->w.ok[K_SERVER_FREE] && s->w.ok[K_HANDOFF_PEERS_FREE];
}

int gps_store_server_free(gps_store *s, const char *server_id, const json_t *free_slots)
{
    if (!server_id || !json_is_array(free_slots) || !gps_store_has_server_free(s))
        return -1;
    return store_write_op(s, K_SERVER_FREE, "tj", server_id, free_slots);
}

int gps_store_handoff_peers_async(gps_store *s, const char *server_id, int64_t now_ms,
                                  gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !server_id || !cb)
        return -1;
    int k = gps_store_has_server_free(s) ? K_HANDOFF_PEERS_FREE : K_HANDOFF_PEERS;
    return cells_op(s, store_read_op(k, "ti", server_id, now_ms), cb, arg);
}

int gps_store_handoff_offer(gps_store *s, const char *job_id, const char *model,
                            const json_t *spec, const char *from_server, int64_t created_at,
                            int64_t deadline)
{
    if (!job_id || !model || !spec || !from_server)
        return -1;
    return store_write_op(s, K_HANDOFF_OFFER, "ttjtii", job_id, model, spec, from_server,
                          created_at, deadline);
}

int gps_store_handoff_claim_async(gps_store *s, const char *server_id, int64_t now_ms,
                                  const json_t *models, int limit, gps_store_cells_fn cb,
                                  void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(models) || limit < 1 || !cb)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_CLAIM, "tiji", server_id, now_ms, models,
                                     (int64_t)limit),
                    cb, arg);
}

int gps_store_handoff_peek_async(gps_store *s, const char *server_id, int64_t now_ms,
                                 const json_t *models, int limit, gps_store_cells_fn cb,
                                 void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(models) || limit < 1 || !cb)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_PEEK, "tiji", server_id, now_ms, models,
                                     (int64_t)limit),
                    cb, arg);
}

int gps_store_handoff_claim_ids_async(gps_store *s, const char *server_id, int64_t now_ms,
                                      const json_t *job_ids, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(job_ids) || !cb)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_CLAIM_IDS, "tij", server_id, now_ms, job_ids), cb,
                    arg);
}

int gps_store_handoff_events_async(gps_store *s, const char *job_id, const char *server_id,
                                   int64_t attempt, long long first_seq, long long last_seq,
                                   const json_t *events, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !server_id || !json_is_array(events) || !cb)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_EVENTS, "tiijiit", job_id, (int64_t)first_seq,
                                     (int64_t)last_seq, events, (int64_t)gp_now_wall_ms(), attempt,
                                     server_id),
                    cb, arg);
}

int gps_store_handoff_follow_async(gps_store *s, const char *job_id, long long from_seq,
                                   gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_FOLLOW, "ti", job_id, (int64_t)from_seq), cb, arg);
}

int gps_store_handoff_mine_async(gps_store *s, const char *server_id, gps_store_cells_fn cb,
                                 void *arg)
{
    if (!s->ev_wake || !server_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_MINE, "t", server_id), cb, arg);
}

int gps_store_handoff_withdraw_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                                     void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_WITHDRAW, "t", job_id), cb, arg);
}

int gps_store_handoff_end(gps_store *s, const char *job_id, bool done)
{
    if (!job_id)
        return -1;
    return store_write_op(s, done ? K_HANDOFF_DELETE : K_HANDOFF_CANCEL, "t", job_id);
}

int gps_store_handoff_sweep_async(gps_store *s, int64_t now_ms, gps_store_cells_fn cb,
                                  void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    if (store_write_op(s, K_HANDOFF_SWEEP_FROM, "i", now_ms) != 0)
        return -1;
    return cells_op(s, store_read_op(K_HANDOFF_SWEEP, "i", now_ms), cb, arg);
}

bool gps_store_has_task_cancel(gps_store *s)
{
    return gps_store_has_task_leases(s) && s->w.ok[K_TASK_CANCEL_REQ] &&
           s->w.ok[K_TASK_CANCELS] && s->w.ok[K_TASK_CANCEL_GET];
}

int gps_store_task_cancel_request_async(gps_store *s, const char *job_id, int64_t now_ms,
                                        gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_TASK_CANCEL_REQ, "ti", job_id, now_ms), cb, arg);
}

int gps_store_task_cancels_async(gps_store *s, const char *server_id, gps_store_cells_fn cb,
                                 void *arg)
{
    if (!s->ev_wake || !server_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_TASK_CANCELS, "t", server_id), cb, arg);
}

int gps_store_task_cancel_get_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                                    void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, store_read_op(K_TASK_CANCEL_GET, "t", job_id), cb, arg);
}

int gps_store_purge_responses(gps_store *s, int64_t now_ms)
{
    return store_write_op(s, K_RESP_PURGE, "i", now_ms);
}
