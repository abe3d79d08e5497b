/* poolmeta: x_pool_meta and the x-pool-* headers (see poolmeta.h). */
#include "server/dialects/poolmeta.h"

#include <stdio.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/gp_util.h"

void gps_pool_headers(struct evhttp_request *req, gps_job *job)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    if (job->agent_id[0])
        evhttp_add_header(h, "x-pool-agent", job->agent_id);
    char q[32];
    snprintf(q, sizeof q, "%lld", job->queue_ms);
    evhttp_add_header(h, "x-pool-queue-ms", q);
    snprintf(q, sizeof q, "%d", job->attempts);
    evhttp_add_header(h, "x-pool-attempts", q);
    evhttp_add_header(h, "x-pool-model", job->spec.model);
}

json_t *gps_pool_meta(gps_job *job)
{
    uint64_t now = job->finished_us ? job->finished_us : gp_now_mono_us();
    json_t *meta = json_pack(
        "{s:s,s:s,s:I,s:I,s:i,s:[]}", "agent_id", job->agent_id, "model", job->spec.model,
        "queue_ms", (json_int_t)job->queue_ms, "inference_ms",
        (json_int_t)(job->assigned_us ? (now - job->assigned_us) / 1000 : 0), "attempts",
        job->attempts, "warnings");
    if (meta && job->requested_model) {
        char w[600];
        snprintf(w, sizeof w, "model '%.256s' had no capacity; served by fallback model '%.256s'",
                 job->requested_model, job->spec.model);
        json_array_append_new(json_object_get(meta, "warnings"), json_string(w));
    }
    if (meta && job->model_digest[0])
        json_object_set_new(meta, "model_sha256", json_string(job->model_digest));
    /* The agent's upstream is another pool: how that pool ran it (its own
     * agent, attempts, failovers), nested as the client would see it there. */
    /* Routed to the slot that held this many of the prompt's units (a
     * message each, or 1024-byte blocks): the agent skipped their prefill. */
    if (meta && job->prefix_units > 0)
        json_object_set_new(meta, "prefix_units", json_integer(job->prefix_units));
    if (meta && job->upstream_meta)
        json_object_set(meta, "upstream", job->upstream_meta);
    if (meta && job->continuation_mode)   /* "tokens" | "text" after a failover */
        json_object_set_new(meta, "continuation", json_string(job->continuation_mode));
    return meta;
}

