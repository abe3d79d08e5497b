/*
 * gp_prefix: prompt-prefix descriptors that the server and an agent compute
 * alike from a job's JSON, so that the server (which neither renders chat
 * templates nor tokenizes) can tell which agent slot holds the K/V of a
 * request's leading part (docs/protocol.md "Prompt-prefix cache").
 *
 * A job's prompt is a chain of units:
 *   - chat jobs (a "messages" array): one unit per message;
 *   - prompt-text jobs: one unit per whole GP_PREFIX_BLOCK bytes of the
 *     prompt (a partial last block is not a unit: the next turn extends it).
 * h_0 = SHA-256("gpupool-prefix-v1\n" kind "\n" tools), where kind is
 * "messages" or "text" and tools the job's tools array as compact JSON with
 * sorted keys ("null" without tools, or with tool_choice "none"), and
 * when the job has a non-empty "tenant" tag (the server's opaque tag of
 * the API key, docs/protocol.md) one more link h_0 = SHA-256(hex(h_0) "\n"
 * tenant): chains of different tenants never share a hash;
 * h_i = SHA-256(hex(h_{i-1}) "\n" unit_i), a message unit being the message
 * object as compact JSON with sorted keys (jansson's JSON_COMPACT |
 * JSON_SORT_KEYS, the same library on both sides). Hashes travel as the
 * first GP_PREFIX_HEX hex digits: a collision only costs a cache miss.
 *
 * An agent reports, per slot, checkpoints of its chain: units 1, 2, 4, 8, ...
 * and the last one (at most about log2(n) + 2 entries), so a request whose
 * units share a prefix with a slot's matches the largest checkpoint n with
 * the same hash.
 */
#ifndef GP_PREFIX_H
#define GP_PREFIX_H

#include <stddef.h>

#include <jansson.h>

#define GP_PREFIX_BLOCK 1024
#define GP_PREFIX_HEX 16
#define GP_PREFIX_MAX_POINTS 40

typedef char gp_prefix_hash[GP_PREFIX_HEX + 1];

/* A job's whole chain: h_1..h_units. One owner; gp_prefix_chain_free. */
typedef struct gp_prefix_chain {
    char kind[9];                    /* "messages" | "text" */
    long units;
    gp_prefix_hash *h;               /* [units] */
} gp_prefix_chain;

typedef struct gp_prefix_point {
    long n;                          /* units 1..n */
    gp_prefix_hash h;                /* hex prefix of h_n */
} gp_prefix_point;

/* Checkpoints of a chain (what a slot advertises). */
typedef struct gp_prefix_desc {
    char kind[9];                    /* "messages" | "text" | "" (none) */
    long units;                      /* units in the chain */
    gp_prefix_point pts[GP_PREFIX_MAX_POINTS];
    int n_pts;                       /* ascending n, the last one n == units */
} gp_prefix_desc;

/* Chain of a job (borrowed JSON, as /agents/work sends it): kind
 * "messages" when it has a messages array, else "text" over "prompt".
 * Returns 0, or -1 when the job has neither or memory is short (out is
 * then empty; gp_prefix_chain_free is still fine). */
int gp_prefix_chain_of_job(const json_t *job, gp_prefix_chain *out);
void gp_prefix_chain_free(gp_prefix_chain *c);
/* Checkpoints 1, 2, 4, ... and units of a chain (none for 0 units). */
void gp_prefix_desc_of_chain(const gp_prefix_chain *c, gp_prefix_desc *out);
/* New reference: {"kind":..,"units":n,"points":[{"n":..,"h":".."}..]}. */
json_t *gp_prefix_desc_json(const gp_prefix_desc *d);
/* Parse what gp_prefix_desc_json wrote (bounded: at most
 * GP_PREFIX_MAX_POINTS points, n ascending within 1..units, hex of
 * GP_PREFIX_HEX digits). Returns 0 or -1 (out empty). */
int gp_prefix_desc_parse(const json_t *j, gp_prefix_desc *out);
/* Units of a request's chain that a slot's descriptor is known to hold:
 * the largest checkpoint n with req's h_n equal to its hash, or 0. */
long gp_prefix_match(const gp_prefix_chain *req, const gp_prefix_desc *have);

#endif
