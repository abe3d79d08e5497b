/*
 * resp_state: stored Responses, the store side of `store: true`.
 *
 * A finished response (POST /v1/responses, store not false) is kept per
 * key: its object as the client got it, the conversation through it (chat
 * messages, instructions excluded: OpenAI does not carry them over) and
 * each output item as the chat fragment it stands for. A later request of
 * the same key may then continue it with previous_response_id or refer to
 * an item with {"type":"item_reference","id":...}; GET and DELETE
 * /v1/responses/{id} read and remove it. Another key's responses are 404,
 * exactly like ones that never existed. Rows expire after ttl_sec and a
 * key keeps its newest keep_per_key (the store trims on each save, the
 * hourly purge drops the expired).
 *
 * Everything goes through the store's queue (store.h), so a response is
 * readable by the next request of its client: reads are queued behind the
 * write.
 */
#ifndef GPS_RESP_STATE_H
#define GPS_RESP_STATE_H

#include <jansson.h>

#include "server/dialects/responses.h"
#include "server/http/http.h"
#include "server/store/store.h"

typedef struct gps_resp_state gps_resp_state;

/* st may be NULL (nothing is stored; references are refused). */
gps_resp_state *gps_resp_state_new(gps_store *st, int ttl_sec, int keep_per_key);
void gps_resp_state_free(gps_resp_state *s);

/* Read what rq refers to (rq->prev_id, rq->refs) for key_id. done runs on
 * the loop thread, later, with prev_context (the previous response's
 * conversation, or NULL when rq names none) and items (object of
 * fragments by id; missing ids are absent), both borrowed; status 0, 1
 * when the previous response is not found, -1 on a store error, -2 out of
 * memory (what was found could not be loaded). Returns
 * -1 (done never runs) when nothing could be queued. */
typedef void (*gps_resp_state_fn)(void *arg, int status, json_t *prev_context, json_t *items);
int gps_resp_state_fetch(gps_resp_state *s, const char *key_id, const gps_resp_req *rq,
                         gps_resp_state_fn done, void *arg);

/* The stored rows as the callbacks above load them (exposed for the
 * tests' allocation-failure sweeps). The texts are this server's own
 * dumps, so one that does not load is out of memory (-2): never a
 * previous response "not found" (400), an item left out, or a tree that
 * differs from the text (gp_json_load_checked).
 * prev_load: the previous response's row (cell 1, its conversation): 0
 * with *ctx (an array, new reference), 1 not found (*ctx NULL), -2.
 * items_load: the (id, fragment) rows as an object by id: 0 with *items
 * (new reference), -2 (*items NULL).
 * object_load: GET's row (cell 0, the object): 0 with *obj (new
 * reference), 1 not found, -2, -1 damaged (not JSON); *obj NULL but at 0. */
int gps_resp_state_prev_load(const gps_store_cells *res, json_t **ctx);
int gps_resp_state_items_load(const gps_store_cells *res, json_t **items);
int gps_resp_state_object_load(const gps_store_cells *res, json_t **obj);

/* Keep a finished response: its object, the conversation and items as
 * JSON text (gp_buf, borrowed: gps_resp_render's, gps_resp_context_text's).
 * No-op without a store or an object. */
void gps_resp_state_save(gps_resp_state *s, const char *key_id, const char *id,
                         const gp_buf *object, const gp_buf *context, const gp_buf *items);

/* Hourly: drop expired responses. */
void gps_resp_state_purge(gps_resp_state *s);

/* GET and DELETE /v1/responses/{id} (role client). */
int gps_resp_state_register(gps_http *h, gps_resp_state *s);

#endif
