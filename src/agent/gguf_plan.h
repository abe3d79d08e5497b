/*
 * gguf_plan: where the gguf backend runs its model (docs/agent.md
 * "Backends, GPUs and slots").
 *
 * From --backend, --devices, --slots, --ctx and --kv-f16 and what the
 * engine says of the box (gpe_gpu_count, gpe_ctx_vram_estimate), decide:
 *
 *   - the backend: cpu, or cuda when a GPU is visible and the model fits
 *     (auto), or cuda or nothing (--backend cuda);
 *   - the engines: on the CPU one; on CUDA one per given GPU the model fits
 *     on (each its own weights, KV cache and decode thread), or, when it
 *     fits on none alone, one engine split by layers over all of them;
 *   - per engine its slots (--slots N spread over the engines, or auto:
 *     as many as fit in free VRAM after a safety margin, at most
 *     GGUF_PLAN_AUTO_SLOTS_MAX) and the context per slot (--ctx, or auto
 *     on a GPU: the model's training context capped at
 *     GGUF_PLAN_AUTO_CTX_MAX).
 *
 * The plan loads the models (one per CUDA engine: the engine places the
 * weights per model) and says in one line why it chose what it did
 * (`why`, logged by the backend). A refusal (--backend cuda and a model
 * that does not fit) is a plan too, with the numbers in `why`: the agent
 * reports it to the server rather than exiting.
 */
#ifndef AGENT_GGUF_PLAN_H
#define AGENT_GGUF_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "agent/agent_config.h"
#include "gpupool/engine.h"

#define GGUF_PLAN_AUTO_SLOTS_MAX 16   /* per engine with --slots auto */
#define GGUF_PLAN_AUTO_CTX_MAX 8192   /* context per slot with --ctx 0 on a GPU */
#define GGUF_PLAN_CPU_SLOTS 1         /* --slots auto on the CPU: today's default */

typedef struct gguf_plan_engine {
    gpe_model *model;               /* owned by the plan until the backend takes it */
    int n_devices;                  /* 0 on the CPU; 1: one GPU; >= 2: layers split */
    int devices[GPE_MAX_DEVICES];   /* CUDA device indexes */
    int n_seq;                      /* its slots */
} gguf_plan_engine;

typedef struct gguf_plan {
    gpe_backend_kind backend;
    int n_ctx;                      /* per slot; 0 = the model's */
    bool kv_f16;
    gguf_plan_engine engines[GPE_MAX_DEVICES];
    int n_engines;
    bool refused;                   /* the model cannot run here: why has the numbers */
    char why[1280];                 /* the choice in one line */
} gguf_plan;

/* Make the plan. Returns GPE_OK (a plan, perhaps refused), or with err the
 * status of a start-up failure: GPE_ERR_NOMEM when memory ran out loading
 * the model (a later try may succeed: the agent exits 1, a deployment
 * retries); else the load's own status (a model that does not load),
 * GPE_ERR_BACKEND (--backend cuda without a usable GPU) or GPE_ERR_ARG (a
 * device that does not exist): the agent exits 2. */
gpe_status gguf_plan_make(const agent_options *o, gguf_plan *out, char *err, size_t errlen);

/* The CPU plan (the fallback of auto when CUDA contexts cannot be made
 * after all). Frees what p held first. GPE_OK, or the load's status with
 * err. */
gpe_status gguf_plan_cpu(const agent_options *o, gguf_plan *p, const char *why, char *err,
                         size_t errlen);

/* Free the models the backend did not take (set to NULL when taken). */
void gguf_plan_free(gguf_plan *p);

/* The context parameters of engine e of the plan (threads, batch). */
gpe_ctx_params gguf_plan_ctx_params(const agent_options *o, const gguf_plan *p, int e,
                                    int n_batch);

#endif
