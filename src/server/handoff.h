/*
 * handoff: a job handed to another server through the shared database
 * (docs/scaling.md "3e. Hand-off of a job to another server", migration
 * 0011). Only on a shared (PostgreSQL) store; a SQLite server never starts
 * it.
 *
 *   models   every models_ms this server writes what its healthy agents
 *            serve (servers.models) and reads what the other live servers
 *            serve; the sweep gives the rows claimed by servers whose lease
 *            ended back (waiting) and cancels the offers of such servers;
 *   offer    (the client's server, A) a job no agent here can take, or
 *            that waits in the queue here, whose model another live server
 *            serves is offered (gps_jobs_handoff hooks): a handoffs row
 *            holding the job's wire object and constraints; the job
 *            stays here with its subscribers and is followed (woken, or
 *            every period_ms): the row's state and the relayed batches,
 *            applied through gps_jobs_apply_events with the claimer's id
 *            as the agent id, from the attempt followed only;
 *   free     every models_ms, at each tick and when a proxy ends, this
 *            server writes what its free ready agents could take now
 *            (servers.free, migration 0013: names, labels, free slots)
 *            when it changed, and notifies gps_handoff_free; the others
 *            read the peers again at once, and offer the jobs still
 *            waiting in their queues that now fit (gps_jobs_offer_queued);
 *   withdraw (A) a job queued here (its model's agents here busy) is
 *            offered too, but only while a live peer's free agent fits it
 *            (its model or a fallback, its labels) and the offers not yet
 *            claimed are fewer than the peers' free slots (else it is
 *            offered once one frees up), and stays in the scheduler;
 *            before an agent here gets it the offer is withdrawn (a delete
 *            of the row while waiting): withdrawn, the agent gets it;
 *            already claimed, the claimer runs it (gps_jobs_offer_withdrawn);
 *   claim    (a server with agents, B) when woken, or every period_ms,
 *            while its ready agents have free slots, a look at the waiting
 *            offers of their models or naming one in their fallbacks (other
 *            servers', with their constraints), then a claim of those a free agent here can
 *            take (SKIP LOCKED): each becomes a local proxy job (same id,
 *            no request-log row, no key accounting, the offer's
 *            constraints) whose events are
 *            written back in fenced batches (every 20 ms or 32 events, the
 *            end at once); a refused batch, or a row no longer claimed by
 *            this server at this attempt (read when woken and every
 *            period_ms while proxies run), cancels the proxy on its agent;
 *   wake-up  each of those steps is woken by the database (LISTEN/NOTIFY,
 *            gps_store_listen): a new offer notifies gps_handoff_offer
 *            (claimers claim), a relayed batch, a claim or a cancel
 *            notifies gps_handoff_job with the job's id (its follower
 *            reads, its claimer checks its rows), each after its write
 *            commits. The period_ms poll stays, slow, for a notification
 *            lost (the listener reconnecting after a database restart).
 *
 * Threading: the loop thread; the store's callbacks come back on it.
 */
#ifndef GPS_HANDOFF_H
#define GPS_HANDOFF_H

#include <event2/event.h>

#include "server/jobs/jobs.h"
#include "server/store/store.h"

typedef struct gps_handoff gps_handoff;

typedef struct gps_handoff_opts {
    const char *server_id;     /* this server's id in the servers table (copied) */
    int period_ms;             /* the slow poll: claim, follow and ownership checks
                                  (<= 0: 1000 while listening, else 100) */
    int models_ms;             /* models written, peers read, sweep (<= 0: 2000) */
    int queue_timeout_sec;     /* an offer's deadline (the client's queue timeout) */
    int request_timeout_sec;   /* the wire's deadline_ms */
} gps_handoff_opts;

/* Start: install the hooks on jobs and the timers. store and jobs are
 * borrowed; jobs must outlive gps_handoff_stop, the store's close must
 * come before gps_handoff_free (its callbacks run until then). NULL on
 * ENOMEM. */
gps_handoff *gps_handoff_start(struct event_base *base, gps_store *store, gps_jobs *jobs,
                               const gps_handoff_opts *o);
/* Stop the timers, remove the hooks, drop the proxies' subscriptions:
 * before the jobs are freed. NULL is a no-op. */
void gps_handoff_stop(gps_handoff *h);
void gps_handoff_free(gps_handoff *h);

/* Wire object (as gps_job_wire writes it) to a job spec (filled; clear it
 * with gps_job_spec_clear on every path). 0, -1 with a reason in err (the
 * wire lacks what a spec needs), or -2 out of memory (err says so): never
 * a spec short of a member the wire holds. */
int gps_handoff_spec_from_wire(const json_t *w, gps_job_spec *spec, char *err, size_t errlen);

#endif
