/*
 * hw_facts: what the server keeps of an agent's backend and GPUs from its
 * poll facts (docs/protocol.md "Backend and GPUs"): the backend in use, an
 * agent error (a model it refused to run), device faults, and per GPU the
 * few known figures the dashboard and /metrics show.
 *
 * Bounded by construction: fixed-size struct (at most HW_MAX_GPUS GPUs,
 * names and messages truncated), only known fields; everything else an
 * agent sends stays in its raw facts only. Pure: no I/O. The body must
 * have passed gps_agent_hw_check (types and ranges of the gpus' fields);
 * hw_facts_parse is lenient past that (a field of the wrong type is
 * "unknown").
 */
#ifndef GPS_HW_FACTS_H
#define GPS_HW_FACTS_H

#include <stdbool.h>

#include <jansson.h>

#define HW_MAX_GPUS 16          /* per agent: a box holds at most 8-16 */
#define HW_MAX_GPU_NAME 96
#define HW_MAX_ERROR_CODE 48
#define HW_MAX_ERROR_MESSAGE 512

typedef struct hw_gpu {
    int index;                          /* the agent's device index */
    char name[HW_MAX_GPU_NAME];         /* "" unknown */
    long long vram_total, vram_used;    /* bytes; -1 unknown */
    long long vram_model;               /* bytes this agent's model holds on it; -1 unknown */
    long long vram_free;                /* bytes; -1 unknown */
    double utilization;                 /* 0..1; -1 unknown */
    double temperature;                 /* Celsius; -1000 unknown */
    double power_w;                     /* watts; -1 unknown */
    bool fault;                         /* the agent stopped using it after a device error */
    bool in_use;                        /* the agent's model runs on it */
} hw_gpu;

typedef struct hw_facts {
    char backend[16];                   /* "cuda", "cpu", "openai"; "" not reported */
    char error_code[HW_MAX_ERROR_CODE]; /* agent error; "" none */
    char error_message[HW_MAX_ERROR_MESSAGE];
    long long faults;                   /* device faults since the agent started; -1 unknown */
    hw_gpu gpus[HW_MAX_GPUS];
    int n_gpus;
} hw_facts;

/* Fill out from a poll body (borrowed). Never fails: unknown or bad
 * fields are left unknown, GPUs past HW_MAX_GPUS dropped. */
void hw_facts_parse(const json_t *body, hw_facts *out);
/* The "gpus" array for /admin/agents (and the dashboard): known fields,
 * unknown ones null. New reference (NULL on ENOMEM). */
json_t *hw_facts_gpus_json(const hw_facts *f);
/* {"code","message"} or JSON null. New reference. */
json_t *hw_facts_error_json(const hw_facts *f);

#endif
