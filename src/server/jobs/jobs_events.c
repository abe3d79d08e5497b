/* jobs_events: an agent's uploaded events applied to its job (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/agent_check.h"

/* ------------------------------------------------------------------ */
/* Agent events                                                        */
/* ------------------------------------------------------------------ */

/* Bytes one attempt of job may send (jobs.h): what max_tokens tokens can
 * plausibly take, within the operator's cap. */
static long long event_budget(const gps_jobs *j, const gps_job *job)
{
    long long cap = j->opts.max_job_event_bytes > 0 ? j->opts.max_job_event_bytes
                                                    : GPS_JOBS_MAX_EVENT_BYTES_DEFAULT;
    /* An embed job's vectors are sized by its inputs, not max_tokens. */
    if (job->spec.kind == GPS_JOB_EMBED)
        return cap;
    long long mt = job->spec.max_tokens > 0 ? job->spec.max_tokens : 0;
    if (mt > GPS_AGENT_MAX_TOKENS)
        mt = GPS_AGENT_MAX_TOKENS;
    long long b = GPS_JOBS_EVENT_BYTES_BASE + (mt + MAX_TOKENS_SLACK) * GPS_JOBS_EVENT_BYTES_PER_TOKEN;
    return b < cap ? b : cap;
}

static void output_too_large(gps_jobs *j, gps_job *job, const char *what)
{
    char m[160];
    snprintf(m, sizeof m, "the agent sent more %s than the request allows", what);
    jobs_count(j, "agent_events_dropped_total", "reason=\"too_large\"", 1);
    jobs_fail_job(j, job, 502, "AGENT_OUTPUT_TOO_LARGE", m, 0);
}

static bool is_progress(const json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    return type && strcmp(type, "progress") == 0;
}

/* Prefill progress: proof of life, not output. Only the latest counts are
 * kept (never the event buffer: a long prefill must not grow memory) and
 * nothing is relayed. */
static void apply_progress(gps_job *job, const json_t *ev, const gps_event_in *in)
{
    const json_t *d = json_object_get(ev, "prompt_tokens_done");
    const json_t *t = json_object_get(ev, "prompt_tokens_total");
    bool plain = in && in->plain; /* (the check bounded both counts: >= 0) */
    long long dv = plain ? in->progress_done : json_is_integer(d) ? json_integer_value(d) : -1;
    long long tv = plain ? in->progress_total : json_is_integer(t) ? json_integer_value(t) : -1;
    if (dv >= 0)
        job->progress_done = dv;
    if (tv >= 0) {
        job->progress_total = tv;
        /* An attempt that continues nothing counts the client's prompt:
         * the usage if this agent is lost before its end (item 7). */
        if (job->continued_tokens == 0 && job->progress_total > 0)
            job->prompt_tokens = job->progress_total;
    }
}

/* usage.prompt_tokens is the client's prompt, whatever an attempt was
 * given (issue 10 item 7). An attempt that continues earlier output was
 * given the prompt plus that output (as token ids, or as text it
 * re-tokenized), and reports that count pt: keep the client's count when
 * an earlier attempt reported it, else take the continued tokens off
 * (exact for a token continuation, about right for a text one). */
static long long client_prompt(const gps_job *job, long long pt)
{
    if (job->continued_tokens <= 0)
        return pt;
    if (job->prompt_tokens > 0)
        return job->prompt_tokens;
    return pt > job->continued_tokens ? pt - job->continued_tokens : pt;
}

/* What applying one event came to (apply_one, apply_token): APPLIED
 * (the job failing for it included); NO_MEMORY, nothing of it applied:
 * the upload is refused from it (500) and the agent sends it again, seq
 * skipping what was applied before it; NOT_JSON, a plain event whose text
 * does not read back (upload_read.c read it as JSON: never so). */
#define APPLIED 0
#define NO_MEMORY (-1)
#define NOT_JSON (-2)

/* A token's text and ids onto the job (ids: the tree ev's, or token_id
 * when ev is NULL): the tokens it stands for, or NO_MEMORY with the job
 * as it was. */
static long long token_take(gps_job *job, const char *text, size_t len, const json_t *ev,
                            long long token_id)
{
    size_t at = job->text.len;
    if (gp_buf_append(&job->text, text, len) < 0)
        return NO_MEMORY;
    long long n = ev ? jobs_ids_record(job, ev) : jobs_ids_record_one(job, token_id);
    if (n < 0)
        gp_buf_truncate(&job->text, at);
    return n < 0 ? NO_MEMORY : n;
}

/* A token event read as a tree (apply_one; one read without a tree:
 * apply_token). */
static int apply_token_tree(gps_jobs *j, gps_job *job, json_t *ev, uint64_t now)
{
    const char *text = json_string_value(json_object_get(ev, "text"));
    size_t len = strlen(text);
    /* The text of all attempts together stays within one attempt's
     * budget: a failover continues the same text. */
    if ((long long)(job->text.len + len) > event_budget(j, job) ||
        job->completion_tokens >= job->spec.max_tokens + MAX_TOKENS_SLACK) {
        /* A misbehaving agent must not grow server memory without bound. */
        output_too_large(j, job, "output");
        return APPLIED;
    }
    /* an event may stand for several tokens (text held back by the
     * agent's stop matcher comes with a later token) */
    long long n = token_take(job, text, len, ev, -1);
    if (n < 0)
        return NO_MEMORY;
    job->state = GPS_JOB_RUNNING;
    job->completion_tokens += n;
    if (!job->first_token_us)
        job->first_token_us = now;
    jobs_count(j, "tokens_generated_total", NULL, 1);
    jobs_notify(j, job, GPS_EV_TOKEN, ev);
    return APPLIED;
}

/* A tool call piece (apply_one): its bytes counted against the budget. */
static void apply_tool_call(gps_jobs *j, gps_job *job, json_t *ev, uint64_t now)
{
    job->state = GPS_JOB_RUNNING;
    const char *a = json_string_value(json_object_get(ev, "arguments"));
    job->tool_bytes += a ? strlen(a) : 0;
    job->tool_bytes += 64; /* id, name: count every piece */
    if ((long long)job->tool_bytes > event_budget(j, job)) {
        output_too_large(j, job, "tool call data");
        return;
    }
    if (!job->first_token_us)
        job->first_token_us = now;
    jobs_notify(j, job, GPS_EV_TOOL_CALL, ev);
}

/* A metrics event (apply_one): the counts it carries, relayed a bounded
 * number of times per attempt. */
static void apply_metrics(gps_jobs *j, gps_job *job, json_t *ev, const gps_event_in *in)
{
    bool plain = in && in->plain;
    json_t *tps = json_object_get(ev, "tokens_per_sec");
    if (plain ? in->has_tps : json_is_number(tps))
        job->tokens_per_sec = plain ? in->tokens_per_sec : json_number_value(tps);
    json_t *pt = json_object_get(ev, "prompt_tokens");
    long long ptv = plain                                                 ? in->prompt_tokens
                    : json_is_integer(pt) && json_integer_value(pt) >= 0 ? json_integer_value(pt)
                                                                          : -1;
    if (ptv >= 0)
        job->prompt_tokens = client_prompt(job, ptv);
    /* An openai agent whose upstream has no count endpoint estimated
     * (docs/agent.md "Counting tokens"): the reply says so. */
    json_t *ce = json_object_get(ev, "count_estimated");
    if (plain ? in->count_estimated : json_is_number(ce) && json_number_value(ce) != 0)
        job->count_estimated = true;
    /* Subscribers (native tasks) record what they are given: relay a
     * bounded number per attempt; later ones only update the counts. */
    if (job->metrics_relayed >= GPS_JOBS_MAX_METRICS_RELAYED) {
        jobs_count(j, "agent_events_dropped_total", "reason=\"metrics\"", 1);
        return;
    }
    job->metrics_relayed++;
    jobs_notify(j, job, GPS_EV_METRICS, ev);
}

/* The end event (apply_one): the job is done, with the finish reason and
 * usage the agent reported. NO_MEMORY before anything changed. */
static int apply_end(gps_jobs *j, gps_job *job, json_t *ev, const gps_event_in *in)
{
    bool plain = in && in->plain;
    /* The stop string the agent stopped on (agent_check bounded it):
     * the Anthropic dialect reports it as stop_sequence; copied first, so
     * that the reply never goes without it. */
    const char *ss = plain ? in->stop_sequence
                           : json_string_value(json_object_get(ev, "stop_sequence"));
    char *stop = ss ? strdup(ss) : NULL;
    if (ss && !stop)
        return NO_MEMORY;
    const char *fr = plain ? in->finish_reason
                           : json_string_value(json_object_get(ev, "finish_reason"));
    gp_copy_str(job->finish_reason, sizeof job->finish_reason,
                fr && strcmp(fr, "length") == 0       ? "length"
                : fr && strcmp(fr, "tool_calls") == 0 ? "tool_calls"
                                                      : "stop");
    free(job->stop_sequence);
    job->stop_sequence = stop;
    json_t *um = json_object_get(ev, "upstream_meta");
    json_decref(job->upstream_meta);
    job->upstream_meta = json_is_object(um) ? json_incref(um) : NULL;
    json_t *u = json_object_get(ev, "usage");
    json_t *pt = json_object_get(u, "prompt_tokens");
    json_t *ct = json_object_get(u, "completion_tokens");
    long long ptv = plain                                                 ? in->prompt_tokens
                    : json_is_integer(pt) && json_integer_value(pt) >= 0 ? json_integer_value(pt)
                                                                          : -1;
    long long ctv = plain                                                 ? in->completion_tokens
                    : json_is_integer(ct) && json_integer_value(ct) >= 0 ? json_integer_value(ct)
                                                                          : -1;
    if (ptv >= 0)
        job->prompt_tokens = client_prompt(job, ptv);
    /* usage counts this attempt; earlier attempts' tokens come first. */
    if (ctv >= 0)
        job->completion_tokens = job->continued_tokens + ctv;
    jobs_end_on_agent(j, job, true);
    jobs_finish(j, job, GPS_JOB_DONE);
    if (gp_log_enabled(GP_LOG_INFO)) {
        json_t *f = jobs_log_fields(&j->log_done);
        bool ok = f && jobs_lf_str(f, "job_id", job->id) &&
                  jobs_lf_str(f, "model", job->spec.model) &&
                  jobs_lf_str(f, "agent_id", job->agent_id) &&
                  jobs_lf_int(f, "ms", jobs_total_ms(job)) &&
                  jobs_lf_int(f, "prompt_tokens", job->prompt_tokens) &&
                  jobs_lf_int(f, "completion_tokens", job->completion_tokens) &&
                  jobs_lf_str(f, "finish_reason", job->finish_reason);
        gp_log_write(GP_LOG_INFO, "job_done", job->correlation_id, jobs_log_fields_ref(f, ok),
                     "job finished");
    }
    jobs_notify(j, job, GPS_EV_END, ev);
    return APPLIED;
}

/* Error codes an agent reports for a failure of its own, not of the
 * request: another agent may well succeed. DEVICE_ERROR and
 * INSUFFICIENT_VRAM: a gguf agent's GPU failed or ran out of memory
 * mid-job (it takes that GPU out of service and re-initialises it).
 * AGENT_OUT_OF_MEMORY: the agent's process could not queue the job's
 * output; every event before it arrived whole, so a continuation resumes
 * exactly after what the client got. */
static bool agent_side_error(const char *code)
{
    static const char *const codes[] = {"AGENT_SHUTDOWN",     "UPSTREAM_ERROR",
                                        "UPSTREAM_TIMEOUT",   "UPSTREAM_MALFORMED",
                                        "DEVICE_ERROR",       "INSUFFICIENT_VRAM",
                                        "AGENT_OUT_OF_MEMORY"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(code, codes[i]) == 0)
            return true;
    return false;
}

/* An error event (apply_one): a failover when the agent's own failure
 * allows one, else the job fails with the agent's code. */
static void apply_error(gps_jobs *j, gps_job *job, json_t *ev)
{
    const char *code = json_string_value(json_object_get(ev, "code"));
    const char *message = json_string_value(json_object_get(ev, "message"));
    char c[64];
    snprintf(c, sizeof c, "%s", code ? code : "AGENT_ERROR");
    /* The agent's own failure (drain timeout, its upstream died): fail
     * over like a lost agent. AGENT_SHUTDOWN always (the agent is
     * going away, as if lost); upstream failures only when another
     * live agent serves the model, else the agent's error stands. */
    if (job->spec.failover != GPS_FAILOVER_ERROR && agent_side_error(c) &&
        job->attempts < j->opts.max_attempts &&
        (!job->client_saw_output || job->spec.failover == GPS_FAILOVER_CONTINUE) &&
        (strcmp(c, "AGENT_SHUTDOWN") == 0 || jobs_other_agent_live(j, job, job->agent_id) ||
         jobs_fallback_live(j, job, job->agent_id) >= 0)) {
        char lost[64];
        snprintf(lost, sizeof lost, "%s", job->agent_id);
        jobs_fail_over(j, job, c);
        /* It reported the job over itself: nothing to cancel. */
        jobs_cancel_take(j, lost, job->id);
        return;
    }
    /* The agent is still alive and reports the job failed: do not keep
     * a cancel record for it. */
    jobs_end_on_agent(j, job, false);
    /* The request itself was at fault (prompt longer than the context,
     * input the model refuses): a client error, not a bad gateway. */
    int status = strcmp(c, "CONTEXT_OVERFLOW") == 0 || strcmp(c, "INVALID_REQUEST") == 0
                     ? 400
                     : 502;
    jobs_fail_job(j, job, status, c, message ? message : "the agent reported an error", 0);
    jobs_cancel_take(j, job->agent_id, job->id);
}

/* Whether a plain event of type t is handed to its subscribers as a tree:
 * only when one of them reads trees (native tasks, a handoff proxy; the
 * relay reads the job's fields), and a metrics event only while metrics
 * are relayed (apply_metrics). */
static bool plain_tree_wanted(const gps_job *job, gps_event_type t)
{
    if (t != GPS_EV_STARTED && t != GPS_EV_METRICS && t != GPS_EV_END)
        return false;
    if (t == GPS_EV_METRICS && job->metrics_relayed >= GPS_JOBS_MAX_METRICS_RELAYED)
        return false;
    return jobs_wants_tree(job);
}

/* Apply one checked event (agent_check.h): ev, or without a tree the
 * fields of a plain event (in->plain; upload_read.c read and checked it
 * as the checker reads its tree). Nothing of ev is kept: what a
 * subscriber needs it copies during jobs_notify. in (or NULL): the reader's
 * record, whose bytes is the event's compact size. APPLIED, NO_MEMORY or
 * NOT_JSON (nothing applied then). */
static int apply_one(gps_jobs *j, gps_job *job, json_t *ev, const gps_event_in *in)
{
    bool plain = in && in->plain;
    gps_event_type t = plain ? in->type
                             : gps_event_type_parse(
                                   json_string_value(json_object_get(ev, "type")));
    uint64_t now = gp_now_mono_us();
    job->last_event_us = now;
    /* Every event counts, unknown ones too: 40 uploads of 3.5 MB of
     * "metrics" on a max_tokens=10 job must not be 140 MB. */
    long long bytes = (long long)(in && in->bytes ? in->bytes : gp_json_compact_size(ev));
    job->agent_bytes += bytes;
    if (job->agent_bytes > event_budget(j, job)) {
        output_too_large(j, job, "event data");
        return APPLIED;
    }
    if (plain ? in->progress : is_progress(ev)) {
        apply_progress(job, ev, in);
        return APPLIED;
    }
    /* A plain event's tree, read before the event changes the job: a
     * subscriber that reads trees never misses an event the others got,
     * and out of memory leaves the job as it was. */
    json_t *tree = NULL;
    if (plain && plain_tree_wanted(job, t)) {
        json_error_t err;
        tree = gp_json_loadb(in->raw, in->raw_len, &err);
        if (!tree) {
            job->agent_bytes -= bytes; /* counted when it comes again */
            return json_error_code(&err) == json_error_out_of_memory ? NO_MEMORY : NOT_JSON;
        }
        ev = tree;
    }
    int rc = APPLIED;
    switch (t) {
    case GPS_EV_STARTED:
        job->state = GPS_JOB_RUNNING;
        jobs_notify(j, job, t, ev);
        break;
    case GPS_EV_TOKEN:
        rc = apply_token_tree(j, job, ev, now);
        break;
    case GPS_EV_TOOL_CALL:
        apply_tool_call(j, job, ev, now);
        break;
    case GPS_EV_EMBEDDING:
        /* Only an embed job's subscriber (api_embeddings.c) keeps them. */
        if (job->spec.kind != GPS_JOB_EMBED)
            break;
        job->state = GPS_JOB_RUNNING;
        jobs_notify(j, job, t, ev);
        break;
    case GPS_EV_METRICS:
        apply_metrics(j, job, ev, in);
        break;
    case GPS_EV_END:
        rc = apply_end(j, job, ev, in);
        break;
    case GPS_EV_ERROR:
        apply_error(j, job, ev);
        break;
    default:
        /* Unknown types (a newer agent): accepted so that the job goes on,
         * counted in the byte budget above, neither kept nor relayed. */
        jobs_count(j, "agent_events_dropped_total", "reason=\"unknown_type\"", 1);
        break;
    }
    json_decref(tree);
    if (rc != APPLIED)
        job->agent_bytes -= bytes;
    return rc;
}

/* The token event handed to subscribers, set to e's text and id in place:
 * subscribers read a token event's text and id only and keep no reference
 * (they copy), so one object with one string (and one integer) serves every
 * token, its values overwritten; made anew should any of them ever be kept.
 * NULL when out of memory. */
static json_t *token_event(gps_jobs *j, const gps_event_in *e)
{
    json_t *ev = j->tok_ev;
    json_t *text = j->tok_text; /* ev's "text", not looked up per token */
    if (ev && (ev->refcount > 1 || !text || text->refcount > 1 ||
               (j->tok_id && j->tok_id->refcount > 2))) {
        json_decref(j->tok_id);
        j->tok_id = NULL;
        json_decref(ev);
        ev = j->tok_ev = NULL;
        text = j->tok_text = NULL;
    }
    if (!ev) {
        ev = j->tok_ev = json_pack("{s:s,s:s}", "type", "token", "text", "");
        if (!ev)
            return NULL;
        text = j->tok_text = json_object_get(ev, "text");
    }
    if (json_string_setn_nocheck(text, e->text, e->len) < 0)
        return NULL;
    /* Native tasks keep a token's id for a token-exact resume. */
    if (e->token_id >= 0 && j->tok_id) {
        json_integer_set(j->tok_id, e->token_id);
    } else if (e->token_id >= 0) {
        json_t *id = json_integer(e->token_id);
        if (!id || json_object_set_nocheck(ev, "token_id", id) < 0) {
            json_decref(id);
            return NULL;
        }
        j->tok_id = id; /* ev's reference and this one */
    } else if (j->tok_id) {
        json_object_del(ev, "token_id");
        json_decref(j->tok_id);
        j->tok_id = NULL;
    }
    return ev;
}

/* A token read without a tree (gps_event_in): what apply_one does for a
 * token event, from its fields. Returns 1 when it was generated (counted
 * by the caller, once per upload), 0 when not (the job failed for it), or
 * NO_MEMORY with nothing of it applied. */
/* now: the upload's arrival (apply_events reads the clock once for all
 * its events; a clock read per token was a tenth of this function). */
static int apply_token(gps_jobs *j, gps_job *job, const gps_event_in *e, uint64_t now)
{
    job->last_event_us = now;
    job->agent_bytes += (long long)e->bytes;
    if (job->agent_bytes > event_budget(j, job)) {
        output_too_large(j, job, "event data");
        return 0;
    }
    if ((long long)(job->text.len + e->len) > event_budget(j, job) ||
        job->completion_tokens >= job->spec.max_tokens + MAX_TOKENS_SLACK) {
        output_too_large(j, job, "output");
        return 0;
    }
    /* Cursor subscribers (the relay) read the text just appended: the
     * event's tree, and its string's allocation, only for the others,
     * and made first: a token is taken only when every subscriber can be
     * given it. */
    json_t *ev = NULL;
    long long n = NO_MEMORY;
    if (!jobs_wants_tree(job) || (ev = token_event(j, e)))
        n = token_take(job, e->text, e->len, NULL, e->token_id);
    if (n < 0) {
        job->agent_bytes -= (long long)e->bytes; /* counted when it comes again */
        return NO_MEMORY;
    }
    job->state = GPS_JOB_RUNNING;
    job->completion_tokens += n;
    if (!job->first_token_us)
        job->first_token_us = now;
    jobs_notify(j, job, GPS_EV_TOKEN, ev);
    return 1;
}

static int apply_events(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                        json_t *events, const gps_event_in *in, size_t n_in, bool checked,
                        bool *cancel, long long *expected_seq, char *msg, size_t msglen)
{
    *cancel = false;
    *expected_seq = -1;
    gps_job *job = gps_jobs_find(j, job_id);
    if (!job) {
        done_rec *r = jobs_done_rec_find(j, job_id);
        if (!r) {
            snprintf(msg, msglen, "unknown job '%.60s'", job_id);
            return 404;
        }
        /* Finished and retired: answered as the whole job would be. */
        bool had_cancel = jobs_cancel_take(j, agent_id, job_id);
        if (strcmp(r->agent_id, agent_id) != 0) {
            snprintf(msg, msglen, "job '%.60s' is not assigned to this agent", job_id);
            return 409;
        }
        *cancel = r->state != GPS_JOB_DONE || had_cancel;
        return 0;
    }
    if (strcmp(job->agent_id, agent_id) != 0) {
        snprintf(msg, msglen, "job '%.60s' is not assigned to this agent", job_id);
        jobs_cancel_take(j, agent_id, job_id);
        return 409;
    }
    if (gps_job_terminal(job)) {
        /* A job the server finished early (stop sequence) still has a
         * cancel record: the agent must stop generating. */
        bool had_cancel = jobs_cancel_take(j, agent_id, job_id);
        *cancel = job->state != GPS_JOB_DONE || had_cancel;
        return 0;
    }
    /* The caller checked the body (gps_agent_events_check): every field
     * and number is within bounds, so nothing below can overflow. */
    if (seq < 0 || (!in && !json_is_array(events))) {
        snprintf(msg, msglen, "'seq' must be >= 0 and 'events' an array");
        return 400;
    }
    size_t n = in ? n_in : json_array_size(events);
    char field[96];
    for (size_t i = 0; i < n && !checked; i++) /* for callers that did not check */
        if (gps_agent_event_check(json_array_get(events, i), i, field, sizeof field, msg,
                                  msglen) < 0)
            return 400;
    if (seq > job->agent_seq) {
        *expected_seq = job->agent_seq;
        snprintf(msg, msglen, "seq %lld is beyond the %lld events received", seq,
                 job->agent_seq);
        return 409;
    }
    /* A read upload's caller touches the agent once for all its entries
     * (a registry lookup per entry was a tenth of an entry's cost). */
    if (!in)
        registry_touch(j->reg, registry_get(j->reg, agent_id), gp_now_mono_ms());
    /* Any accepted upload is agent activity, even a retry of events
     * already applied: the stall timer measures the agent's silence. */
    job->last_event_us = gp_now_mono_us();
    long long generated = 0; /* tokens read without a tree: counted once below */
    for (size_t i = (size_t)(job->agent_seq - seq); i < n; i++) {
        job->agent_seq++;
        bool token = in && !in[i].ev && !in[i].plain;
        int rc = token ? apply_token(j, job, &in[i], job->last_event_us)
                       : apply_one(j, job, in ? in[i].ev : json_array_get(events, i),
                                   in ? &in[i] : NULL);
        if (rc < 0) {
            /* Nothing of event i was applied: the upload is refused from
             * it, and the agent sends it again (seq skips the events before
             * it). Never a token missing from the middle of the text, nor
             * an event one subscriber got and another did not. */
            job->agent_seq--;
            if (generated)
                jobs_count(j, "tokens_generated_total", NULL, (double)generated);
            if (rc == NOT_JSON) {
                snprintf(msg, msglen, "event %zu does not read back as JSON", i);
                return 400;
            }
            snprintf(msg, msglen, "out of memory");
            return 500;
        }
        generated += token ? rc : 0;
        if (gps_job_terminal(job))
            break;
        /* Only an event of another kind (the agent's error) fails the job
         * over; a token never moves it, so no compare per token. */
        if (!token && strcmp(job->agent_id, agent_id) != 0) {
            jobs_count(j, "tokens_generated_total", NULL, (double)generated);
            return 0; /* failed over away from this agent by its own error */
        }
    }
    if (generated)
        jobs_count(j, "tokens_generated_total", NULL, (double)generated);
    if (job->state == GPS_JOB_CANCELLED || job->state == GPS_JOB_FAILED) {
        /* Failed by the agent's own error event: nothing to cancel. */
        *cancel = job->state == GPS_JOB_CANCELLED || jobs_cancel_take(j, agent_id, job_id);
    } else if (job->state == GPS_JOB_DONE) {
        *cancel = jobs_cancel_take(j, agent_id, job_id); /* finished early by the server */
    }
    return 0;
}

int gps_jobs_apply_events(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                          json_t *events, bool *cancel, long long *expected_seq, char *msg,
                          size_t msglen)
{
    return apply_events(j, job_id, agent_id, seq, events, NULL, 0, false, cancel, expected_seq,
                        msg, msglen);
}

int gps_jobs_apply_checked_events(gps_jobs *j, const char *job_id, const char *agent_id,
                                  long long seq, json_t *events, bool *cancel,
                                  long long *expected_seq, char *msg, size_t msglen)
{
    return apply_events(j, job_id, agent_id, seq, events, NULL, 0, true, cancel, expected_seq,
                        msg, msglen);
}

int gps_jobs_apply_upload(gps_jobs *j, const char *job_id, const char *agent_id, long long seq,
                          const gps_event_in *evs, size_t n, bool *cancel,
                          long long *expected_seq, char *msg, size_t msglen)
{
    return apply_events(j, job_id, agent_id, seq, NULL, evs, n, true, cancel, expected_seq, msg,
                        msglen);
}
