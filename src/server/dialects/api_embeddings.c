/* api_embeddings: POST /v1/embeddings as a relayed job (api_embeddings.h). */
#include "server/dialects/api_embeddings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dialects/embeddings.h"
#include "server/dialects/reqcheck.h"
#include "server/fleet/registry.h"
#include "server/http/errors.h"

typedef struct emb_stream {
    gps_relay rl;
    gps_embed_req req;
    json_t *vecs;            /* one slot per input: the agent's base64 vector, or null */
    char model[256];
} emb_stream;

static void stream_free(void *arg)
{
    emb_stream *st = arg;
    gps_relay_clear(&st->rl);
    gps_embed_req_clear(&st->req);
    json_decref(st->vecs);
    free(st);
}

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg);

static const gps_relay_ops OPS = {
    .api = "embeddings",
    .dialect = GPS_DIALECT_OPENAI,
    .error_event = NULL,
    .on_event = on_job_event,
    .free = stream_free,
};

static void on_job_event(gps_job *job, gps_event_type type, json_t *ev, void *arg)
{
    emb_stream *st = arg;
    if (type == GPS_EV_EMBEDDING) {
        json_t *ix = json_object_get(ev, "index"), *e = json_object_get(ev, "embedding");
        if (json_is_integer(ix) && json_integer_value(ix) >= 0 &&
            (size_t)json_integer_value(ix) < json_array_size(st->vecs) && json_is_string(e))
            json_array_set(st->vecs, (size_t)json_integer_value(ix), e);
        return;
    }
    if (type == GPS_EV_ERROR) {
        gps_relay_fail(&st->rl, ev, NULL);
        return;
    }
    if (type != GPS_EV_END)
        return;
    char msg[512];
    const char *param = NULL;
    json_t *body;
    int rc = gps_embed_response(&st->req, st->model, st->vecs, gps_job_prompt_tokens(job),
                                &body, msg, sizeof msg, &param);
    if (rc < 0) {
        /* A refused dimensions is the client's, out of memory the server's,
         * anything else the agent's. */
        const char *code;
        int status = gps_parse_refusal(rc, &code);
        if (!param && status == 400) {
            code = "AGENT_ERROR";
            status = 502;
        }
        json_t *err = json_pack("{s:s,s:s,s:i}", "code", code, "message", msg, "status", status);
        if (err && param)
            json_object_set_new(err, "param", json_string(param));
        gps_relay_fail(&st->rl, err, NULL);
        json_decref(err);
        return;
    }
    gps_relay_end_body(&st->rl, body, true);
}

typedef struct model_ctx {
    const char *model;
    long long ctx;
    int serving, embedding;   /* live agents serving it / of those computing embeddings */
} model_ctx;

/* Of the live agents serving the model: how many, how many compute
 * embeddings (supports_embeddings), and the smallest context length of
 * those (0: unknown). */
static void ctx_cb(void *ud, registry_agent *a)
{
    model_ctx *f = ud;
    if (a->state != REGISTRY_HEALTHY && a->state != REGISTRY_SUSPECT)
        return;
    for (size_t i = 0; i < a->n_models; i++) {
        const registry_model_info *mi = &a->models[i];
        if (!registry_model_info_named(mi, f->model))
            continue;
        f->serving++;
        if (!mi->supports_embeddings)
            break;
        f->embedding++;
        if (mi->context_length > 0 && (f->ctx == 0 || mi->context_length < f->ctx))
            f->ctx = mi->context_length;
        break;
    }
}

static void h_embeddings(gps_req *r, void *arg)
{
    gps_relay_ctx *c = arg;
    json_t *body = gps_req_job_json(r);
    if (!body) {
        gps_relay_count_req(&OPS, c->metrics, r, "invalid_request");
        return;
    }
    model_ctx f = {.model = json_string_value(json_object_get(body, "model"))};
    if (f.model)
        registry_foreach(gps_jobs_registry(c->jobs), ctx_cb, &f);
    char msg[512];
    const char *param = NULL;
    gps_embed_req req;
    int rc = gps_embed_parse(body, f.ctx, &req, msg, sizeof msg, &param);
    json_decref(body);
    if (rc == 0 && f.serving > 0 && f.embedding == 0) {
        /* Served, but by agents that cannot embed (an openai backend, a
         * CUDA gguf agent): say so rather than queue until a timeout. */
        snprintf(msg, sizeof msg, "model '%.200s' is served by no agent that computes "
                 "embeddings (none reports supports_embeddings for it)", req.model);
        param = "model";
        gps_embed_req_clear(&req);
        rc = -1;
    }
    if (rc < 0) {
        const char *code;
        int status = gps_parse_refusal(rc, &code);
        gps_relay_refuse(&OPS, c->metrics, r, status, code, msg, param);
        return;
    }
    emb_stream *st = calloc(1, sizeof *st);
    gps_job_spec spec = {.kind = GPS_JOB_EMBED, .api = "openai", .max_tokens = 1};
    if (st)
        st->vecs = json_array();
    /* One slot per input: a slot missing would shift every later vector. */
    bool slots = st && st->vecs;
    for (size_t i = 0; slots && i < json_array_size(req.input); i++)
        slots = json_array_append_new(st->vecs, json_null()) == 0;
    spec.model = strdup(req.model);
    spec.input = json_incref(req.input);
    spec.user = req.user ? strdup(req.user) : NULL;
    if (!slots || !spec.model || (req.user && !spec.user)) {
        gps_job_spec_clear(&spec);
        gps_embed_req_clear(&req);
        if (st)
            json_decref(st->vecs);
        free(st);
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    st->req = req;
    snprintf(st->model, sizeof st->model, "%s", req.model);
    gps_relay_init(&st->rl, &OPS, st, c->jobs, c->metrics, r);
    gps_job *job = gps_relay_submit(&st->rl, &spec, r, c->request_timeout_sec + 30);
    gps_job_spec_clear(&spec);
    if (!job) {
        stream_free(st);
        return;
    }
    snprintf(st->model, sizeof st->model, "%s", gps_job_model(job));
}

static const gps_route ROUTES[] = {
    {EVHTTP_REQ_POST, "/v1/embeddings", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT, h_embeddings,
     NULL},
};

int gps_embeddings_register(gps_http *h, gps_relay_ctx *c)
{
    return gps_http_add_routes(h, ROUTES, sizeof ROUTES / sizeof ROUTES[0], c);
}
