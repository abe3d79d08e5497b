/* agent_check: see agent_check.h. */
#include "server/fleet/agent_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/gp_util.h"

static int fail(char *field, size_t fieldlen, char *msg, size_t msglen, const char *f,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int fail(char *field, size_t fieldlen, char *msg, size_t msglen, const char *f,
                const char *fmt, ...)
{
    if (field && fieldlen)
        snprintf(field, fieldlen, "%s", f);
    if (msg && msglen) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(msg, msglen, "%s: ", f);
        if (n >= 0 && (size_t)n < msglen)
            vsnprintf(msg + n, msglen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

bool gps_agent_text_ok(const char *s, size_t len, size_t max)
{
    if (!s || len == 0 || len > max)
        return false;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len; i++) {
        unsigned c = p[i];
        if (c < 0x20 || c == 0x7f)
            return false;
        /* C1 controls U+0080..U+009F: C2 80..C2 9F (CSI is one of them). */
        if (c == 0xc2 && i + 1 < len && p[i + 1] <= 0x9f)
            return false;
        /* U+2028/2029 and the bidi controls U+202A..202E, U+2066..2069:
         * E2 80 A8..AE and E2 81 A6..A9. */
        if (c == 0xe2 && i + 2 < len &&
            ((p[i + 1] == 0x80 && p[i + 2] >= 0xa8 && p[i + 2] <= 0xae) ||
             (p[i + 1] == 0x81 && p[i + 2] >= 0xa6 && p[i + 2] <= 0xa9)))
            return false;
    }
    return true;
}

bool gps_agent_name_ok(const json_t *v, size_t max)
{
    return json_is_string(v) &&
           gps_agent_text_ok(json_string_value(v), json_string_length(v), max);
}

/* An optional integer member in lo..hi. 1 absent/null, 0 ok, -1 bad. */
static int int_in(const json_t *obj, const char *key, long long lo, long long hi)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return 1;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    return 0;
}

/* A finite number within lo..hi (JSON has no NaN or infinity, but a real
 * that overflowed while parsing must not slip through). */
static bool num_in(const json_t *v, double lo, double hi)
{
    if (!json_is_number(v))
        return false;
    double d = json_number_value(v);
    return isfinite(d) && d >= lo && d <= hi;
}

/* Bounds of the metrics fields the server reads or the agents send. */
static const struct {
    const char *name;
    double lo, hi;
    bool integer;
} metric_bounds[] = {
    {"prompt_tokens", 0, (double)GPS_AGENT_MAX_TOKENS, true},
    {"completion_tokens", 0, (double)GPS_AGENT_MAX_TOKENS, true},
    {"tokens_per_sec", 0, 1e9, false},
    {"time_to_first_token_ms", 0, 1e10, false},
    {"ttft_ms", 0, 1e10, false},
    {"total_ms", 0, 1e10, false},
};

/* A metrics event (events[i]). Field names are formatted only for a
 * failure: a valid event (one a request) formats nothing. */
static int check_metrics(const json_t *ev, size_t i, char *field, size_t fieldlen, char *msg,
                         size_t msglen)
{
    char f[96];
    if (json_object_size(ev) > GPS_AGENT_MAX_METRICS_FIELDS) {
        snprintf(f, sizeof f, "events[%zu]", i);
        return fail(field, fieldlen, msg, msglen, f, "a metrics event has at most %d fields",
                    GPS_AGENT_MAX_METRICS_FIELDS);
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)ev, k, v) {
        if (strcmp(k, "type") == 0)
            continue;
        bool known = false; /* (a non-number is NAN: out of every bound) */
        if (gps_agent_metric_check(k, json_is_integer(v),
                                   json_is_number(v) ? json_number_value(v) : NAN, &known) == 0)
            continue;
        snprintf(f, sizeof f, "events[%zu].%.32s", i, k);
        for (size_t b = 0; known && b < sizeof metric_bounds / sizeof metric_bounds[0]; b++)
            if (strcmp(k, metric_bounds[b].name) == 0)
                return fail(field, fieldlen, msg, msglen, f, "must be %s from %g to %g",
                            metric_bounds[b].integer ? "an integer" : "a number",
                            metric_bounds[b].lo, metric_bounds[b].hi);
        return fail(field, fieldlen, msg, msglen, f,
                    "metrics values must be numbers of at most %g in absolute value",
                    GPS_AGENT_MAX_NUMBER);
    }
    return 0;
}

int gps_agent_metric_check(const char *name, bool integer, double v, bool *known)
{
    bool dummy;
    known = known ? known : &dummy;
    *known = false;
    for (size_t b = 0; b < sizeof metric_bounds / sizeof metric_bounds[0]; b++) {
        if (strcmp(name, metric_bounds[b].name) != 0)
            continue;
        *known = true;
        return (metric_bounds[b].integer && !integer) || !isfinite(v) ||
                       v < metric_bounds[b].lo || v > metric_bounds[b].hi
                   ? -1
                   : 0;
    }
    return isfinite(v) && v >= -GPS_AGENT_MAX_NUMBER && v <= GPS_AGENT_MAX_NUMBER ? 0 : -1;
}

/* A failure of field events[i]<suffix>. The field's name is formatted only
 * here: checking a valid event (the common case, every token of every
 * stream) formats nothing. */
static int efail(char *field, size_t fieldlen, char *msg, size_t msglen, size_t i,
                 const char *suffix, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int efail(char *field, size_t fieldlen, char *msg, size_t msglen, size_t i,
                 const char *suffix, const char *fmt, ...)
{
    char f[96], m[400];
    snprintf(f, sizeof f, "events[%zu]%s", i, suffix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return fail(field, fieldlen, msg, msglen, f, "%s", m);
}

#define EFAIL(suffix, ...) return efail(field, fieldlen, msg, msglen, i, suffix, __VA_ARGS__)

int gps_agent_event_check(const json_t *ev, size_t i, char *field, size_t fieldlen, char *msg,
                          size_t msglen)
{
    size_t bytes;
    return gps_agent_event_check_sized(ev, i, &bytes, field, fieldlen, msg, msglen);
}

int gps_agent_event_check_sized(const json_t *ev, size_t i, size_t *bytes_out, char *field,
                                size_t fieldlen, char *msg, size_t msglen)
{
    *bytes_out = 0;
    if (!json_is_object(ev))
        EFAIL("", "must be an object");
    /* Size first: every later rule reads a bounded object. */
    size_t bytes = gp_json_compact_size(ev);
    *bytes_out = bytes;
    if (bytes == 0 || bytes > GPS_AGENT_MAX_EVENT_BYTES)
        EFAIL("", "an event is at most %d bytes of JSON", GPS_AGENT_MAX_EVENT_BYTES);
    const json_t *type = json_object_get(ev, "type");
    if (!gps_agent_name_ok(type, GPS_AGENT_MAX_TYPE))
        EFAIL(".type", "must be a printable string of at most %d bytes", GPS_AGENT_MAX_TYPE);
    const char *t = json_string_value(type);
    if (strcmp(t, "token") == 0) {
        if (!json_is_string(json_object_get(ev, "text")))
            EFAIL(".text", "must be a string");
        if (int_in(ev, "token_id", 0, GPS_AGENT_MAX_TOKEN_ID) < 0)
            EFAIL(".token_id", "must be an integer from 0 to %lld", GPS_AGENT_MAX_TOKEN_ID);
        /* token_ids: every token sampled since the previous event (the
         * ids of a token-exact continuation), the last equal to token_id. */
        const json_t *ids = json_object_get(ev, "token_ids");
        if (ids) {
            size_t n = json_array_size(ids);
            bool ok = json_is_array(ids) && n >= 1 && n <= GPS_AGENT_MAX_EVENTS;
            for (size_t k = 0; ok && k < n; k++) {
                const json_t *v = json_array_get(ids, k);
                ok = json_is_integer(v) && json_integer_value(v) >= 0 &&
                     json_integer_value(v) <= GPS_AGENT_MAX_TOKEN_ID;
            }
            const json_t *one = json_object_get(ev, "token_id");
            if (ok && one && !json_is_null(one))
                ok = json_integer_value(one) == json_integer_value(json_array_get(ids, n - 1));
            if (!ok)
                EFAIL(".token_ids",
                      "must be an array of 1..%d token ids (integers 0..%lld), the last "
                      "equal to token_id",
                      GPS_AGENT_MAX_EVENTS, GPS_AGENT_MAX_TOKEN_ID);
        }
        const json_t *lp = json_object_get(ev, "logprob");
        if (lp && !json_is_null(lp) && !num_in(lp, GPS_AGENT_MIN_LOGPROB, 0))
            EFAIL(".logprob", "must be a number from %g to 0", GPS_AGENT_MIN_LOGPROB);
    } else if (strcmp(t, "tool_call") == 0) {
        const json_t *a = json_object_get(ev, "arguments");
        const json_t *id = json_object_get(ev, "id"), *name = json_object_get(ev, "name");
        if (int_in(ev, "index", 0, 1024) != 0 || (a && !json_is_string(a)) ||
            (id && !gps_agent_name_ok(id, GPS_AGENT_MAX_NAME)) ||
            (name && !gps_agent_name_ok(name, GPS_AGENT_MAX_NAME)))
            EFAIL("", "a tool_call needs an integer index (0..1024), string arguments and "
                      "printable id and name of at most %d bytes",
                  GPS_AGENT_MAX_NAME);
    } else if (strcmp(t, "progress") == 0) {
        /* Prefill progress (a proof of life during a long prompt): prompt
         * token counts, bounded like any token count. */
        static const char *const keys[] = {"prompt_tokens_done", "prompt_tokens_total"};
        static const char *const sfx[] = {".prompt_tokens_done", ".prompt_tokens_total"};
        for (size_t k = 0; k < 2; k++)
            if (int_in(ev, keys[k], 0, GPS_AGENT_MAX_TOKENS) < 0)
                EFAIL(sfx[k], "must be an integer from 0 to %lld", GPS_AGENT_MAX_TOKENS);
    } else if (strcmp(t, "metrics") == 0) {
        return check_metrics(ev, i, field, fieldlen, msg, msglen);
    } else if (strcmp(t, "end") == 0) {
        const json_t *fr = json_object_get(ev, "finish_reason");
        if (fr && !json_is_null(fr) && !gps_agent_name_ok(fr, 32))
            EFAIL(".finish_reason", "must be a short string");
        const json_t *u = json_object_get(ev, "usage");
        if (u && !json_is_null(u) && !json_is_object(u))
            EFAIL(".usage", "must be an object");
        const json_t *ss = json_object_get(ev, "stop_sequence");
        if (ss && !json_is_null(ss) &&
            (!json_is_string(ss) || json_string_length(ss) == 0 ||
             json_string_length(ss) > GPS_AGENT_MAX_STOP_SEQUENCE))
            EFAIL(".stop_sequence", "must be a non-empty string of at most %d bytes",
                  GPS_AGENT_MAX_STOP_SEQUENCE);
        /* An upstream pool's x_pool_meta, shown to the client as
         * x_pool_meta.upstream: an object, bounded like any agent text. */
        const json_t *um = json_object_get(ev, "upstream_meta");
        if (um && !json_is_null(um) &&
            (!json_is_object(um) || gp_json_compact_size(um) > GPS_AGENT_MAX_UPSTREAM_META))
            EFAIL(".upstream_meta", "must be an object of at most %d bytes (compact JSON)",
                  GPS_AGENT_MAX_UPSTREAM_META);
        static const char *const counts[] = {"prompt_tokens", "completion_tokens"};
        static const char *const csfx[] = {".usage.prompt_tokens", ".usage.completion_tokens"};
        for (size_t k = 0; k < 2; k++)
            if (int_in(u, counts[k], 0, GPS_AGENT_MAX_TOKENS) < 0)
                EFAIL(csfx[k], "must be an integer from 0 to %lld", GPS_AGENT_MAX_TOKENS);
    } else if (strcmp(t, "embedding") == 0) {
        /* An embeddings job's vector (docs/protocol.md "Embeddings"). */
        if (int_in(ev, "index", 0, 2047) != 0)
            EFAIL(".index", "must be an integer from 0 to 2047");
        if (!json_is_string(json_object_get(ev, "embedding")))
            EFAIL(".embedding", "must be a string (base64 of little-endian float32)");
    } else if (strcmp(t, "error") == 0) {
        const json_t *c = json_object_get(ev, "code"), *m = json_object_get(ev, "message");
        if (c && !json_is_null(c) && !gps_agent_name_ok(c, GPS_AGENT_MAX_CODE))
            EFAIL(".code", "must be a printable string of at most %d bytes", GPS_AGENT_MAX_CODE);
        if (m && !json_is_null(m) &&
            (!json_is_string(m) || json_string_length(m) > GPS_AGENT_MAX_MESSAGE))
            EFAIL(".message", "must be a string of at most %d bytes", GPS_AGENT_MAX_MESSAGE);
    }
    return 0;
}

#undef EFAIL

int gps_agent_events_check(const json_t *body, char *field, size_t fieldlen, char *msg,
                           size_t msglen)
{
    if (!json_is_object(body))
        return fail(field, fieldlen, msg, msglen, "body", "must be a JSON object");
    const json_t *id = json_object_get(body, "agent_id");
    if (!json_is_string(id) || json_string_length(id) != 36 ||
        !gp_uuid_valid(json_string_value(id)))
        return fail(field, fieldlen, msg, msglen, "agent_id", "must be a UUID string");
    const json_t *seq = json_object_get(body, "seq");
    if (!json_is_integer(seq) || json_integer_value(seq) < 0 ||
        json_integer_value(seq) > GPS_AGENT_MAX_SEQ)
        return fail(field, fieldlen, msg, msglen, "seq", "must be an integer from 0 to %lld",
                    GPS_AGENT_MAX_SEQ);
    const json_t *events = json_object_get(body, "events");
    if (!json_is_array(events) || json_array_size(events) > GPS_AGENT_MAX_EVENTS)
        return fail(field, fieldlen, msg, msglen, "events",
                    "must be an array of at most %d events", GPS_AGENT_MAX_EVENTS);
    size_t n = json_array_size(events);
    for (size_t i = 0; i < n; i++)
        if (gps_agent_event_check(json_array_get(events, i), i, field, fieldlen, msg, msglen) < 0)
            return -1;
    return 0;
}

/* Bounds of the hardware facts' numbers. */
static const struct {
    const char *name;
    double lo, hi;
} hw_bounds[] = {
    {"vram_total", 0, 1125899906842624.0}, /* 2^50 */
    {"vram_used", 0, 1125899906842624.0},
    {"vram_model", 0, 1125899906842624.0},
    {"vram_free", 0, 1125899906842624.0},
    {"power_w", 0, 100000},
    {"utilization", 0, 1},
    {"temperature", -273, 1000},
    {"index", 0, 65536},
    {"cores", 0, 65536},
};

static int check_hw_object(const json_t *o, const char *at, char *msg, size_t msglen)
{
    char f[96];
    if (!json_is_object(o) || json_object_size(o) > 32)
        return fail(NULL, 0, msg, msglen, at, "must be an object of at most 32 fields");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        snprintf(f, sizeof f, "%s.%.32s", at, k);
        if (json_is_string(v)) {
            if (json_string_length(v) > 0 && !gps_agent_name_ok(v, GPS_AGENT_MAX_NAME))
                return fail(NULL, 0, msg, msglen, f,
                            "must be printable text of at most %d bytes", GPS_AGENT_MAX_NAME);
            continue;
        }
        if (json_is_boolean(v) || json_is_null(v))
            continue;
        double lo = -GPS_AGENT_MAX_NUMBER, hi = GPS_AGENT_MAX_NUMBER;
        for (size_t i = 0; i < sizeof hw_bounds / sizeof hw_bounds[0]; i++)
            if (strcmp(k, hw_bounds[i].name) == 0) {
                lo = hw_bounds[i].lo;
                hi = hw_bounds[i].hi;
            }
        if (!num_in(v, lo, hi))
            return fail(NULL, 0, msg, msglen, f, "must be a number from %g to %g", lo, hi);
    }
    return 0;
}

int gps_agent_hw_check(const json_t *body, char *msg, size_t msglen)
{
    const json_t *gpus = json_object_get(body, "gpus");
    if (gpus && !json_is_null(gpus)) {
        if (!json_is_array(gpus) || json_array_size(gpus) > 64)
            return fail(NULL, 0, msg, msglen, "gpus", "must be an array of at most 64 objects");
        for (size_t i = 0; i < json_array_size(gpus); i++) {
            char at[32];
            snprintf(at, sizeof at, "gpus[%zu]", i);
            if (check_hw_object(json_array_get(gpus, i), at, msg, msglen) < 0)
                return -1;
        }
    }
    const json_t *cpu = json_object_get(body, "cpu");
    if (cpu && !json_is_null(cpu))
        return check_hw_object(cpu, "cpu", msg, msglen);
    return 0;
}

/* The poll fields kept per agent. To keep a new one, add it here, and
 * bound its contents (gps_agent_hw_check, or a check of its own). */
static const char *const facts_kept[] = {
    "name",   "version", "platform", "status",  "slots",          "queue_depth",
    "kv_cache_utilization", "labels", "gpus",   "cpu",     "backend", "backend_faults",
    "engines", "error",
};

json_t *gps_agent_facts_kept(const json_t *body, char *msg, size_t msglen)
{
    json_t *kept = json_object();
    if (!kept) {
        snprintf(msg, msglen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < sizeof facts_kept / sizeof facts_kept[0]; i++) {
        json_t *v = json_object_get(body, facts_kept[i]);
        if (v && json_object_set(kept, facts_kept[i], v) < 0) {
            json_decref(kept);
            snprintf(msg, msglen, "out of memory");
            return NULL;
        }
    }
    if (json_dumpb(kept, NULL, 0, JSON_COMPACT) > GPS_AGENT_MAX_KEPT_FACTS_BYTES) {
        json_decref(kept);
        fail(NULL, 0, msg, msglen, "body",
             "the facts kept per agent (%s and the like) are at most %d bytes of JSON",
             "gpus, cpu, labels, engines, error", GPS_AGENT_MAX_KEPT_FACTS_BYTES);
        return NULL;
    }
    return kept;
}
