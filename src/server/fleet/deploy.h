/*
 * deploy: models deployed from the server (issue 27, docs/admin.md
 * "Deployments"). An operator says once "run SOURCE under NAME on R agents
 * that carry these labels"; this module keeps that desired state, places
 * replicas on agents that offer themselves to deployments and have room,
 * tells each agent in its poll reply what it must hold, reads back what it
 * reports (downloading, loading, ready, failed) and moves a replica whose
 * agent stayed gone longer than the grace period. It is a reconciler: the
 * desired state is in the DB (write-through, loaded at start-up), agents
 * converge to it whenever they poll, so a server restart loses nothing.
 *
 * Protocol (docs/protocol.md "Deployments"). An agent that takes
 * deployments adds to its poll:
 *
 *   "deploy": {"capacity": 1, "memory_free": 3221225472, "disk_free": ...,
 *              "models": [{"name": "tiny", "state": "downloading",
 *                          "bytes": 5242880, "total": 10485760, "rate": 1048576,
 *                          "reason": null}]}
 *
 * and the reply to it carries its whole desired set (declarative: what is
 * not listed must go):
 *
 *   "deployments": [{"name": "tiny", "source": "https://...", "sha256": null,
 *                    "bytes": 10485760}]
 *
 * An agent without "deploy" (started with --model or --upstream, or an
 * older agent) is never placed on and gets no "deployments" member; its
 * own models are listed as local ones.
 *
 * Placement (one pass per reconcile, per deployment short of replicas):
 * every agent is considered and either taken or refused with a reason
 * ("not offered to deployments", "not healthy", "labels do not match",
 * "holds N of its capacity N", "failed this deployment before: ...",
 * "does not fit: ..."). Among the agents that fit, the one with the fewest
 * replicas, then the most free memory, wins. A deployment that stays short
 * keeps the last pass's refusals for `models show`.
 *
 * Not thread-safe (the event loop's). Time: now_ms is monotonic, wall
 * times are for the DB and the API.
 */
#ifndef GPS_DEPLOY_H
#define GPS_DEPLOY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "server/fleet/registry.h"

struct gps_store;

#define GPS_DEPLOY_MAX 1024          /* deployments */
#define GPS_DEPLOY_REPLICAS_MAX 256  /* replicas of one deployment */

typedef struct gps_deploy gps_deploy;

/* store may be NULL (no persistence: tests). grace_ms: how long an agent
 * may be gone (dead, offline, unknown) before its replicas move. The
 * registry and store are borrowed and outlive the module. */
gps_deploy *gps_deploy_new(registry *reg, struct gps_store *store, uint64_t grace_ms,
                           uint64_t now_ms);
void gps_deploy_free(gps_deploy *d);

/* A POST /admin/deployments body, checked: {name, source, replicas?
 * (default 1), labels? {k: v}, sha256?, bytes?}. Strings point into body
 * (borrowed). */
typedef struct gps_deploy_spec {
    const char *name, *source;
    const char *sha256;        /* NULL: not checked (lower-cased copy in sha_buf) */
    int replicas;
    const json_t *labels;      /* object or NULL */
    int64_t bytes;             /* 0: unknown until an agent learns it */
    char sha_buf[65];
} gps_deploy_spec;
/* 0, or -1 with msg and *param (static) for a 400. */
int gps_deploy_parse(const json_t *body, gps_deploy_spec *spec, char *msg, size_t msglen,
                     const char **param);

/* Admin changes. With a store, a change is applied to the table only once
 * its row is committed (gps_store_deploy_put_async): until then the table
 * is as it was, and a write that fails leaves it so, the operator told
 * (500) rather than answered with a deployment the database lacks (gone at
 * the next restart). Returns 0 when the change was accepted: done then
 * runs exactly once, later on the loop thread (at once, before the return,
 * without a store), with rc 0 (applied: d is the module) or -1 (the write
 * failed; nothing changed), and d NULL when the module was freed
 * meanwhile (the server stopping; nothing to answer with). done may be
 * NULL. Otherwise, done never runs:
 *   create: -1 ENOMEM, -2 the name exists, -3 the table is full,
 *   scale, remove: 1 no such deployment,
 *   all: -4 another change of that name is being written (retry),
 *        -5 the store refused to queue the write (out of memory, or its
 *        DB thread is gone).
 * A scale forgets failed replicas (the way to retry them). */
typedef void (*gps_deploy_done_fn)(void *arg, gps_deploy *d, int rc);
int gps_deploy_create(gps_deploy *d, const gps_deploy_spec *s, int64_t now_wall,
                      const char *created_by, gps_deploy_done_fn done, void *arg);
int gps_deploy_scale(gps_deploy *d, const char *name, int replicas, gps_deploy_done_fn done,
                     void *arg);
int gps_deploy_remove(gps_deploy *d, const char *name, gps_deploy_done_fn done, void *arg);

/* Start-up load (store rows): the whole table, or -1 with err (the step
 * that failed, or out of memory) and the table left empty: a server must
 * not run with part of its deployments (their agents would be told to
 * unload the rest). A row that is not valid (edited by hand) is skipped
 * and logged. */
int gps_deploy_load(gps_deploy *d, struct gps_store *store, char *err, size_t errlen);

/* Place what is short, drop what is over, move replicas off agents gone
 * for longer than the grace. Cheap enough to call on every tick. */
void gps_deploy_reconcile(gps_deploy *d, uint64_t now_ms, int64_t now_wall);

/* One agent's poll: body is the whole poll body (borrowed; its "deploy"
 * member, if any, is read). 0 with *out the reply's "deployments" array
 * (new reference, whole), or with *out NULL for an agent that does not
 * take deployments (the reply has no such member); -1 out of memory, *out
 * NULL. The agent unloads what the list leaves out, so a list short of one
 * is never handed back: the caller answers 500 and the agent, keeping what
 * it holds, polls again. */
int gps_deploy_agent_poll(gps_deploy *d, const registry_agent *a, const json_t *body,
                          uint64_t now_ms, int64_t now_wall, json_t **out);
/* The agent was removed from the registry (forget its facts; its
 * replicas move at the next reconcile). */
void gps_deploy_agent_forget(gps_deploy *d, const char *agent_id);

/* API views (new references, whole, or NULL on ENOMEM). list:
 * {deployments: [...], local: [{model, agent_id, agent}]} ; get: one
 * deployment, or NULL when there is none (*found false) or out of memory
 * (*found true). */
json_t *gps_deploy_list(const gps_deploy *d);
json_t *gps_deploy_get(const gps_deploy *d, const char *name, bool *found);

#endif
