/*
 * poolmeta: what the pool tells a client about how its job ran, the same
 * in every dialect: the x_pool_meta object of a reply (non-streaming body,
 * last stream event, a task) and the x-pool-* response headers.
 */
#ifndef GPS_POOLMETA_H
#define GPS_POOLMETA_H

#include <stdbool.h>

#include <jansson.h>

#include "server/jobs/jobs.h"

struct evhttp_request;

/* x_pool_meta of a job (new reference): agent_id, model (the model that
 * served), queue_ms, inference_ms (assignment to the end, or to now while
 * it runs), attempts, warnings (a fallback names the model asked for),
 * continuation (after a failover). NULL when there is none to show (see
 * gps_pool_meta_shown) or out of memory: never an object with a part left
 * out. */
json_t *gps_pool_meta(gps_job *job);
/* o with meta as its x_pool_meta (nothing set when meta is NULL: none to
 * show); both references are taken. NULL when o is NULL or out of memory
 * (both released): a whole body is not sent without its x_pool_meta. */
json_t *gps_pool_meta_attach(json_t *o, json_t *meta);
/* Whether the job has an x_pool_meta (its agent id and model are UTF-8):
 * where it has, a NULL from gps_pool_meta means out of memory. */
bool gps_pool_meta_shown(gps_job *job);
/* The same object as compact JSON text appended to out: the bytes
 * gp_json_dump_append writes for gps_pool_meta(job) with extra[0..n_extra)
 * (NUL-terminated strings) appended to its warnings, each unless already
 * there (as a dialect adds its request's warnings), without the tree
 * (issue 24: built only to be dumped, ~8,000 instructions a request).
 * For a finished job (inference_ms is read at the end; while it runs, now
 * moves between two calls). 0 written; 1 nothing written (gps_pool_meta
 * would give NULL: a model or agent id that is not UTF-8); -1 ENOMEM (out
 * as it was). */
struct gp_buf;
int gps_pool_meta_append(struct gp_buf *out, gps_job *job, const char *const *extra,
                         size_t n_extra);
/* The same as x-pool-agent, x-pool-queue-ms, x-pool-attempts and
 * x-pool-model headers on req (before its reply starts). */
void gps_pool_headers(struct evhttp_request *req, gps_job *job);

#endif
