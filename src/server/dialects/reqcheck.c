/* reqcheck: validation helpers shared by every dialect (see reqcheck.h). */
#include "server/dialects/reqcheck.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "common/gp_json.h"
#include "common/gp_util.h"
#include "server/http/http.h"

bool gps_absent(const json_t *v)
{
    return v == NULL || json_is_null(v);
}

int gps_parse_oom(char *msg, size_t msglen)
{
    snprintf(msg, msglen, "out of memory");
    return GPS_PARSE_OOM;
}

int gps_strdup_msg(const char *s, char **out, char *msg, size_t msglen)
{
    *out = strdup(s);
    return *out ? 0 : gps_parse_oom(msg, msglen);
}

int gps_parse_refusal(int rc, const char **code)
{
    bool oom = rc == GPS_PARSE_OOM;
    *code = oom ? "INTERNAL" : "INVALID_REQUEST";
    return oom ? 500 : 400;
}

static bool type_in(const char *type, const char *const *types)
{
    for (; type && *types; types++)
        if (strcmp(type, *types) == 0)
            return true;
    return false;
}

int gps_content_text(const json_t *c, const char *field, const char *const *types, char **out,
                     char *msg, size_t msglen)
{
    *out = NULL;
    if (json_is_string(c))
        return gps_strdup_msg(json_string_value(c), out, msg, msglen);
    if (!json_is_array(c)) {
        snprintf(msg, msglen, "%s.content must be a string or an array of text parts", field);
        return -1;
    }
    gp_buf b;
    gp_buf_init(&b);
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (!type_in(type, types) || !json_is_string(text)) {
            snprintf(msg, msglen,
                     "%s.content[%zu] must be {\"type\":\"%s\",\"text\":string} (only text "
                     "parts are supported%s%.40s)",
                     field, i, types[0], type ? "; got " : "", type ? type : "");
            gp_buf_free(&b);
            return -1;
        }
        if (gp_buf_append(&b, json_string_value(text), json_string_length(text)) < 0) {
            gp_buf_free(&b);
            return gps_parse_oom(msg, msglen);
        }
    }
    *out = gp_buf_steal(&b);
    return *out ? 0 : gps_strdup_msg("", out, msg, msglen);
}

int gps_check_number(const json_t *body, const char *key, const char *name, double lo,
                     double hi, double *out, char *msg, size_t msglen)
{
    const json_t *v = json_object_get(body, key);
    if (gps_absent(v))
        return 0;
    if (!json_is_number(v)) {
        snprintf(msg, msglen, "%s must be a number between %g and %g", name, lo, hi);
        return -1;
    }
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) {
        snprintf(msg, msglen, "%s must be a number between %g and %g (got %g)", name, lo, hi, x);
        return -1;
    }
    *out = x;
    return 0;
}

int gps_stop_parse(const json_t *stop, size_t max, json_t **out, char *msg, size_t msglen)
{
    *out = NULL;
    if (gps_absent(stop))
        return 0;
    if (!json_is_string(stop) && !(json_is_array(stop) && json_array_size(stop) <= max)) {
        snprintf(msg, msglen, "'stop' must be a string or an array of at most %zu strings", max);
        return -1;
    }
    json_t *a = json_array();
    if (!a)
        return gps_parse_oom(msg, msglen);
    /* The string by reference (jansson does not change it). A sequence
     * lost here would let the reply run past it. */
    int rc = json_is_string(stop) ? json_array_append(a, (json_t *)stop)
                                  : json_array_extend(a, (json_t *)stop);
    if (rc < 0) {
        json_decref(a);
        return gps_parse_oom(msg, msglen);
    }
    size_t i;
    json_t *e;
    json_array_foreach(a, i, e)
    {
        if (!json_is_string(e) || json_string_length(e) == 0 ||
            json_string_length(e) > GPS_MAX_STOP_LEN) {
            if (json_is_string(stop))
                snprintf(msg, msglen, "'stop' must be a string of 1 to %d bytes",
                         GPS_MAX_STOP_LEN);
            else
                snprintf(msg, msglen, "stop[%zu] must be a string of 1 to %d bytes", i,
                         GPS_MAX_STOP_LEN);
            json_decref(a);
            return -1;
        }
    }
    *out = a;
    return 0;
}

int gps_sampling_parse(const json_t *body, gps_job_spec *s, double temp_max, size_t max_stop,
                       char *msg, size_t msglen, const char **param)
{
    int rc = -1;
    /* The checks write msg themselves: name the field and leave. */
    *param = "temperature";
    if (gps_check_number(body, "temperature", "'temperature'", 0, temp_max, &s->temperature, msg,
                         msglen) < 0)
        goto fail;
    *param = "top_p";
    if (gps_check_number(body, "top_p", "'top_p'", 0, 1, &s->top_p, msg, msglen) < 0)
        goto fail;
    *param = NULL;
    const json_t *tk = json_object_get(body, "top_k");
    if (!gps_absent(tk)) {
        if (!json_is_integer(tk) || json_integer_value(tk) < 0 || json_integer_value(tk) > 1000000)
            GPS_FAIL("top_k", "'top_k' must be a non-negative integer");
        s->top_k = json_integer_value(tk);
    }
    *param = "stop";
    GPS_TRY(gps_stop_parse(json_object_get(body, "stop"), max_stop, &s->stop, msg, msglen));
    *param = NULL;
    return 0;
fail:
    /* Running out of memory is no fault of the field: name none, as every
     * other out-of-memory refusal does. */
    if (rc == GPS_PARSE_OOM)
        *param = NULL;
    return rc;
}

void gps_spec_defaults(gps_job_spec *s, const char *api)
{
    s->api = api;
    s->temperature = 1.0;
    s->top_p = 1.0;
    s->priority = GPS_PRIO_INTERACTIVE;
}

int gps_seed_parse(const json_t *v, gps_job_spec *s)
{
    if (gps_absent(v))
        return 0;
    if (!json_is_integer(v))
        return -1;
    s->seed = json_integer_value(v);
    s->has_seed = true;
    return 0;
}

int gps_priority_parse(const json_t *v, gps_job_priority *out)
{
    if (gps_absent(v))
        return 0;
    const char *s = json_string_value(v);
    if (s && strcmp(s, "interactive") == 0)
        *out = GPS_PRIO_INTERACTIVE;
    else if (s && strcmp(s, "batch") == 0)
        *out = GPS_PRIO_BATCH;
    else
        return -1;
    return 0;
}

int gps_pool_options_parse(const json_t *xo, gps_job_spec *s, char *msg, size_t msglen,
                           const char **param)
{
    int rc = -1;
    *param = NULL;
    if (gps_absent(xo))
        return 0;
    if (!json_is_object(xo))
        GPS_FAIL("x_pool_options", "'x_pool_options' must be an object");
    if (gps_priority_parse(json_object_get(xo, "priority"), &s->priority) < 0)
        GPS_FAIL("x_pool_options.priority",
                 "'x_pool_options.priority' must be \"interactive\" or \"batch\"");
    const json_t *pa = json_object_get(xo, "prefer_agent");
    if (!gps_absent(pa)) {
        if (!json_is_string(pa) || json_string_length(pa) == 0 ||
            json_string_length(pa) > 256)
            GPS_FAIL("x_pool_options.prefer_agent",
                 "'x_pool_options.prefer_agent' must be a string of 1 to 256 bytes");
        s->prefer_agent = strdup(json_string_value(pa));
        if (!s->prefer_agent)
            GPS_FAIL_OOM();
    }
    const json_t *se = json_object_get(xo, "session");
    if (!gps_absent(se)) {
        if (!json_is_string(se) || json_string_length(se) == 0 ||
            json_string_length(se) > 256)
            GPS_FAIL("x_pool_options.session",
                 "'x_pool_options.session' must be a string of 1 to 256 bytes");
        /* Over a dialect's own affinity key (the native session_id): the
         * pool option is the more specific of the two. */
        free(s->session);
        s->session = strdup(json_string_value(se));
        if (!s->session)
            GPS_FAIL_OOM();
    }
    const json_t *tn = json_object_get(xo, "tenant");
    if (!gps_absent(tn)) {
        /* A downstream pool's tenant tag (its agent passes it on): only
         * narrows this key's prompt-prefix tenant (jobs_submit.c tenant_of). */
        if (!json_is_string(tn) || json_string_length(tn) == 0 ||
            json_string_length(tn) > 64)
            GPS_FAIL("x_pool_options.tenant",
                 "'x_pool_options.tenant' must be a string of 1 to 64 bytes");
        free(s->tenant_sub);
        s->tenant_sub = strdup(json_string_value(tn));
        if (!s->tenant_sub)
            GPS_FAIL_OOM();
    }
    const json_t *lb = json_object_get(xo, "labels");
    if (!gps_absent(lb)) {
        if (!json_is_object(lb) || json_object_size(lb) > 16)
            GPS_FAIL("x_pool_options.labels",
                 "'x_pool_options.labels' must be an object of at most 16 string values");
        s->labels = calloc(json_object_size(lb) ? json_object_size(lb) : 1,
                           sizeof *s->labels);
        if (!s->labels)
            GPS_FAIL_OOM();
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)lb, k, v)
        {
            if (!json_is_string(v) || strlen(k) > 256 || json_string_length(v) > 256)
                GPS_FAIL("x_pool_options.labels",
                     "'x_pool_options.labels': keys and values must be strings of at most 256 "
                     "bytes (at '%.64s')",
                     k);
            s->labels[s->n_labels].key = strdup(k);
            s->labels[s->n_labels].value = strdup(json_string_value(v));
            s->n_labels++; /* counted first: the clear frees what was copied */
            /* A constraint lost would let the job run where it must not. */
            if (!s->labels[s->n_labels - 1].key || !s->labels[s->n_labels - 1].value)
                GPS_FAIL_OOM();
        }
    }
    const json_t *fo = json_object_get(xo, "failover");
    if (!gps_absent(fo)) {
        const char *fs = json_string_value(fo);
        if (fs && strcmp(fs, "continue") == 0)
            s->failover = GPS_FAILOVER_CONTINUE;
        else if (fs && strcmp(fs, "restart") == 0)
            s->failover = GPS_FAILOVER_RESTART;
        else if (fs && strcmp(fs, "error") == 0)
            s->failover = GPS_FAILOVER_ERROR;
        else
            GPS_FAIL("x_pool_options.failover", "'x_pool_options.failover' must be \"continue\", "
                                            "\"restart\" or \"error\"");
    }
    const json_t *fm = json_object_get(xo, "fallback_models");
    if (!gps_absent(fm)) {
        if (!json_is_array(fm) || json_array_size(fm) > GPS_MAX_FALLBACK_MODELS)
            GPS_FAIL("x_pool_options.fallback_models",
                 "'x_pool_options.fallback_models' must be an array of at most %d model names",
                 GPS_MAX_FALLBACK_MODELS);
        size_t i;
        json_t *v;
        json_array_foreach(fm, i, v)
        {
            if (!json_is_string(v) || json_string_length(v) == 0 ||
                json_string_length(v) > GPS_MAX_MODEL_NAME)
                GPS_FAIL("x_pool_options.fallback_models",
                     "'x_pool_options.fallback_models[%zu]' must be a non-empty string of at "
                     "most %d bytes",
                     i, GPS_MAX_MODEL_NAME);
            s->fallback_models[s->n_fallback] = strdup(json_string_value(v));
            if (!s->fallback_models[s->n_fallback])
                GPS_FAIL_OOM();
            s->n_fallback++;
        }
    }
    return 0;
fail:
    return rc;
}

int gps_pool_options_merge_header(json_t *body, const char *header, char *msg, size_t msglen)
{
    if (!header)
        return 0;
    json_error_t je;
    /* (checked: jansson alone words most of its allocation failures as a
     * syntax error, 400 for a valid header, or changes a string) */
    json_t *h = gp_json_load_checked(header, strlen(header), JSON_REJECT_DUPLICATES, &je);
    if (!h && json_error_code(&je) == json_error_out_of_memory)
        return gps_parse_oom(msg, msglen);
    if (!json_is_object(h)) {
        snprintf(msg, msglen, "the X-Pool-Options header must be a JSON object (%s)",
                 h ? "not an object" : je.text);
        json_decref(h);
        return -1;
    }
    json_t *xo = json_object_get(body, "x_pool_options");
    /* Options dropped here would run the job other than the client asked. */
    if (gps_absent(xo)) {
        if (json_object_set_new(body, "x_pool_options", h) < 0)
            return gps_parse_oom(msg, msglen);
        return 0;
    }
    if (!json_is_object(xo)) {
        json_decref(h);
        snprintf(msg, msglen, "'x_pool_options' must be an object");
        return -1;
    }
    int rc = gp_json_update_missing(xo, h);
    json_decref(h);
    if (rc < 0)
        return gps_parse_oom(msg, msglen);
    return 0;
}

json_t *gps_req_job_json(struct gps_req *r)
{
    json_t *body = gps_req_json(r);
    if (!body)
        return NULL;
    /* The body is parsed: its bytes (in libevent's read chunks) need not
     * stay for the stream's whole life (issue 24 item 4: RSS per stream). */
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    if (in)
        evbuffer_drain(in, evbuffer_get_length(in));
    char msg[256];
    int rc = gps_pool_options_merge_header(body, gps_req_header(r, "X-Pool-Options"), msg,
                                           sizeof msg);
    if (rc < 0) {
        json_decref(body);
        const char *code;
        int status = gps_parse_refusal(rc, &code);
        gps_req_error(r, status, code, msg, rc == GPS_PARSE_OOM ? NULL : "x_pool_options");
        return NULL;
    }
    return body;
}
