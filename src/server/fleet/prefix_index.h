/*
 * prefix_index: which agents' slots hold which prompt prefixes, for the
 * scheduler's prefix-aware routing (docs/scheduling.md "Prefix routing").
 *
 * Agents advertise, per slot, checkpoints of the prompt chain the slot's
 * K/V holds (gp_prefix.h: units 1, 2, 4, 8, ... and the last). The index
 * maps each advertised checkpoint (kind, n, hash) to the slots that hold
 * it, so that a request's chain finds the slots sharing its longest prefix
 * without looking at every agent: a lookup probes the request's last
 * PIDX_RECENT unit counts (a conversation's previous turns) and its powers
 * of two, deepest first, and visits at most PIDX_VISIT slots per depth.
 *
 * An owner (the scheduler's per-agent state) embeds a pidx_owner and
 * replaces its entries whenever the agent reports new facts. Not
 * thread-safe; no I/O.
 */
#ifndef GPS_PREFIX_INDEX_H
#define GPS_PREFIX_INDEX_H

#include <stdbool.h>
#include <stddef.h>

#include "common/gp_prefix.h"
#include "server/fleet/registry.h"

#define PIDX_RECENT 8   /* request unit counts U, U-1, ..., U-7 are probed */
#define PIDX_VISIT 32   /* slots looked at per probed depth */

typedef struct pidx pidx;
typedef struct pidx_entry pidx_entry;

/* Embedded in the owner; zero it before first use. */
typedef struct pidx_owner {
    pidx_entry *ents;
    size_t n;
} pidx_owner;

pidx *pidx_create(void);
/* Frees the index. Clear every owner first (pidx_owner_clear): their
 * entries point into the index. */
void pidx_destroy(pidx *x);

/* Replace what owner o advertised with prefix's slots (each checkpoint of
 * each slot that has a descriptor). A slot's busy flag is not used: it is
 * stale by the time a job arrives (an agent reports right as a job ends,
 * before the slot is released), and the agent itself puts a job in the
 * free slot with the longest prefix; routing to an agent whose matching
 * slot is busy costs only the prefill policy would have cost. ud is what
 * pidx_route hands back for o's slots. Returns 0 or -1 (ENOMEM: o then
 * advertises nothing). */
int pidx_owner_set(pidx *x, pidx_owner *o, void *ud, const registry_prefix *prefix);
/* Remove everything o advertised. */
void pidx_owner_clear(pidx *x, pidx_owner *o);

/* The slot sharing the longest prefix with req that accept(ctx, ud)
 * takes. A slot matching n units counts only when n >= 2, or when n is the
 * whole chain the slot holds (a conversation's previous turn): a first
 * unit alone is often a system prompt every conversation shares, and must
 * not pull every request to the same agent. Among equal depths the entries
 * rotate (the taken one moves to the back). Returns the units matched and
 * sets *ud_out, or 0 (nothing accepted). */
long pidx_route(pidx *x, const gp_prefix_chain *req, bool (*accept)(void *ctx, void *ud),
                void *ctx, void **ud_out);

/* Entries in the index (for tests and the benchmark). */
size_t pidx_size(const pidx *x);

#endif
