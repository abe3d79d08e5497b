/*
 * openai_embed: see openai_embed.h.
 */
#include "agent/openai_embed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/gp_json.h"
#include "common/gp_util.h"

#define MAX_DIM 65536                  /* longer vectors are not believed */
#define PROBE_MAX_BODY (4u << 20)      /* the probe's reply: one vector */
#define PROBE_TOTAL_MS 10000L

json_t *oai_embed_request(const char *upstream_model, json_t *job, int *n_inputs, char *err,
                          size_t errlen)
{
    json_t *input = json_object_get(job, "input");
    if (!json_is_array(input) || json_array_size(input) == 0 ||
        json_array_size(input) > 1000000) {
        snprintf(err, errlen, "embeddings job without a non-empty input array");
        return NULL;
    }
    *n_inputs = (int)json_array_size(input);
    json_t *req = json_pack("{s:s,s:O,s:s}", "model", upstream_model, "input", input,
                            "encoding_format", "float");
    if (!req)
        snprintf(err, errlen, "out of memory");
    return req;
}

/* data[] by index into by[n] (each a vector of *dim numbers). 0 or -1. */
static int embed_collect(json_t *data, int n, json_t **by, int *dim, char *err, size_t errlen)
{
    if (!json_is_array(data) || json_array_size(data) != (size_t)n) {
        snprintf(err, errlen, "upstream embeddings reply has %zu vectors for %d inputs",
                 json_array_size(data), n);
        return -1;
    }
    *dim = -1;
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(data, (size_t)i);
        json_t *idx = json_object_get(e, "index");
        /* A server that leaves index out lists the vectors in order. */
        long long k = json_is_integer(idx) ? json_integer_value(idx) : i;
        json_t *v = json_object_get(e, "embedding");
        size_t d = json_array_size(v);
        if (k < 0 || k >= n || by[k]) {
            snprintf(err, errlen, "upstream embeddings reply has a bad or repeated index");
            return -1;
        }
        if (!json_is_array(v) || d == 0 || d > MAX_DIM || (*dim >= 0 && d != (size_t)*dim)) {
            snprintf(err, errlen, "upstream embeddings reply: data[%d].embedding is not a "
                                  "float array of the others' length", i);
            return -1;
        }
        for (size_t x = 0; x < d; x++)
            if (!json_is_number(json_array_get(v, x))) {
                snprintf(err, errlen, "upstream embeddings reply: data[%d].embedding holds a "
                                      "non-number", i);
                return -1;
            }
        by[k] = v;
        *dim = (int)d;
    }
    return 0;
}

int oai_embed_deliver(const char *body, size_t len, int n_inputs, const agent_job_sink *sink,
                      char *err, size_t errlen)
{
    json_error_t je;
    int rc = -1, dim = 0;
    float *vec = NULL;
    json_t *r = gp_json_load_checked(body ? body : "", len, 0, &je);
    json_t **by = calloc((size_t)n_inputs, sizeof *by);
    if (!by || (!r && json_error_code(&je) == json_error_out_of_memory)) {
        snprintf(err, errlen, "the agent ran out of memory while reading the upstream "
                              "embeddings reply");
        rc = -2;
        goto out;
    }
    if (!r) {
        snprintf(err, errlen, "upstream embeddings reply is not JSON (%s)", je.text);
        goto out;
    }
    if (embed_collect(json_object_get(r, "data"), n_inputs, by, &dim, err, errlen) != 0)
        goto out;
    if (!(vec = malloc((size_t)dim * sizeof *vec))) {
        snprintf(err, errlen, "the agent ran out of memory while reading the upstream "
                              "embeddings reply");
        rc = -2;
        goto out;
    }
    json_t *pt = json_object_get(json_object_get(r, "usage"), "prompt_tokens");
    long long prompt_tokens = json_is_integer(pt) && json_integer_value(pt) >= 0
                                  ? json_integer_value(pt)
                                  : 0;
    if (sink->started)
        sink->started(sink->ctx);
    for (int k = 0; k < n_inputs; k++) {
        for (int x = 0; x < dim; x++)
            vec[x] = (float)json_number_value(json_array_get(by[k], (size_t)x));
        if (sink->embedding)
            sink->embedding(sink->ctx, k, vec, dim);
    }
    sink->end(sink->ctx, "stop", prompt_tokens, 0);
    rc = 0;
out:
    free(vec);
    free(by);
    json_decref(r);
    return rc;
}

static size_t probe_write(char *p, size_t sz, size_t nm, void *ud)
{
    gp_buf *buf = ud;
    size_t n = sz * nm;
    if (buf->len + n > PROBE_MAX_BODY || gp_buf_append(buf, p, n) != 0)
        return 0;
    return n;
}

/* CURLOPT_XFERINFOFUNCTION: non-zero aborts the probe (the backend stops). */
static int probe_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    return ud && atomic_load((atomic_bool *)ud) ? 1 : 0;
}

char *oai_embed_probe_body(const char *upstream_model)
{
    json_t *req = json_pack("{s:s,s:[s],s:s}", "model", upstream_model, "input",
                            "gpupool probe", "encoding_format", "float");
    /* gp_json_dumps, not json_dumps: jansson 2.14's can leave a key out
     * ("model", "input") and succeed; the upstream's 4xx for that body
     * would be taken for a no, and embeddings never offered. */
    char *body = req ? gp_json_dumps(req) : NULL;
    json_decref(req);
    return body;
}

oai_embed_probe_result oai_embed_probe(const agent_options *o, const char *url,
                                       const char *auth_header, atomic_bool *stop)
{
    oai_embed_probe_result res = OAI_EMBED_RETRY;
    long status = 0;
    gp_buf buf;
    gp_buf_init(&buf);
    struct curl_slist *h = NULL, *n;
    char *body = oai_embed_probe_body(o->upstream_model);
    CURL *easy = curl_easy_init();
    if (!body || !easy)
        goto out; /* (out of memory: no answer yet, tried again) */
    const char *hdrs[] = {"Content-Type: application/json", "Accept: application/json",
                          "Expect:", auth_header};
    for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++) {
        if (!hdrs[i])
            continue;
        if (!(n = curl_slist_append(h, hdrs[i])))
            goto out;
        h = n;
    }
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, probe_write);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &buf);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long)o->upstream_connect_timeout_sec * 1000);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, PROBE_TOTAL_MS);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "gpupool-agent");
    curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, probe_progress);
    curl_easy_setopt(easy, CURLOPT_XFERINFODATA, stop);
    if (o->ca_file)
        curl_easy_setopt(easy, CURLOPT_CAINFO, o->ca_file);
    if (curl_easy_perform(easy) != CURLE_OK)
        goto out;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 500 && status != 501)
        goto out; /* e.g. llama-server's 503 while it loads its model */
    res = OAI_EMBED_NO;
    if (status == 200) {
        json_error_t je;
        json_t *r = gp_json_load_checked(buf.data ? buf.data : "", buf.len, 0, &je);
        json_t *d0 = json_array_get(json_object_get(r, "data"), 0);
        if (json_array_size(json_object_get(d0, "embedding")) > 0)
            res = OAI_EMBED_YES;
        else if (!r && json_error_code(&je) == json_error_out_of_memory)
            res = OAI_EMBED_RETRY; /* no answer read: not a no */
        json_decref(r);
    }
out:
    if (easy)
        curl_easy_cleanup(easy);
    curl_slist_free_all(h);
    free(body);
    gp_buf_free(&buf);
    return res;
}
