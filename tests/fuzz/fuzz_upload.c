/*
 * libFuzzer target: the strict batched-upload reader (src/server/upload_read.c)
 * against jansson, differentially. Whatever the reader accepts, jansson
 * (with JSON_REJECT_DUPLICATES, as gps_req_json parses) must read to the
 * same values and agent_check.h must accept, entry by entry, as the
 * jansson path of h_events_batch would: the agent id, each job id, seq,
 * every event (a token's text, token_id and compact size; a plain started,
 * metrics or end event's fields, as jobs.c reads them from the tree, and
 * its raw text, which must parse to the same tree; any other event equal),
 * and the instance. A body the reader declines is always safe (it
 * goes to jansson), so only acceptances are judged.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/fleet/agent_check.h"
#include "server/upload_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same_str(const json_t *v, const char *s, size_t n)
{
    if (!json_is_string(v) || json_string_length(v) != n || memcmp(json_string_value(v), s, n))
        abort();
}

/* An integer member >= 0 as jobs.c reads it, else -1. */
static long long count_of(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

static void same_opt_str(const json_t *v, const char *s)
{
    if (s ? !json_is_string(v) || strcmp(json_string_value(v), s) != 0 : json_is_string(v))
        abort();
}

/* A plain event: what apply_one reads from its tree, and its raw text. */
static void same_plain(const gps_event_in *e, const json_t *jev)
{
    json_t *raw = gp_json_loadb(e->raw, e->raw_len, NULL);
    if (!raw || !json_equal(raw, (json_t *)jev))
        abort();
    json_decref(raw);
    const char *t = e->progress                 ? "progress"
                    : e->type == GPS_EV_STARTED ? "started"
                    : e->type == GPS_EV_METRICS ? "metrics"
                    : e->type == GPS_EV_END     ? "end"
                                                : "";
    same_str(json_object_get(jev, "type"), t, strlen(t));
    if (e->progress) {
        if (e->type != GPS_EV_UNKNOWN ||
            e->progress_done != count_of(jev, "prompt_tokens_done") ||
            e->progress_total != count_of(jev, "prompt_tokens_total"))
            abort();
    } else if (e->type == GPS_EV_STARTED) {
        if (json_object_size(jev) != 1)
            abort();
    } else if (e->type == GPS_EV_METRICS) {
        const json_t *tps = json_object_get(jev, "tokens_per_sec");
        const json_t *ce = json_object_get(jev, "count_estimated");
        if (e->has_tps != json_is_number(tps) ||
            (e->has_tps && e->tokens_per_sec != json_number_value(tps)) ||
            e->prompt_tokens != count_of(jev, "prompt_tokens") ||
            e->count_estimated != (json_is_number(ce) && json_number_value(ce) != 0))
            abort();
    } else if (e->type == GPS_EV_END) {
        const json_t *u = json_object_get(jev, "usage");
        same_opt_str(json_object_get(jev, "finish_reason"), e->finish_reason);
        same_opt_str(json_object_get(jev, "stop_sequence"), e->stop_sequence);
        if (json_object_get(jev, "upstream_meta") ||
            e->prompt_tokens != count_of(u, "prompt_tokens") ||
            e->completion_tokens != count_of(u, "completion_tokens"))
            abort();
    } else {
        abort();
    }
}

static void same_event(const gps_event_in *e, const json_t *jev, size_t i)
{
    char field[96], msg[256];
    if (gps_agent_event_check(jev, i, field, sizeof field, msg, sizeof msg) < 0)
        abort();
    if (e->bytes != gp_json_compact_size(jev))
        abort();
    if (e->ev) {
        if (e->plain || !json_equal(e->ev, (json_t *)jev))
            abort();
        return;
    }
    if (e->plain) {
        same_plain(e, jev);
        return;
    }
    same_str(json_object_get(jev, "type"), "token", 5);
    same_str(json_object_get(jev, "text"), e->text, e->len);
    const json_t *id = json_object_get(jev, "token_id");
    if (e->token_id < 0 ? id != NULL : !json_is_integer(id) || json_integer_value(id) != e->token_id)
        abort();
    if (json_object_size(jev) != (id ? 3u : 2u))
        abort();
}

/* gps_work_read: what jansson reads, or declined. */
static void work_same(const uint8_t *data, size_t size)
{
    json_t *w = gps_work_read((const char *)data, size);
    if (!w)
        return;
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(body) || !json_equal(w, body))
        abort();
    json_decref(body);
    json_decref(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    work_same(data, size);
    gps_upload u;
    if (!gps_upload_read((const char *)data, size, 1024, &u))
        return 0;
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(body))
        abort();
    same_str(json_object_get(body, "agent_id"), u.agent_id, strlen(u.agent_id));
    if (!gp_uuid_valid(u.agent_id))
        abort();
    const json_t *inst = json_object_get(body, "instance");
    if (u.instance)
        same_str(inst, u.instance, u.instance_len);
    else if (inst)
        abort();
    const json_t *jobs = json_object_get(body, "jobs");
    if (!json_is_array(jobs) || json_array_size(jobs) != u.n_jobs || u.n_jobs == 0)
        abort();
    for (size_t k = 0; k < u.n_jobs; k++) {
        const gps_upload_job *jb = &u.jobs[k];
        const json_t *e = json_array_get(jobs, k);
        same_str(json_object_get(e, "job_id"), jb->job_id, jb->job_id_len);
        if (jb->job_id_len == 0 || jb->job_id_len > 128 || strlen(jb->job_id) != jb->job_id_len)
            abort();
        const json_t *seq = json_object_get(e, "seq"), *evs = json_object_get(e, "events");
        if (!json_is_integer(seq) || json_integer_value(seq) != jb->seq)
            abort();
        /* The entry as the jansson path checks it. */
        json_t *one = json_pack("{s:s,s:O,s:O}", "agent_id", u.agent_id, "seq", seq, "events", evs);
        char field[96], msg[256];
        if (!one || gps_agent_events_check(one, field, sizeof field, msg, sizeof msg) < 0)
            abort();
        json_decref(one);
        if (json_array_size(evs) != jb->n)
            abort();
        for (size_t i = 0; i < jb->n; i++)
            same_event(&u.evs[jb->first + i], json_array_get(evs, i), i);
    }
    json_decref(body);
    gps_upload_free(&u);
    return 0;
}
