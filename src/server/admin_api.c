/* admin_api: see admin_api.h. */
#include "server/fleet/pins.h"
#include "server/fleet/deploy.h"
#include "server/admin_api.h"
#include "server/http/textcheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/http/held.h"
#include "server/metrics.h"
#include "server/fleet/sched.h"

struct gps_admin {
    struct event_base *base;
    gps_auth *auth;
    gps_limits *limits;
    registry *reg;
    gps_jobs *jobs;
    gps_store *store;
    gps_pins *pins;              /* NULL: no attestation */
    gps_deploy *deploy;          /* NULL: no deployments */
    gps_admin_auth_on_fn auth_on; /* NULL: none (see gps_admin_set_auth_on_hook) */
    void *auth_on_arg;
    gps_admin_servers_fn servers; /* NULL: no "servers" in the status */
    void *servers_arg;
    char version[32];
    uint64_t started_ms;         /* monotonic, for uptime */
    gps_admin_rate rate;
    gps_admin_history history;
    struct event *rate_timer;
};

/* ------------------------------------------------------------------ */
/* Validation (pure)                                                   */
/* ------------------------------------------------------------------ */

#define FAIL(p, ...)                                                                           \
    do {                                                                                       \
        snprintf(msg, msglen, __VA_ARGS__);                                                    \
        *param = (p);                                                                          \
        return -1;                                                                             \
    } while (0)

/* A present, non-null member must be a non-negative integer. 1 when set,
 * 0 when absent, -1 when wrong. */
static int opt_count(const json_t *body, const char *key, int64_t *out)
{
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

/* The three limits; shared by create and PATCH. Returns how many were
 * given, or -1 (msg, param set). */
static int parse_limit_fields(const json_t *body, gps_key_limits *l, char *msg, size_t msglen,
                              const char **param)
{
    static const char *const names[] = {"rpm", "tokens_per_day", "max_concurrent"};
    int64_t *dst[] = {&l->rpm, &l->tokens_per_day, &l->max_concurrent};
    int given = 0;
    for (size_t i = 0; i < 3; i++) {
        int rc = opt_count(body, names[i], dst[i]);
        if (rc < 0)
            FAIL(names[i], "'%s' must be a non-negative integer (0 = unlimited)", names[i]);
        given += rc;
    }
    return given;
}

int gps_admin_parse_key_create(const json_t *body, int64_t now_wall_ms, gps_key_spec *spec,
                               char *msg, size_t msglen, const char **param)
{
    memset(spec, 0, sizeof *spec);
    *param = NULL;
    msg[0] = '\0';
    if (!json_is_object(body))
        FAIL(NULL, "request body must be a JSON object");
    const char *role = json_string_value(json_object_get(body, "role"));
    int r = role ? gps_key_role_parse(role) : -1;
    if (r < 0)
        FAIL("role", "'role' is required: client, agent, admin or enrollment");
    spec->role = (gps_key_role)r;
    const json_t *name = json_object_get(body, "name");
    if (name && !json_is_null(name)) {
        /* Shown raw by gpupoolctl and in logs: printable UTF-8 only. */
        if (!json_is_string(name) || json_string_length(name) > 256 ||
            !gps_text_printable_utf8(json_string_value(name), json_string_length(name)))
            FAIL("name", "'name' must be printable UTF-8 (no control characters) of at most "
                         "256 bytes");
        spec->name = json_string_value(name);
    }
    int64_t exp = 0;
    if (opt_count(body, "expires_in_sec", &exp) < 0 || exp > 100LL * 365 * 86400)
        FAIL("expires_in_sec", "'expires_in_sec' must be a non-negative integer of at most "
                               "100 years (0 = never)");
    spec->expires_at = exp > 0 ? now_wall_ms + exp * 1000 : 0;
    if (parse_limit_fields(body, &spec->limits, msg, msglen, param) < 0)
        return -1;
    int given = opt_count(body, "max_uses", &spec->max_uses);
    if (given < 0)
        FAIL("max_uses", "'max_uses' must be a non-negative integer (0 = unlimited)");
    if (given == 0 && spec->role == GPS_KEY_ENROLLMENT)
        spec->max_uses = GPS_ENROLL_DEFAULT_MAX_USES;
    if (spec->max_uses > 0 && spec->role != GPS_KEY_ENROLLMENT)
        FAIL("max_uses", "'max_uses' applies to enrollment tokens only");
    return 0;
}

int gps_admin_parse_limits(const json_t *body, gps_key_limits *limits, char *msg, size_t msglen,
                           const char **param)
{
    *param = NULL;
    msg[0] = '\0';
    if (!json_is_object(body))
        FAIL(NULL, "request body must be a JSON object");
    gps_key_limits l = *limits;
    int given = parse_limit_fields(body, &l, msg, msglen, param);
    if (given < 0)
        return -1;
    if (given == 0)
        FAIL(NULL, "give at least one of 'rpm', 'tokens_per_day', 'max_concurrent'");
    *limits = l;
    return 0;
}

/* Copy s into *buf (advancing it); NULL when it does not fit. */
static const char *buf_copy(char **buf, size_t *left, const char *s)
{
    size_t n = strlen(s) + 1;
    if (n > *left)
        return NULL;
    memcpy(*buf, s, n);
    const char *out = *buf;
    *buf += n;
    *left -= n;
    return out;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int gps_admin_parse_job_query(const char *query, gps_store_job_filter *f, char *buf,
                              size_t bufsize, char *msg, size_t msglen, const char **param)
{
    memset(f, 0, sizeof *f);
    f->limit = GPS_ADMIN_JOBS_DEFAULT;
    *param = NULL;
    msg[0] = '\0';
    if (!query || !*query)
        return 0;
    /* The parser decodes %00 and the value is then cut there: "x%00y"
     * would match "x". No filter value can hold a control byte. */
    if (gps_query_has_control(query))
        FAIL(NULL, "query values must not contain control characters (such as %%00)");
    struct evkeyvalq q; /* initialised by the parser, which also clears it on failure */
    if (evhttp_parse_query_str(query, &q) != 0)
        FAIL(NULL, "malformed query string");
    /* The exact-match filters (static names: param outlives the query). */
    const struct {
        const char *name;
        const char **dst;
    } filters[] = {{"status", &f->status}, {"model", &f->model}, {"agent", &f->agent_id},
                   {"key", &f->key_id}};
    int rc = 0;
    for (struct evkeyval *kv = q.tqh_first; kv && rc == 0; kv = kv->next.tqe_next) {
        size_t fi = 0;
        while (fi < sizeof filters / sizeof filters[0] && strcmp(kv->key, filters[fi].name))
            fi++;
        int64_t v;
        if (fi < sizeof filters / sizeof filters[0]) {
            /* An empty value means "any", as if the parameter were absent. */
            if (!*kv->value)
                continue;
            if (strlen(kv->value) > 256 ||
                !(*filters[fi].dst = buf_copy(&buf, &bufsize, kv->value))) {
                snprintf(msg, msglen, "'%s' is too long", filters[fi].name);
                *param = filters[fi].name;
                rc = -1;
            }
        } else if (strcmp(kv->key, "limit") == 0) {
            if (parse_i64(kv->value, 1, GPS_ADMIN_JOBS_MAX, &v) < 0) {
                snprintf(msg, msglen, "'limit' must be an integer in 1..%d", GPS_ADMIN_JOBS_MAX);
                *param = "limit";
                rc = -1;
            } else {
                f->limit = (int)v;
            }
        } else if (strcmp(kv->key, "before") == 0) {
            if (parse_i64(kv->value, 1, INT64_MAX, &v) < 0) {
                snprintf(msg, msglen, "'before' must be a positive integer (wall ms)");
                *param = "before";
                rc = -1;
            } else {
                f->before = v;
            }
        }
        /* Unknown parameters are ignored, like most HTTP APIs do. */
    }
    evhttp_clear_headers(&q);
    return rc;
}

#undef FAIL

/* ------------------------------------------------------------------ */
/* Throughput ring                                                     */
/* ------------------------------------------------------------------ */

void gps_admin_rate_push(gps_admin_rate *r, uint64_t now_ms, double requests, double tokens)
{
    size_t i = (r->head + r->n) % GPS_ADMIN_RATE_SLOTS;
    if (r->n == GPS_ADMIN_RATE_SLOTS) {
        i = r->head;
        r->head = (r->head + 1) % GPS_ADMIN_RATE_SLOTS;
    } else {
        r->n++;
    }
    r->t_ms[i] = now_ms;
    r->requests[i] = requests;
    r->tokens[i] = tokens;
}

void gps_admin_rate_get(const gps_admin_rate *r, uint64_t now_ms, double requests, double tokens,
                        double *requests_per_min, double *tokens_per_sec)
{
    *requests_per_min = 0;
    *tokens_per_sec = 0;
    /* The oldest sample inside the window: samples are pushed in time
     * order, so the first one found from the head is it. */
    for (size_t k = 0; k < r->n; k++) {
        size_t i = (r->head + k) % GPS_ADMIN_RATE_SLOTS;
        if (now_ms < r->t_ms[i] || now_ms - r->t_ms[i] > 60000)
            continue;
        uint64_t span = now_ms - r->t_ms[i];
        if (span < 1000)
            return;
        double sec = (double)span / 1000.0;
        double dr = requests - r->requests[i], dt = tokens - r->tokens[i];
        *requests_per_min = dr > 0 ? dr * 60.0 / sec : 0;
        *tokens_per_sec = dt > 0 ? dt / sec : 0;
        return;
    }
}

static void counters_now(gps_admin *a, double *requests, double *tokens)
{
    gps_metrics *m = gps_jobs_metrics(a->jobs);
    /* Totals over every api and outcome: the labels are the dialects'
     * business, the ring only wants "how many". */
    *requests = m ? gps_metrics_sum(m, "requests_total") : 0;
    *tokens = m ? gps_metrics_sum(m, "tokens_generated_total") : 0;
}

/* Requests answered with an error (every outcome but ok). */
static double errors_now(gps_admin *a)
{
    gps_metrics *m = gps_jobs_metrics(a->jobs);
    return m ? gps_metrics_sum_except(m, "requests_total", "outcome=\"ok\"") : 0;
}

static void rate_tick(evutil_socket_t fd, short what, void *arg)
{
    gps_admin *a = arg;
    double req, tok;
    counters_now(a, &req, &tok);
    gps_admin_rate_push(&a->rate, gp_now_mono_ms(), req, tok);
    gps_admin_history_push(&a->history, gp_now_wall_ms(), req, errors_now(a));
}

void gps_admin_history_push(gps_admin_history *h, int64_t now_wall_ms, double requests,
                            double errors)
{
    int64_t minute = now_wall_ms / 60000;
    if (h->cur_minute == 0) {
        h->cur_minute = minute;
        h->cur_req0 = requests;
        h->cur_err0 = errors;
        return;
    }
    if (minute <= h->cur_minute)
        return;
    /* Close the minute in progress (what arrived up to this first sample
     * of the next minute counts in it: a second's blur at most). */
    size_t i = (h->head + h->n) % GPS_ADMIN_HISTORY_MINUTES;
    if (h->n == GPS_ADMIN_HISTORY_MINUTES)
        h->head = (h->head + 1) % GPS_ADMIN_HISTORY_MINUTES;
    else
        h->n++;
    h->minute[i] = h->cur_minute;
    h->requests[i] = requests - h->cur_req0;
    h->errors[i] = errors - h->cur_err0;
    h->cur_minute = minute;
    h->cur_req0 = requests;
    h->cur_err0 = errors;
}

json_t *gps_admin_history_json(const gps_admin_history *h, int64_t now_wall_ms, double requests,
                               double errors)
{
    json_t *arr = json_array();
    int64_t now_min = now_wall_ms / 60000;
    int64_t first = now_min - (GPS_ADMIN_HISTORY_MINUTES - 1);
    size_t k = 0;
    for (int64_t m = first; arr && m < now_min; m++) {
        double rq = 0, er = 0;
        /* The ring is in minute order: advance past older entries. */
        while (k < h->n && h->minute[(h->head + k) % GPS_ADMIN_HISTORY_MINUTES] < m)
            k++;
        if (k < h->n && h->minute[(h->head + k) % GPS_ADMIN_HISTORY_MINUTES] == m) {
            rq = h->requests[(h->head + k) % GPS_ADMIN_HISTORY_MINUTES];
            er = h->errors[(h->head + k) % GPS_ADMIN_HISTORY_MINUTES];
        }
        if (json_array_append_new(arr, json_pack("{s:I,s:f,s:f}", "t", (json_int_t)(m * 60000),
                                                 "requests", rq, "errors", er)) < 0)
            goto oom;
    }
    double rq = h->cur_minute == now_min ? requests - h->cur_req0 : 0;
    double er = h->cur_minute == now_min ? errors - h->cur_err0 : 0;
    if (arr && json_array_append_new(arr, json_pack("{s:I,s:f,s:f}", "t",
                                                    (json_int_t)(now_min * 60000), "requests",
                                                    rq, "errors", er)) < 0)
        goto oom;
    return arr;
oom: /* a chart with a minute missing would draw the wrong hour */
    json_decref(arr);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

/* Wall ms as JSON: null for 0 ("never"). New reference. */
static json_t *wall_or_null(int64_t ms)
{
    return ms > 0 ? json_integer((json_int_t)ms) : json_null();
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

/* A query with a control byte (a decoded %00 cuts the value) gets a 400:
 * true when answered. */
static bool query_refused(gps_req *r)
{
    if (!gps_query_has_control(evhttp_uri_get_query(evhttp_request_get_evhttp_uri(r->req))))
        return false;
    gps_req_error(r, 400, "INVALID_REQUEST",
                  "query values must not contain control characters (such as %00)", NULL);
    return true;
}

/* Value of a query parameter of the request (copied into out), false when
 * absent. Callers refuse a query with control bytes first (query_refused). */
static bool query_get(gps_req *r, const char *key, char *out, size_t outlen)
{
    const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(r->req));
    struct evkeyvalq q;
    bool found = false;
    if (query && evhttp_parse_query_str(query, &q) == 0) {
        const char *v = evhttp_find_header(&q, key);
        if (v) {
            snprintf(out, outlen, "%s", v);
            found = true;
        }
        evhttp_clear_headers(&q);
    }
    return found;
}

static void oom(gps_req *r)
{
    gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
}

static void send_json_or_oom(gps_req *r, int status, json_t *body)
{
    if (!body) {
        oom(r);
        return;
    }
    gps_http_send_json(r->req, status, body);
}

/* Lists come from hash tables; sort them so output is stable: by
 * created_at (keys; absent for agents) and then by id. */
static int obj_cmp(const void *x, const void *y)
{
    const json_t *ox = *(json_t *const *)x, *oy = *(json_t *const *)y;
    json_int_t cx = json_integer_value(json_object_get(ox, "created_at"));
    json_int_t cy = json_integer_value(json_object_get(oy, "created_at"));
    if (cx != cy)
        return cx < cy ? -1 : 1;
    const char *a = json_string_value(json_object_get(ox, "id"));
    const char *b = json_string_value(json_object_get(oy, "id"));
    return strcmp(a ? a : "", b ? b : "");
}

/* Sort an array of objects in place with obj_cmp. 0 or -1 (ENOMEM). */
static int sort_objects(json_t *arr) { return gp_json_array_sort(arr, obj_cmp); }

/* ------------------------------------------------------------------ */
/* Keys                                                                */
/* ------------------------------------------------------------------ */

static json_t *limits_json(const gps_key_limits *l)
{
    return json_pack("{s:I,s:I,s:I}", "rpm", (json_int_t)l->rpm, "tokens_per_day",
                     (json_int_t)l->tokens_per_day, "max_concurrent",
                     (json_int_t)l->max_concurrent);
}

/* The public view of a key (never its hash). New reference, NULL on ENOMEM. */
static json_t *key_json(gps_admin *a, const gps_auth_key *k, int64_t now)
{
    gps_key_usage u;
    memset(&u, 0, sizeof u);
    if (a->limits)
        gps_limits_get_usage(a->limits, k->id, now, &u);
    /* One word for tables: a token whose uses are spent refuses every
     * enrollment like a revoked one, and should look like it. */
    const char *state = k->revoked_at                              ? "revoked"
                        : k->expires_at && now >= k->expires_at    ? "expired"
                        : k->max_uses > 0 && k->uses >= k->max_uses ? "used_up"
                                                                    : "active";
    json_t *o = json_pack(
        "{s:s,s:s,s:s,s:o,s:I,s:o,s:o,s:o,s:o,s:I,s:I,s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I}}", "id",
        k->id,
        "role", gps_key_role_name(k->role), "name", k->name ? k->name : "", "agent_id",
        str_or_null(k->agent_id), "created_at", (json_int_t)k->created_at, "expires_at",
        wall_or_null(k->expires_at), "revoked_at", wall_or_null(k->revoked_at), "last_used_at",
        wall_or_null(k->last_used_at), "limits", limits_json(&k->limits), "max_uses",
        (json_int_t)k->max_uses, "uses", (json_int_t)k->uses, "usage_today", "requests",
        (json_int_t)u.requests, "prompt_tokens", (json_int_t)u.prompt_tokens,
        "completion_tokens", (json_int_t)u.completion_tokens, "rate_limited",
        (json_int_t)u.rate_limited, "running", (json_int_t)u.running, "waiting",
        (json_int_t)u.waiting, "reserved_tokens", (json_int_t)u.reserved_tokens);
    if (o && json_object_set_new(o, "state", json_string(state)) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

typedef struct key_list {
    gps_admin *a;
    int role;                    /* -1 = all */
    int64_t now;
    json_t *arr;
    bool oom;
} key_list;

static void key_list_one(void *arg, const gps_auth_key *k)
{
    key_list *kl = arg;
    if (kl->oom || (kl->role >= 0 && (int)k->role != kl->role))
        return;
    json_t *o = key_json(kl->a, k, kl->now);
    if (!o || json_array_append_new(kl->arr, o) < 0)
        kl->oom = true;
}

static void h_keys_list(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    char role[32];
    if (query_refused(r))
        return;
    key_list kl = {a, -1, gp_now_wall_ms(), json_array(), false};
    if (query_get(r, "role", role, sizeof role) && role[0]) {
        kl.role = gps_key_role_parse(role);
        if (kl.role < 0) {
            json_decref(kl.arr);
            gps_req_error(r, 400, "INVALID_REQUEST",
                          "'role' must be client, agent, admin or enrollment", "role");
            return;
        }
    }
    if (kl.arr)
        gps_auth_key_foreach(a->auth, key_list_one, &kl);
    if (!kl.arr || kl.oom || sort_objects(kl.arr) < 0) {
        json_decref(kl.arr);
        oom(r);
        return;
    }
    send_json_or_oom(r, 200, json_pack("{s:o}", "keys", kl.arr));
}

/* {"admin_key_file": path or null, "message"} for the reply that turned
 * auth on. path: where the hook wrote an admin key, "" when it could not;
 * NULL when that is not known yet (the reply made before the key exists,
 * whose message holds either way). With an admin key just made, the caller
 * holds one already. New reference, NULL on ENOMEM. */
static json_t *auth_on_json(gps_key_role role, const char *path)
{
    char msg[2600]; /* the path appears twice */
    if (role == GPS_KEY_ADMIN)
        snprintf(msg, sizeof msg,
                 "auth is now on (this server had no keys): every request needs a key; use "
                 "this admin key for the admin API");
    else if (!path)
        snprintf(msg, sizeof msg,
                 "auth is now on (this server had no keys): every request needs a key; the "
                 "server's log says where it wrote an admin key for the admin API "
                 "(admin_key_generated) or why it could not (admin_key_failed); agents "
                 "without a key are refused from now on: give each an agent key or an "
                 "enrollment token");
    else if (path[0])
        snprintf(msg, sizeof msg,
                 "auth is now on (this server had no keys): every request needs a key; an "
                 "admin key was written to %s (mode 0600): use it for the admin API "
                 "(gpupoolctl --key-file %s); agents without a key are refused from now on: "
                 "give each an agent key or an enrollment token",
                 path, path);
    else
        snprintf(msg, sizeof msg,
                 "auth is now on (this server had no keys) and no admin key could be written: "
                 "make one with `gpupool-server keys create --role admin --db DB` and reload "
                 "the server (SIGHUP)");
    return json_pack("{s:s?,s:s}", "admin_key_file", path && path[0] ? path : NULL, "message",
                     msg);
}

/* The 201 reply of POST /admin/keys, serialized, with auth_turned_on's
 * message as far as it is known before the key exists. NULL on ENOMEM. */
static char *key_reply_text(const gps_key_spec *spec, const char *id, const char *key,
                            bool was_off, json_t **out)
{
    *out = json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:I}", "id", id, "key", key, "role",
                     gps_key_role_name(spec->role), "name", spec->name ? spec->name : "",
                     "expires_at", wall_or_null(spec->expires_at), "limits",
                     limits_json(&spec->limits), "max_uses", (json_int_t)spec->max_uses);
    if (*out && was_off &&
        json_object_set_new(*out, "auth_turned_on", auth_on_json(spec->role, NULL)) < 0) {
        json_decref(*out);
        *out = NULL;
    }
    return *out ? gp_json_dumps(*out) : NULL;
}

/* The reply's auth_turned_on once the hook has left the operator an admin
 * key (or failed to): the reply made before the key existed, with the
 * precise message (where the admin key is). NULL when that cannot be
 * made: the first reply stands, its message true either way. */
static char *key_reply_auth_on(gps_admin *a, json_t *out)
{
    char path[1100] = "";
    if (!a->auth_on || a->auth_on(a->auth_on_arg, path, sizeof path) != 0)
        path[0] = '\0';
    json_t *on = auth_on_json(GPS_KEY_CLIENT, path); /* (any role but admin) */
    if (!on || json_object_set_new(out, "auth_turned_on", on) < 0)
        return NULL;
    return gp_json_dumps(out);
}

char *gps_admin_key_create(gps_admin *a, const gps_key_spec *spec, const char *by,
                           const char *correlation_id)
{
    char key[GPS_AUTH_KEY_LEN + 1] = "", id[GPS_AUTH_ID_LEN + 1] = "";
    json_t *out = NULL;
    char *text = NULL;
    bool was_off = !gps_auth_enabled(a->auth);
    /* Everything that can fail comes before the commit, so that no key
     * exists that this reply does not carry (its secret is shown here
     * only). Undoing instead (a revoke) would leave the revoked key listed
     * and, on a server this key's creation turned auth on, auth on. */
    gps_auth_key *k = gps_auth_key_prepare(spec, key, id);
    if (k)
        text = key_reply_text(spec, id, key, was_off, &out);
    if (!text)
        goto done;
    gps_auth_key_commit(a->auth, k);
    k = NULL;
    /* Logged by id only: the raw key is in this reply and nowhere else. */
    gp_log_write(GP_LOG_INFO, "admin_key_created", correlation_id,
                 json_pack("{s:s,s:s,s:s}", "key_id", id, "role", gps_key_role_name(spec->role),
                           "by", by ? by : ""),
                 "admin created %s key %s", gps_key_role_name(spec->role), id);
    /* The first key of a loopback server turns auth on: from the next
     * request on, this operator (who has no key) would be locked out. Leave
     * an admin key in the state dir and say where. */
    if (was_off && spec->role != GPS_KEY_ADMIN) {
        char *precise = key_reply_auth_on(a, out);
        if (precise) {
            explicit_bzero(text, strlen(text));
            free(text);
            text = precise;
        }
    }
done:
    gps_auth_key_discard(k);
    json_decref(out);
    explicit_bzero(key, sizeof key);
    return text;
}

static void h_keys_create(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    gps_key_spec spec;
    char msg[256], *text = NULL;
    const char *param = NULL;
    if (gps_admin_parse_key_create(body, gp_now_wall_ms(), &spec, msg, sizeof msg, &param) < 0) {
        gps_req_error(r, 400, "INVALID_REQUEST", msg, param);
        goto done;
    }
    text = gps_admin_key_create(a, &spec, r->key_id, r->correlation_id);
    if (!text) {
        oom(r); /* and no key was made */
        goto done;
    }
    gps_http_send_json_text(r->req, 201, text, strlen(text));
    explicit_bzero(text, strlen(text));
    free(text);
done:
    json_decref(body);
}

static void h_keys_patch(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    const gps_auth_key *k = gps_auth_key_find(a->auth, r->params[0]);
    if (!k) {
        gps_req_error(r, 404, "KEY_NOT_FOUND", "no such key", NULL);
        return;
    }
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    gps_key_limits l = k->limits;
    char msg[256];
    const char *param = NULL;
    if (gps_admin_parse_limits(body, &l, msg, sizeof msg, &param) < 0) {
        gps_req_error(r, 400, "INVALID_REQUEST", msg, param);
    } else if (gps_auth_key_set_limits(a->auth, r->params[0], &l) != 0) {
        gps_req_error(r, 404, "KEY_NOT_FOUND", "no such key", NULL);
    } else {
        gp_log_write(GP_LOG_INFO, "admin_key_limits", r->correlation_id,
                     json_pack("{s:s,s:I,s:I,s:I}", "key_id", r->params[0], "rpm",
                               (json_int_t)l.rpm, "tokens_per_day", (json_int_t)l.tokens_per_day,
                               "max_concurrent", (json_int_t)l.max_concurrent),
                     "admin changed the limits of key %s", r->params[0]);
        /* set_limits changed the cached key in place: k shows the new limits. */
        send_json_or_oom(r, 200, key_json(a, k, gp_now_wall_ms()));
    }
    json_decref(body);
}

static void h_keys_delete(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    const gps_auth_key *k = gps_auth_key_find(a->auth, r->params[0]);
    if (!k) {
        gps_req_error(r, 404, "KEY_NOT_FOUND", "no such key", NULL);
        return;
    }
    /* Revoking twice is not an error: the key stays revoked (the first
     * revocation time is kept). */
    if (!k->revoked_at && gps_auth_key_revoke(a->auth, r->params[0]) == 0)
        gp_log_write(GP_LOG_INFO, "admin_key_revoked", r->correlation_id,
                     json_pack("{s:s,s:s}", "key_id", r->params[0], "by", r->key_id),
                     "admin revoked key %s", r->params[0]);
    send_json_or_oom(r, 200, json_pack("{s:s,s:b}", "id", r->params[0], "revoked", 1));
}

/* ------------------------------------------------------------------ */
/* Agents                                                              */
/* ------------------------------------------------------------------ */

/* A model's aliases, whole or NULL (out of memory). */
static json_t *aliases_json(const registry_model_info *m)
{
    json_t *aliases = json_array();
    for (size_t k = 0; aliases && k < m->n_aliases; k++)
        if (json_array_append_new(aliases, json_string(m->aliases[k])) < 0) {
            json_decref(aliases);
            return NULL;
        }
    return aliases;
}

/* An agent as the admin API shows it, whole or NULL (out of memory): a
 * label, a model or an alias left out would read as the agent not having
 * it. Each set and append takes its value, NULL included, and json_pack
 * refuses a NULL "o" (taking the others), so a failure anywhere below
 * reaches the result. */
static json_t *agent_json(const registry_agent *ag, uint64_t now_mono, int64_t now_wall)
{
    json_t *labels = json_object();
    for (size_t i = 0; labels && i < ag->n_labels; i++)
        if (json_object_set_new(labels, ag->labels[i].key, json_string(ag->labels[i].value)) <
            0) {
            json_decref(labels);
            labels = NULL;
        }
    json_t *models = json_array();
    for (size_t i = 0; models && i < ag->n_models; i++) {
        const registry_model_info *m = &ag->models[i];
        if (json_array_append_new(
                models, json_pack("{s:s,s:o,s:o,s:o,s:I,s:I,s:b}", "id", m->id, "aliases",
                                  aliases_json(m), "quantization", str_or_null(m->quantization),
                                  "architecture", str_or_null(m->architecture),
                                  "context_length", (json_int_t)m->context_length, "vram_bytes",
                                  (json_int_t)m->vram_bytes, "loaded", m->loaded)) < 0) {
            json_decref(models);
            models = NULL;
        }
    }
    /* GPUs as the registry keeps them (hw_facts.h: known fields only). */
    json_t *gpus = hw_facts_gpus_json(&ag->hw);
    /* The registry keeps monotonic times; report wall clock. */
    int64_t last_seen = now_wall - (int64_t)(now_mono - ag->last_seen_ms);
    int64_t registered = now_wall - (int64_t)(now_mono - ag->registered_ms);
    int64_t since = now_wall - (int64_t)(now_mono - ag->state_since_ms);
    json_t *o = json_pack(
        "{s:s,s:o,s:s,s:o,s:o,s:o,s:o,s:o,s:i,s:i,s:i,s:f,s:I,s:I,s:I,s:i,s:I,s:I,s:f,s:b,s:b}",
        "id", ag->id, "name", str_or_null(ag->name), "state", registry_state_name(ag->state),
        "version", str_or_null(ag->version), "platform", str_or_null(ag->platform), "labels",
        labels, "gpus", gpus, "models", models, "slots_total", ag->slots_total, "slots_busy",
        ag->slots_busy, "queue_depth", ag->queue_depth, "kv_cache_utilization",
        ag->kv_cache_utilization, "last_seen", (json_int_t)last_seen, "registered_at",
        (json_int_t)registered, "state_since", (json_int_t)since, "jobs_running", ag->active,
        "jobs_done", (json_int_t)ag->jobs_done, "jobs_failed", (json_int_t)ag->jobs_failed,
        "tokens_per_sec", ag->tokens_per_sec, "admin_drain", ag->admin_drain, "agent_drain",
        ag->agent_drain);
    /* The backend in use, and an agent error (a model it refused to run:
     * docs/protocol.md "Backend and GPUs"). */
    if (o && (json_object_set_new(o, "backend", ag->hw.backend[0] ? json_string(ag->hw.backend)
                                                                   : json_null()) < 0 ||
              json_object_set_new(o, "error", hw_facts_error_json(&ag->hw)) < 0 ||
              json_object_set_new(o, "backend_faults", ag->hw.faults >= 0
                                                           ? json_integer(ag->hw.faults)
                                                           : json_null()) < 0)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

typedef struct agent_list {
    uint64_t now_mono;
    int64_t now_wall;
    json_t *arr;
    bool oom;
    gps_pins *pins;
} agent_list;

static void agent_list_one(void *ud, registry_agent *ag)
{
    agent_list *al = ud;
    json_t *o = al->oom ? NULL : agent_json(ag, al->now_mono, al->now_wall);
    /* Models a pin refused (absent from "models"), with the reason. */
    json_t *refused = al->pins ? gps_pins_refused(al->pins, ag->id) : NULL;
    if (o && json_object_set_new(o, "refused_models",
                                 refused ? json_incref(refused) : json_array()) < 0) {
        json_decref(o);
        o = NULL;
    }
    if (!o || json_array_append_new(al->arr, o) < 0)
        al->oom = true;
}


static void h_agents_list(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    agent_list al = {gp_now_mono_ms(), gp_now_wall_ms(), json_array(), false, a->pins};
    if (al.arr)
        registry_foreach(a->reg, agent_list_one, &al);
    if (!al.arr || al.oom) {
        json_decref(al.arr);
        oom(r);
        return;
    }
    if (sort_objects(al.arr) < 0) {
        json_decref(al.arr);
        oom(r);
        return;
    }
    send_json_or_oom(r, 200, json_pack("{s:o}", "agents", al.arr));
}

static void h_agent_drain(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    registry_agent *ag = registry_get(a->reg, r->params[0]);
    if (!ag) {
        gps_req_error(r, 404, "AGENT_NOT_FOUND", "no such agent", NULL);
        return;
    }
    bool on = true;
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    if (in && evbuffer_get_length(in) > 0) {
        /* Optional body {"on": bool}. */
        json_t *body = gps_req_json(r);
        if (!body)
            return;
        const json_t *v = json_object_get(body, "on");
        if (v && !json_is_boolean(v)) {
            json_decref(body);
            gps_req_error(r, 400, "INVALID_REQUEST", "'on' must be a boolean", "on");
            return;
        }
        if (v)
            on = json_is_true(v);
        json_decref(body);
    }
    uint64_t now = gp_now_mono_ms();
    registry_set_drain(a->reg, ag, on, now);
    gp_log_write(GP_LOG_INFO, on ? "admin_agent_drain" : "admin_agent_undrain",
                 r->correlation_id, json_pack("{s:s,s:s}", "agent_id", ag->id, "by", r->key_id),
                 "admin %s agent %s", on ? "drained" : "undrained", ag->id);
    send_json_or_oom(r, 200, agent_json(ag, now, gp_now_wall_ms()));
}

static void h_agent_delete(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    registry_agent *ag = registry_get(a->reg, r->params[0]);
    if (!ag) {
        gps_req_error(r, 404, "AGENT_NOT_FOUND", "no such agent", NULL);
        return;
    }
    char force[8] = "";
    if (query_refused(r))
        return;
    bool forced = query_get(r, "force", force, sizeof force) &&
                  (strcmp(force, "1") == 0 || strcmp(force, "true") == 0);
    int running = ag->active;
    if (running > 0 && !forced) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "agent has %d running job(s): drain it first, or remove with force=1", running);
        gps_req_error(r, 409, "AGENT_BUSY", msg, NULL);
        return;
    }
    char id[sizeof ag->id];
    snprintf(id, sizeof id, "%s", ag->id);
    /* Out of the scheduler first: a job that the failover below or the
     * move to a fallback places must not land on its parked long-poll
     * (it would sit assigned to an agent that is gone). */
    sched_agent_forget(gps_jobs_sched(a->jobs), ag);
    /* Its jobs go elsewhere (requeue or fail, as for a lost agent), while
     * the registry still knows the agent: failover ends its assignments
     * there. */
    if (running > 0)
        gps_jobs_agent_lost(a->jobs, id, "agent_removed");
    ag = registry_get(a->reg, id);
    if (ag) {
        /* Queued jobs of the models it was the last to serve move to
         * their fallbacks now, not at queue_timeout. */
        gps_jobs_agent_leaving(a->jobs, id);
        /* Again before the registry frees it, so that the scheduler
         * surely holds nothing of it (a no-op when nothing re-added it). */
        sched_agent_forget(gps_jobs_sched(a->jobs), ag);
        registry_remove(a->reg, ag);
    }
    if (a->pins)
        gps_pins_forget(a->pins, id);
    if (a->deploy) /* its replicas move at once: the agent is gone for good */
        gps_deploy_agent_forget(a->deploy, id);
    if (a->store && gps_store_agent_delete(a->store, id) < 0)
        gp_log_warn("admin_agent_delete_failed", "agent %s: the DB row was not deleted", id);
    gp_log_write(GP_LOG_INFO, "admin_agent_removed", r->correlation_id,
                 json_pack("{s:s,s:i,s:b,s:s}", "agent_id", id, "jobs_running", running,
                           "force", forced, "by", r->key_id),
                 "admin removed agent %s", id);
    send_json_or_oom(r, 200, json_pack("{s:s,s:b}", "id", id, "removed", 1));
}

/* ------------------------------------------------------------------ */
/* Jobs                                                                */
/* ------------------------------------------------------------------ */

static json_t *job_live_json(const gps_job *j)
{
    const char *api = gps_job_api(j), *model = gps_job_model(j);
    const char *key_id = gps_job_key_id(j), *agent_id = gps_job_agent_id(j);
    const char *finish = gps_job_finish_reason(j), *error_code = gps_job_error_code(j);
    json_t *o = json_pack(
        "{s:s,s:s,s:s,s:s,s:o,s:o,s:s,s:s,s:i,s:I,s:I,s:I,s:I,s:o,s:o,s:s,s:s,s:b}", "id",
        gps_job_id(j), "api", api ? api : "", "kind", gps_job_kind_name(gps_job_kind_of(j)),
        "model", model ? model : "", "key_id", key_id[0] ? json_string(key_id) : json_null(),
        "agent_id", agent_id[0] ? json_string(agent_id) : json_null(), "status",
        gps_job_state_name(gps_job_state_of(j)), "priority",
        gps_job_priority_of(j) == GPS_PRIO_BATCH ? "batch" : "interactive", "attempts",
        gps_job_attempts(j), "prompt_tokens", (json_int_t)gps_job_prompt_tokens(j),
        "completion_tokens", (json_int_t)gps_job_completion_tokens(j), "queue_ms",
        (json_int_t)gps_job_queue_ms(j), "created_at", (json_int_t)gps_job_created_wall_ms(j),
        "finish_reason", finish[0] ? json_string(finish) : json_null(), "error_code",
        error_code[0] ? json_string(error_code) : json_null(), "correlation_id",
        gps_job_correlation_id(j), "source", "memory", "live", 1);
    /* The affinity key the scheduler used (x_pool_options.session, else user). */
    const char *session = gps_job_session(j) ? gps_job_session(j) : gps_job_user(j);
    if (o && session && json_object_set_new(o, "session", json_string(session)) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* -1 in the store means NULL. */
static json_t *ll_or_null(long long v)
{
    return v >= 0 ? json_integer((json_int_t)v) : json_null();
}

static json_t *job_stored_json(const gps_store_job_info *j)
{
    return json_pack(
        "{s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:s,s:i,s:o,s:o,s:o,s:o,s:o,s:I,s:o,s:o,s:o,s:o,s:s,s:b}",
        "id", j->id, "api", str_or_null(j->api), "kind", str_or_null(j->kind), "model",
        str_or_null(j->model), "key_id", str_or_null(j->key_id), "agent_id",
        str_or_null(j->agent_id), "status", str_or_null(j->status), "priority",
        j->priority == 1 ? "batch" : "interactive", "attempts", j->attempts, "prompt_tokens",
        ll_or_null(j->prompt_tokens), "completion_tokens", ll_or_null(j->completion_tokens),
        "queue_ms", ll_or_null(j->queue_ms), "ttft_ms", ll_or_null(j->ttft_ms), "total_ms",
        ll_or_null(j->total_ms), "created_at", (json_int_t)j->created_at, "finished_at",
        wall_or_null(j->finished_at), "finish_reason", str_or_null(j->finish_reason),
        "error_code", str_or_null(j->error_code), "correlation_id",
        str_or_null(j->correlation_id), "source", "store", "live", 0);
}

/* A reply that waits for the DB thread. It does not point at the admin
 * object: the store may deliver it after the module is gone (at close). */
typedef struct pending {
    gps_db_wait w;                /* w.held.req: NULL once the client left */
    int limit;
    /* GET /admin/jobs/{id}: the job's record (gps_jobs_find_record), taken
     * when the request came, for a row the store does not have (a job run
     * here for another server, a store that lost it). */
    bool has_rec;
    gps_job_state rec_state;
    char rec_id[128], rec_agent[64];
} pending;

static pending *pending_new(gps_req *r)
{
    pending *p = calloc(1, sizeof *p);
    if (p)
        gps_db_wait_start(&p->w, r);
    return p;
}

static void jobs_list_done(void *arg, int status, const gps_store_job_info *jobs, size_t n)
{
    pending *p = arg;
    if (!gps_db_wait_take(&p->w))
        goto done;
    if (status != 0) {
        gps_db_wait_error(&p->w, 500, "INTERNAL", "the request log could not be read");
        goto done;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, job_stored_json(&jobs[i])) < 0) {
            json_decref(arr);
            arr = NULL;
        }
    /* A full page may have more behind it: the cursor is the oldest
     * created_at seen. Jobs created in that same millisecond beyond the
     * page are skipped by the strict "<" (rare; a smaller page is exact). */
    json_t *next = n > 0 && (int)n >= p->limit ? json_integer((json_int_t)jobs[n - 1].created_at)
                                               : json_null();
    json_t *body = arr ? json_pack("{s:o,s:o}", "jobs", arr, "next_before", next) : NULL;
    if (!body) {
        if (!arr)
            json_decref(next);
        gps_db_wait_error(&p->w, 500, "INTERNAL", "out of memory");
        goto done;
    }
    gps_http_send_json(p->w.held.req, 200, body);
done:
    free(p);
}

static void h_jobs_list(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    gps_store_job_filter f;
    char buf[1100], msg[256];
    const char *param = NULL;
    const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(r->req));
    if (gps_admin_parse_job_query(query, &f, buf, sizeof buf, msg, sizeof msg, &param) < 0) {
        gps_req_error(r, 400, "INVALID_REQUEST", msg, param);
        return;
    }
    if (!a->store) {
        gps_req_error(r, 503, "NO_STORE", "the request log is not available", NULL);
        return;
    }
    pending *p = pending_new(r);
    if (!p) {
        oom(r);
        return;
    }
    p->limit = f.limit;
    if (gps_store_jobs_list_async(a->store, &f, jobs_list_done, p) < 0) {
        gps_db_wait_take(&p->w);
        free(p);
        gps_req_error(r, 500, "INTERNAL", "the request log could not be read", NULL);
    }
}

/* A finished job known only by its record: its id, state and agent. */
static json_t *job_record_json(const char *id, gps_job_state state, const char *agent_id)
{
    return json_pack("{s:s,s:s,s:o,s:s,s:b}", "id", id, "status", gps_job_state_name(state),
                     "agent_id", agent_id[0] ? json_string(agent_id) : json_null(), "source",
                     "record", "live", 0);
}

static void job_get_done(void *arg, int status, const gps_store_job_info *j)
{
    pending *p = arg;
    if (!gps_db_wait_take(&p->w))
        goto done;
    json_t *rec = status == 1 && p->has_rec
                      ? job_record_json(p->rec_id, p->rec_state, p->rec_agent)
                      : NULL;
    if (rec)
        gps_http_send_json(p->w.held.req, 200, rec);
    else if (status == 1 && p->has_rec)
        gps_db_wait_error(&p->w, 500, "INTERNAL", "out of memory");
    else if (status == 1)
        gps_db_wait_error(&p->w, 404, "JOB_NOT_FOUND", "no such job");
    else if (status != 0 || !j)
        gps_db_wait_error(&p->w, 500, "INTERNAL", "the request log could not be read");
    else {
        json_t *body = job_stored_json(j);
        if (body)
            gps_http_send_json(p->w.held.req, 200, body);
        else
            gps_db_wait_error(&p->w, 500, "INTERNAL", "out of memory");
    }
done:
    free(p);
}

static void h_job_get(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    gps_job *j = gps_jobs_find(a->jobs, r->params[0]);
    if (j) {
        send_json_or_oom(r, 200, job_live_json(j));
        return;
    }
    gps_job_state st;
    char agent[64];
    bool has_rec = gps_jobs_find_record(a->jobs, r->params[0], &st, agent, sizeof agent);
    if (!a->store && has_rec) {
        send_json_or_oom(r, 200, job_record_json(r->params[0], st, agent));
        return;
    }
    if (!a->store) {
        gps_req_error(r, 404, "JOB_NOT_FOUND", "no such job", NULL);
        return;
    }
    pending *p = pending_new(r);
    if (!p) {
        oom(r);
        return;
    }
    if (has_rec) {
        p->has_rec = true;
        p->rec_state = st;
        snprintf(p->rec_id, sizeof p->rec_id, "%s", r->params[0]);
        snprintf(p->rec_agent, sizeof p->rec_agent, "%s", agent);
    }
    if (gps_store_job_get_async(a->store, r->params[0], job_get_done, p) < 0) {
        gps_db_wait_take(&p->w);
        free(p);
        gps_req_error(r, 500, "INTERNAL", "the request log could not be read", NULL);
    }
}

/* ------------------------------------------------------------------ */
/* Status                                                              */
/* ------------------------------------------------------------------ */

typedef struct slot_sum {
    long long total, busy;
} slot_sum;

static void slot_sum_one(void *ud, registry_agent *ag)
{
    slot_sum *s = ud;
    /* The same count as /metrics' slots_capacity and slots_busy. */
    if (registry_agent_has_slots(ag)) {
        s->total += ag->slots_total;
        s->busy += registry_agent_slots_busy(ag);
    }
}

typedef struct queue_list {
    json_t *obj; /* NULL once a set failed (out of memory) */
} queue_list;

static void queue_one(void *ud, const char *model, size_t interactive, size_t batch)
{
    queue_list *q = ud;
    if (q->obj &&
        json_object_set_new(q->obj, model, json_integer((json_int_t)(interactive + batch))) < 0) {
        json_decref(q->obj);
        q->obj = NULL;
    }
}

/* GET /admin/status, whole or NULL (out of memory): a state's count or a
 * model's queue left out would read as none. */
static json_t *status_json(gps_admin *a)
{
    uint64_t now = gp_now_mono_ms();
    json_t *agents = json_object();
    int bad = !agents;
    for (int s = 0; agents && s < REGISTRY_STATE_COUNT; s++)
        bad += json_object_set_new(agents, registry_state_name((registry_state)s),
                                   json_integer((json_int_t)registry_count_state(
                                       a->reg, (registry_state)s))) < 0;
    bad += agents &&
           json_object_set_new(agents, "total",
                               json_integer((json_int_t)registry_count(a->reg))) < 0;
    if (bad) {
        json_decref(agents);
        agents = NULL; /* (json_pack refuses it below) */
    }
    slot_sum ss = {0, 0};
    registry_foreach(a->reg, slot_sum_one, &ss);
    queue_list q = {json_object()};
    if (q.obj)
        sched_foreach_queue(gps_jobs_sched(a->jobs), queue_one, &q);
    double req, tok, rpm, tps;
    counters_now(a, &req, &tok);
    gps_admin_rate_get(&a->rate, now, req, tok, &rpm, &tps);
    json_t *body = json_pack(
        "{s:s,s:I,s:o,s:{s:I,s:I},s:o,s:I,s:I,s:{s:f,s:f},s:b,s:I}", "version", a->version,
        "uptime_sec", (json_int_t)((now - a->started_ms) / 1000), "agents", agents, "slots",
        "total", (json_int_t)ss.total, "busy", (json_int_t)ss.busy, "queue", q.obj,
        "queued_total", (json_int_t)sched_queued_total(gps_jobs_sched(a->jobs)), "jobs_active",
        (json_int_t)gps_jobs_active(a->jobs), "throughput", "requests_per_min", rpm,
        "tokens_per_sec", tps, "auth", gps_auth_enabled(a->auth), "keys",
        (json_int_t)gps_auth_key_count(a->auth));
    /* The servers sharing the database (server/cluster.h); NULL from the
     * hook is out of memory too. */
    if (body && a->servers &&
        json_object_set_new(body, "servers", a->servers(a->servers_arg)) < 0) {
        json_decref(body);
        return NULL;
    }
    return body;
}

void gps_admin_set_servers_hook(gps_admin *a, gps_admin_servers_fn fn, void *arg)
{
    a->servers = fn;
    a->servers_arg = arg;
}

static void h_status(gps_req *r, void *arg)
{
    send_json_or_oom(r, 200, status_json(arg));
}

json_t *gps_admin_snapshot(gps_admin *a)
{
    agent_list al = {gp_now_mono_ms(), gp_now_wall_ms(), json_array(), false, a->pins};
    if (al.arr)
        registry_foreach(a->reg, agent_list_one, &al);
    if (!al.arr || al.oom || sort_objects(al.arr) < 0) {
        json_decref(al.arr);
        return NULL;
    }
    double req, tok;
    counters_now(a, &req, &tok);
    int64_t now = gp_now_wall_ms();
    json_t *hist = gps_admin_history_json(&a->history, now, req, errors_now(a));
    json_t *status = status_json(a);
    if (!hist || !status) {
        json_decref(al.arr);
        json_decref(hist);
        json_decref(status);
        return NULL;
    }
    json_t *snap = json_pack("{s:o,s:o,s:o,s:f,s:I}", "status", status, "agents", al.arr,
                             "history", hist, "requests_total", req, "time", (json_int_t)now);
    /* The dashboard's deployments table (fleet/deploy.h). */
    if (snap && a->deploy) {
        json_t *deps = gps_deploy_list(a->deploy);
        int rc = deps ? json_object_set(snap, "deployments", json_object_get(deps, "deployments"))
                      : -1;
        json_decref(deps);
        if (rc < 0) {
            json_decref(snap);
            return NULL;
        }
    }
    return snap;
}

/* ------------------------------------------------------------------ */
/* Module                                                              */
/* ------------------------------------------------------------------ */

gps_admin *gps_admin_new(struct event_base *base, gps_auth *auth, gps_limits *limits,
                         registry *reg, gps_jobs *jobs, gps_store *store, const char *version)
{
    gps_admin *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->base = base;
    a->auth = auth;
    a->limits = limits;
    a->reg = reg;
    a->jobs = jobs;
    a->store = store;
    snprintf(a->version, sizeof a->version, "%s", version ? version : "");
    a->started_ms = gp_now_mono_ms();
    a->rate_timer = event_new(base, -1, EV_PERSIST, rate_tick, a);
    struct timeval sec = {1, 0};
    if (!a->rate_timer || event_add(a->rate_timer, &sec) < 0) {
        gps_admin_free(a);
        return NULL;
    }
    rate_tick(-1, 0, a);
    return a;
}

void gps_admin_free(gps_admin *a)
{
    if (!a)
        return;
    if (a->rate_timer)
        event_free(a->rate_timer);
    free(a);
}

/* ------------------------------------------------------------------ */
/* Model pins                                                          */
/* ------------------------------------------------------------------ */

static bool pins_ready(gps_req *r, gps_admin *a)
{
    if (a->pins)
        return true;
    gps_req_error(r, 503, "UNAVAILABLE", "model pins are not available on this server", NULL);
    return false;
}

static void h_pins_list(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (!pins_ready(r, a))
        return;
    json_t *l = gps_pins_list(a->pins);
    send_json_or_oom(r, 200, l ? json_pack("{s:o}", "pins", l) : NULL);
}

/* An admin change of a pin waits for its row's commit (gps_pins_put,
 * gps_pins_remove): the reply is sent from pin_change_done. Like
 * deploy_wait, it does not point at the admin object. */
typedef struct pin_wait {
    gps_db_wait w;
    const char *event;        /* the log line of a change applied: its event, */
    json_t *fields;           /* its fields (owned), */
    char line[400];           /* its text */
    json_t *reply;            /* the 200 body (owned) */
} pin_wait;

/* fields, reply: stolen, also on failure (NULL: out of memory). */
static pin_wait *pin_wait_new(gps_req *r, const char *line, const char *event, json_t *fields,
                              json_t *reply)
{
    pin_wait *p = fields && reply ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        json_decref(fields);
        json_decref(reply);
        return NULL;
    }
    gps_db_wait_start(&p->w, r);
    p->event = event;
    p->fields = fields;
    p->reply = reply;
    snprintf(p->line, sizeof p->line, "%s", line);
    return p;
}

static void pin_wait_free(pin_wait *p)
{
    json_decref(p->fields);
    json_decref(p->reply);
    free(p);
}

static void pin_change_done(void *arg, gps_pins *pins, int rc)
{
    pin_wait *p = arg;
    if (pins && rc == 0) {
        gp_log_write(GP_LOG_INFO, p->event, p->w.corr, p->fields, "%s", p->line);
        p->fields = NULL;
    }
    if (!gps_db_wait_take(&p->w))
        goto done;
    if (!pins) {
        gps_db_wait_error(&p->w, 503, "UNAVAILABLE", "the server is stopping");
    } else if (rc != 0) {
        gps_db_wait_error(&p->w, 500, "INTERNAL",
                          "the change could not be written to the database; nothing changed");
    } else {
        gps_http_send_json(p->w.held.req, 200, p->reply);
        p->reply = NULL;
    }
done:
    pin_wait_free(p);
}

/* The answer to a change gps_pins_put/_remove did not accept (rc != 0:
 * done will not run); p is freed. */
static void pin_refused(gps_req *r, pin_wait *p, int rc)
{
    gps_db_wait_take(&p->w);
    pin_wait_free(p);
    if (rc == 1)
        gps_req_error(r, 404, "PIN_NOT_FOUND", "no pin for that name", "name");
    else if (rc == -2)
        gps_req_error(r, 409, "TOO_MANY_PINS", "the pin table is full (4096 pins)", NULL);
    else if (rc == -4)
        gps_req_error(r, 409, "PIN_BUSY",
                      "another change of this pin is being written to the database; retry",
                      "name");
    else if (rc == -5)
        gps_req_error(r, 500, "INTERNAL",
                      "the change could not be queued for the database; nothing changed", NULL);
    else
        oom(r); /* -1: name and digest were checked, so out of memory */
}

static void h_pins_set(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (!pins_ready(r, a))
        return;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    const char *name = json_string_value(json_object_get(body, "name"));
    const char *sha = json_string_value(json_object_get(body, "sha256"));
    char low[65] = "";
    if (sha && strlen(sha) == 64)
        for (int i = 0; i <= 64; i++)
            low[i] = (char)(sha[i] >= 'A' && sha[i] <= 'F' ? sha[i] + 32 : sha[i]);
    int64_t now = gp_now_wall_ms();
    pin_wait *p = NULL;
    char line[400];
    snprintf(line, sizeof line, "admin pinned %.300s to sha256 %s", name ? name : "", low);
    if (!gps_pins_name_ok(name)) {
        gps_req_error(r, 400, "INVALID_REQUEST",
                      "'name' must be a model id or alias (1 to 256 printable bytes, no spaces)",
                      "name");
    } else if (!gps_pins_sha_ok(low)) {
        gps_req_error(r, 400, "INVALID_REQUEST", "'sha256' must be 64 hex digits", "sha256");
    } else if (!(p = pin_wait_new(
                     r, line, "admin_model_pinned",
                     json_pack("{s:s,s:s,s:s}", "name", name, "sha256", low, "by", r->key_id),
                     json_pack("{s:s,s:s,s:I}", "name", name, "sha256", low, "created_at",
                               (json_int_t)now)))) {
        oom(r);
    } else {
        int rc = gps_pins_put(a->pins, a->store, name, low, now,
                              r->key_id[0] ? r->key_id : NULL, pin_change_done, p);
        if (rc != 0)
            pin_refused(r, p, rc);
    }
    json_decref(body);
}

static void h_pins_delete(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (!pins_ready(r, a))
        return;
    char name[300];
    if (!query_get(r, "name", name, sizeof name) || !gps_pins_name_ok(name)) {
        gps_req_error(r, 400, "INVALID_REQUEST", "'name' query parameter required", "name");
        return;
    }
    char line[400];
    snprintf(line, sizeof line, "admin unpinned %s", name);
    pin_wait *p = pin_wait_new(r, line, "admin_model_unpinned",
                               json_pack("{s:s,s:s}", "name", name, "by", r->key_id),
                               json_pack("{s:s,s:b}", "name", name, "removed", 1));
    if (!p) {
        oom(r);
        return;
    }
    int rc = gps_pins_remove(a->pins, a->store, name, pin_change_done, p);
    if (rc != 0)
        pin_refused(r, p, rc);
}

/* ------------------------------------------------------------------ */
/* Deployments (fleet/deploy.h)                                        */
/* ------------------------------------------------------------------ */

static bool deploy_ready(gps_req *r, gps_admin *a)
{
    if (a->deploy)
        return true;
    gps_req_error(r, 503, "UNAVAILABLE", "deployments are not available on this server", NULL);
    return false;
}

static void h_deploy_list(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (!deploy_ready(r, a))
        return;
    send_json_or_oom(r, 200, gps_deploy_list(a->deploy));
}

static void send_deployment(gps_req *r, gps_admin *a, const char *name, int status)
{
    bool found = false;
    json_t *j = gps_deploy_get(a->deploy, name, &found);
    if (!found)
        gps_req_error(r, 404, "DEPLOYMENT_NOT_FOUND", "no such deployment", NULL);
    else
        send_json_or_oom(r, status, j);
}

static void h_deploy_get(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (deploy_ready(r, a))
        send_deployment(r, a, r->params[0], 200);
}

/* An admin change of a deployment waits for its row's commit
 * (gps_deploy_create and the others): the reply is sent from done. Like
 * pending, it does not point at the admin object. */
typedef struct deploy_wait {
    gps_db_wait w;
    int status;                   /* 201 created, 200 scaled or removed */
    bool removed;
    const char *event, *verb;     /* the log line of a change applied */
    json_t *fields;               /* its fields (owned; NULL: out of memory) */
    char name[160];
} deploy_wait;

/* fields: stolen, also on failure. */
static deploy_wait *deploy_wait_new(gps_req *r, const char *name, int status, const char *event,
                                    const char *verb, json_t *fields)
{
    deploy_wait *p = calloc(1, sizeof *p);
    if (!p) {
        json_decref(fields);
        return NULL;
    }
    gps_db_wait_start(&p->w, r);
    p->status = status;
    p->removed = strcmp(verb, "undeployed") == 0;
    p->event = event;
    p->verb = verb;
    p->fields = fields;
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

static void deploy_wait_free(deploy_wait *p)
{
    json_decref(p->fields);
    free(p);
}

static void deploy_change_done(void *arg, gps_deploy *d, int rc)
{
    deploy_wait *p = arg;
    if (d && rc == 0) {
        gp_log_write(GP_LOG_INFO, p->event, p->w.corr, p->fields, "admin %s %s", p->verb,
                     p->name);
        p->fields = NULL;
        if (!p->removed) /* place now: the reply already says where (or why not) */
            gps_deploy_reconcile(d, gp_now_mono_ms(), gp_now_wall_ms());
    }
    if (!gps_db_wait_take(&p->w))
        goto done;
    if (!d) {
        gps_db_wait_error(&p->w, 503, "UNAVAILABLE", "the server is stopping");
    } else if (rc != 0) {
        gps_db_wait_error(&p->w, 500, "INTERNAL",
                          "the change could not be written to the database; nothing changed");
    } else {
        bool found = false;
        json_t *j = p->removed ? json_pack("{s:s,s:b}", "name", p->name, "removed", 1)
                               : gps_deploy_get(d, p->name, &found);
        if (j)
            gps_http_send_json(p->w.held.req, p->status, j);
        else if (!p->removed && !found) /* (one change of a name at a time: not reached) */
            gps_db_wait_error(&p->w, 404, "DEPLOYMENT_NOT_FOUND", "no such deployment");
        else
            gps_db_wait_error(&p->w, 500, "INTERNAL", "out of memory");
    }
done:
    deploy_wait_free(p);
}

/* The answer to a change gps_deploy_* did not accept (rc != 0: done will
 * not run); p is freed. */
static void deploy_refused(gps_req *r, deploy_wait *p, int rc)
{
    gps_db_wait_take(&p->w);
    deploy_wait_free(p);
    if (rc == 1)
        gps_req_error(r, 404, "DEPLOYMENT_NOT_FOUND", "no such deployment", NULL);
    else if (rc == -2)
        gps_req_error(r, 409, "DEPLOYMENT_EXISTS",
                      "a deployment of that name exists: scale it, or undeploy it first", "name");
    else if (rc == -3)
        gps_req_error(r, 409, "TOO_MANY_DEPLOYMENTS", "the deployment table is full", NULL);
    else if (rc == -4)
        gps_req_error(r, 409, "DEPLOYMENT_BUSY",
                      "another change of this deployment is being written to the database; "
                      "retry", NULL);
    else if (rc == -5)
        gps_req_error(r, 500, "INTERNAL",
                      "the change could not be queued for the database; nothing changed", NULL);
    else
        oom(r);
}

static void h_deploy_create(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (!deploy_ready(r, a))
        return;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    gps_deploy_spec spec;
    char msg[256];
    const char *param = NULL;
    if (gps_deploy_parse(body, &spec, msg, sizeof msg, &param) < 0) {
        gps_req_error(r, 400, "INVALID_REQUEST", msg, param);
        goto done;
    }
    deploy_wait *p = deploy_wait_new(
        r, spec.name, 201, "admin_model_deployed", "deployed",
        json_pack("{s:s,s:s,s:i,s:s}", "name", spec.name, "source", spec.source, "replicas",
                  spec.replicas, "by", r->key_id));
    if (!p) {
        oom(r);
        goto done;
    }
    int rc = gps_deploy_create(a->deploy, &spec, gp_now_wall_ms(),
                               r->key_id[0] ? r->key_id : NULL, deploy_change_done, p);
    if (rc != 0)
        deploy_refused(r, p, rc);
done:
    json_decref(body);
}

static void h_deploy_scale(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (!deploy_ready(r, a))
        return;
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    const json_t *v = json_object_get(body, "replicas");
    deploy_wait *p = NULL;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > GPS_DEPLOY_REPLICAS_MAX) {
        gps_req_error(r, 400, "INVALID_REQUEST", "'replicas' must be an integer from 0 to 256",
                      "replicas");
    } else if (!(p = deploy_wait_new(r, r->params[0], 200, "admin_model_scaled", "scaled",
                                     json_pack("{s:s,s:I,s:s}", "name", r->params[0],
                                               "replicas", json_integer_value(v), "by",
                                               r->key_id)))) {
        oom(r);
    } else {
        int rc = gps_deploy_scale(a->deploy, r->params[0], (int)json_integer_value(v),
                                  deploy_change_done, p);
        if (rc != 0)
            deploy_refused(r, p, rc);
    }
    json_decref(body);
}

static void h_deploy_delete(gps_req *r, void *arg)
{
    gps_admin *a = arg;
    if (!deploy_ready(r, a))
        return;
    deploy_wait *p = deploy_wait_new(r, r->params[0], 200, "admin_model_undeployed",
                                     "undeployed",
                                     json_pack("{s:s,s:s}", "name", r->params[0], "by",
                                               r->key_id));
    if (!p) {
        oom(r);
        return;
    }
    int rc = gps_deploy_remove(a->deploy, r->params[0], deploy_change_done, p);
    if (rc != 0)
        deploy_refused(r, p, rc);
}

void gps_admin_set_deploy(gps_admin *a, gps_deploy *deploy)
{
    a->deploy = deploy;
}

void gps_admin_set_pins(gps_admin *a, gps_pins *pins)
{
    a->pins = pins;
}

void gps_admin_set_auth_on_hook(gps_admin *a, gps_admin_auth_on_fn fn, void *arg)
{
    a->auth_on = fn;
    a->auth_on_arg = arg;
}

int gps_admin_register(gps_http *h, gps_admin *a)
{
    static const struct {
        unsigned methods;
        const char *pattern;
        gps_handler_fn fn;
    } routes[] = {
        {EVHTTP_REQ_GET, "/admin/keys", h_keys_list},
        {EVHTTP_REQ_POST, "/admin/keys", h_keys_create},
        {EVHTTP_REQ_PATCH, "/admin/keys/{id}", h_keys_patch},
        {EVHTTP_REQ_DELETE, "/admin/keys/{id}", h_keys_delete},
        {EVHTTP_REQ_GET, "/admin/agents", h_agents_list},
        {EVHTTP_REQ_POST, "/admin/agents/{id}/drain", h_agent_drain},
        {EVHTTP_REQ_DELETE, "/admin/agents/{id}", h_agent_delete},
        {EVHTTP_REQ_GET, "/admin/jobs", h_jobs_list},
        {EVHTTP_REQ_GET, "/admin/jobs/{id}", h_job_get},
        {EVHTTP_REQ_GET, "/admin/status", h_status},
        {EVHTTP_REQ_GET, "/admin/models/pins", h_pins_list},
        {EVHTTP_REQ_POST, "/admin/models/pins", h_pins_set},
        {EVHTTP_REQ_DELETE, "/admin/models/pins", h_pins_delete},
        {EVHTTP_REQ_GET, "/admin/deployments", h_deploy_list},
        {EVHTTP_REQ_POST, "/admin/deployments", h_deploy_create},
        {EVHTTP_REQ_GET, "/admin/deployments/{id}", h_deploy_get},
        {EVHTTP_REQ_PATCH, "/admin/deployments/{id}", h_deploy_scale},
        {EVHTTP_REQ_DELETE, "/admin/deployments/{id}", h_deploy_delete},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (gps_http_add_route(h, routes[i].methods, routes[i].pattern, GPS_DIALECT_NATIVE,
                               GPS_ROLE_ADMIN, routes[i].fn, a) < 0)
            return -1;
    return 0;
}
