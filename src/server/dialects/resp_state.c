/* resp_state: stored Responses (see resp_state.h). */
#include "server/dialects/resp_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/http/held.h"

struct gps_resp_state {
    gps_store *store;
    int64_t ttl_ms;
    int keep_per_key;
};

gps_resp_state *gps_resp_state_new(gps_store *st, int ttl_sec, int keep_per_key)
{
    gps_resp_state *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->store = st;
    s->ttl_ms = (int64_t)ttl_sec * 1000;
    s->keep_per_key = keep_per_key;
    return s;
}

void gps_resp_state_free(gps_resp_state *s)
{
    free(s);
}

/* ------------------------------------------------------------------ */
/* Fetch: the previous response, then the referenced items             */
/* ------------------------------------------------------------------ */

typedef struct fetch {
    gps_resp_state *s;
    char key_id[65];
    json_t *refs;            /* owned copy, or NULL */
    json_t *prev_context;    /* owned, or NULL */
    gps_resp_state_fn done;
    void *arg;
} fetch;

static void fetch_end(fetch *f, int status, json_t *items)
{
    f->done(f->arg, status, status == 0 ? f->prev_context : NULL, items);
    json_decref(f->prev_context);
    json_decref(f->refs);
    free(f);
}

/* Stored text as JSON. The store holds only what this server dumped
 * (gps_resp_render, gps_resp_context_text: valid JSON), so a text that
 * does not load is out of memory; the checked load also refuses a tree
 * built while an allocation failed (jansson 2.14 can drop a byte of a long
 * string and succeed: a stored message or object quietly changed). */
static json_t *load_stored(const char *text)
{
    return gp_json_load_checked(text, strlen(text), 0, NULL);
}

int gps_resp_state_items_load(const gps_store_cells *res, json_t **items)
{
    *items = json_object();
    if (!*items)
        return -2;
    for (size_t i = 0; i < res->nrows; i++) {
        const char *id = res->cell[i * res->ncols];
        const char *msg = res->cell[i * res->ncols + 1];
        json_t *m = msg ? load_stored(msg) : NULL;
        /* Leaving an item out would refuse the request as naming no
         * stored item (400) where the server ran out of memory. */
        if ((msg && !m) ||
            (id && json_is_object(m) && json_object_set_new(*items, id, m) < 0)) {
            json_decref(*items);
            *items = NULL;
            return -2;
        }
        if (!id || !json_is_object(m))
            json_decref(m);
    }
    return 0;
}

static void items_done(void *arg, int status, const gps_store_cells *res)
{
    fetch *f = arg;
    json_t *items = NULL;
    if (status != 0) {
        fetch_end(f, -1, NULL);
        return;
    }
    int rc = gps_resp_state_items_load(res, &items);
    fetch_end(f, rc, items);
    json_decref(items);
}

static void fetch_items(fetch *f)
{
    if (!f->refs) {
        json_t *none = json_object();
        fetch_end(f, none ? 0 : -2, none);
        json_decref(none);
        return;
    }
    if (gps_store_response_items_async(f->s->store, f->key_id, f->refs, gp_now_wall_ms(),
                                       items_done, f) < 0)
        fetch_end(f, -1, NULL);
}

int gps_resp_state_prev_load(const gps_store_cells *res, json_t **ctx)
{
    const char *text = res->nrows ? res->cell[1] : NULL;
    *ctx = text ? load_stored(text) : NULL;
    if (text && !*ctx)
        return -2; /* found, not loaded: out of memory, not "not found" */
    if (!json_is_array(*ctx)) {
        json_decref(*ctx);
        *ctx = NULL;
        return 1;
    }
    return 0;
}

static void prev_done(void *arg, int status, const gps_store_cells *res)
{
    fetch *f = arg;
    if (status != 0) {
        fetch_end(f, -1, NULL);
        return;
    }
    int rc = gps_resp_state_prev_load(res, &f->prev_context);
    if (rc != 0) {
        fetch_end(f, rc, NULL);
        return;
    }
    fetch_items(f);
}

int gps_resp_state_fetch(gps_resp_state *s, const char *key_id, const gps_resp_req *rq,
                         gps_resp_state_fn done, void *arg)
{
    if (!s->store)
        return -1;
    fetch *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->s = s;
    snprintf(f->key_id, sizeof f->key_id, "%s", key_id);
    f->refs = rq->refs ? json_deep_copy(rq->refs) : NULL;
    f->done = done;
    f->arg = arg;
    if ((rq->refs && !f->refs) ||
        (rq->prev_id && gps_store_response_get_async(s->store, rq->prev_id, key_id,
                                                     gp_now_wall_ms(), prev_done, f) < 0)) {
        json_decref(f->refs);
        free(f);
        return -1;
    }
    if (!rq->prev_id)
        fetch_items(f);
    return 0;
}

void gps_resp_state_save(gps_resp_state *s, const char *key_id, const char *id,
                         const gp_buf *object, const gp_buf *context, const gp_buf *items)
{
    if (!s->store || !object->len || !context->len)
        return;
    int64_t now = gp_now_wall_ms();
    gps_store_response_row row = {
        .id = id,
        .key_id = key_id,
        .created_at = now,
        .expires_at = now + s->ttl_ms,
        .object_text = object->data,
        .object_len = object->len,
        .context_text = context->data,
        .context_len = context->len,
        .items_text = items->data,
        .items_len = items->len,
        .keep_per_key = s->keep_per_key,
    };
    if (gps_store_response_put(s->store, &row) < 0)
        gp_log_warn("response_store_failed", "response %s was not stored (store queue full)",
                    id);
}

void gps_resp_state_purge(gps_resp_state *s)
{
    if (s->store)
        gps_store_purge_responses(s->store, gp_now_wall_ms());
}

/* ------------------------------------------------------------------ */
/* GET and DELETE /v1/responses/{id}                                   */
/* ------------------------------------------------------------------ */

/* A reply waiting for the DB thread. */
typedef struct pending {
    gps_db_wait w;            /* w.held.req: NULL once the client left */
    char id[GPS_ROUTE_PARAM_MAX];
} pending;

int gps_resp_state_object_load(const gps_store_cells *res, json_t **obj)
{
    *obj = NULL;
    if (!res->nrows || !res->cell[0])
        return 1;
    json_error_t err;
    const char *text = res->cell[0];
    *obj = gp_json_load_checked(text, strlen(text), 0, &err);
    if (*obj)
        return 0;
    /* A row that is there but is not JSON was damaged in the store: the
     * server's failure too; its reply says which. */
    return json_error_code(&err) == json_error_out_of_memory ? -2 : -1;
}

static void not_found(pending *p)
{
    char msg[160];
    snprintf(msg, sizeof msg, "Response with id '%.64s' not found.", p->id);
    gps_db_wait_error(&p->w, 404, "NOT_FOUND", msg);
}

static void get_done(void *arg, int status, const gps_store_cells *res)
{
    pending *p = arg;
    if (!gps_db_wait_take(&p->w))
        goto done;
    if (status != 0) {
        gps_db_wait_error(&p->w, 500, "INTERNAL", "stored responses could not be read");
        goto done;
    }
    json_t *obj;
    int rc = gps_resp_state_object_load(res, &obj);
    if (rc > 0)
        not_found(p);
    else if (rc < 0) /* the server's failure, not a response that does not exist */
        gps_db_wait_error(&p->w, 500, "INTERNAL",
                          rc == -2 ? "out of memory" : "the stored response could not be loaded");
    else
        gps_http_send_json(p->w.held.req, 200, obj);
done:
    free(p);
}

static void delete_done(void *arg, int status, const gps_store_cells *res)
{
    pending *p = arg;
    if (!gps_db_wait_take(&p->w))
        goto done;
    if (status != 0) {
        gps_db_wait_error(&p->w, 500, "INTERNAL", "stored responses could not be changed");
        goto done;
    }
    if (res->changes == 0) {
        not_found(p);
        goto done;
    }
    json_t *body = json_pack("{s:s,s:s,s:b}", "id", p->id, "object", "response", "deleted", 1);
    if (body)
        gps_http_send_json(p->w.held.req, 200, body);
    else
        gps_db_wait_error(&p->w, 500, "INTERNAL", "out of memory");
done:
    free(p);
}

static void h_get_or_delete(gps_req *r, void *arg)
{
    gps_resp_state *s = arg;
    bool del = r->method == EVHTTP_REQ_DELETE;
    if (!s->store) {
        gps_req_error(r, 404, "NOT_FOUND", "this server keeps no responses", NULL);
        return;
    }
    pending *p = calloc(1, sizeof *p);
    if (p) {
        gps_db_wait_start(&p->w, r);
        snprintf(p->id, sizeof p->id, "%s", r->params[0]);
    }
    if (!p) {
        gps_req_error(r, 500, "INTERNAL", "out of memory", NULL);
        return;
    }
    int rc = del ? gps_store_response_delete_async(s->store, p->id, r->key_id, delete_done, p)
                 : gps_store_response_get_async(s->store, p->id, r->key_id, gp_now_wall_ms(),
                                                get_done, p);
    if (rc < 0) {
        gps_db_wait_take(&p->w);
        free(p);
        gps_req_error(r, 503, "SERVER_BUSY", "stored responses cannot be reached now", NULL);
    }
}

static const gps_route ROUTES[] = {
    {EVHTTP_REQ_GET, "/v1/responses/{id}", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT,
     h_get_or_delete, NULL},
    {EVHTTP_REQ_DELETE, "/v1/responses/{id}", GPS_DIALECT_OPENAI, GPS_ROLE_CLIENT,
     h_get_or_delete, NULL},
};

int gps_resp_state_register(gps_http *h, gps_resp_state *s)
{
    return gps_http_add_routes(h, ROUTES, sizeof ROUTES / sizeof ROUTES[0], s);
}
