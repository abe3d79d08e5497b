/*
 * store: the server's durable copy of its state, in one SQLite file or in a
 * PostgreSQL database (a postgresql://USER[:PASS]@HOST[:PORT]/DB URI given
 * where a path would be; docs/persistence.md "PostgreSQL"). Everything
 * below holds for both engines; where they differ it says so.
 *
 * The event loop must never wait on SQLite (no fsync, no lock wait, no long
 * transaction on the loop thread), so the store owns one DB thread with the
 * write connection. The loop hands writes over through a bounded in-memory
 * queue (an enqueue is a malloc + a mutex held for a few instructions); the
 * DB thread executes them as they arrive inside a transaction and commits
 * that transaction every `commit_interval_ms` (5 ms) or `batch_max` ops (512),
 * whichever comes first, or at once when someone waits in gps_store_flush.
 * That is group commit: under load many writes share one commit, idle
 * writes are committed within a few milliseconds. One exception: a
 * request-log row's write open to folding (gps_store_job_update.coalesce)
 * whose row has not ended yet is held back up to GPS_STORE_ROW_HOLD_MS, so
 * that a short request's row is one statement (below). An op that concerns
 * jobs or what hangs off them (events, checkpoints, leases, hand-offs; a
 * read of them, a ping, a flush) runs the held writes first; the others
 * (agents, keys and usage, servers, deployments, stored responses) run
 * beside them, in enqueue order among themselves.
 *
 * Reads the loop needs later (gps_store_job_get_async, ping) go through the
 * same queue, so they see every write enqueued before them, and their
 * callback runs ON THE LOOP THREAD: the DB thread appends the finished op
 * to a mutex-protected completion list and writes to an eventfd; an event
 * of the loop reads it and drains the list. The same wake-up carries the
 * job_events commit notification (gps_store_set_commit_cb).
 *
 * Threads: only the loop thread touches libevent objects (events,
 * evbuffers, bufferevents, the base). The DB thread talks to the loop only
 * through mu and the eventfd, so the server runs libevent without its
 * thread locks (no evthread_use_pthreads; docs/architecture.md "Threads").
 * Keep it so: a new thread must hand its results over the same way.
 *
 * Start-up reads (gps_store_load_*) and the CLI's synchronous writes
 * (gps_store_key_insert_sync) use a second connection on the calling
 * thread. They block: call them before the loop runs, or from a CLI; the
 * server closes that connection once they are done (gps_store_sync_close).
 *
 * Overload: past `queue_max` queued ops (100000) writes are dropped, counted
 * (stats.drops) and logged (event "store_queue_full", rate-limited) instead
 * of growing memory without bound. Before that, from three quarters of it,
 * gps_store_backlog tells the server to refuse new work (503) until the
 * queue is back under half. Reads and flushes are never dropped; a renewal
 * of the native tasks' leases waiting in the queue is updated in place
 * rather than queued again.
 * A write that fails in SQLite (constraint, I/O) is logged and counted
 * (stats.ops_failed); the rest of its batch still commits.
 *
 * Migrations: the SQL of migrations/NNNN_name.sql is embedded in the binary
 * at build time (migrations/ stays the source of truth), so the binary
 * never depends on a path; opts.migrations_dir overrides it with a
 * directory of NNNN_name.sql files. At open, each migration newer than the
 * DB's is applied in its own transaction and recorded in schema_migrations.
 * A DB whose schema is newer than this binary knows is refused.
 *
 * ------------------------------------------------------------------------
 * Schema (migrations/0001_init.sql is authoritative; this is a summary).
 * Times are wall-clock milliseconds since the epoch (INTEGER). JSON columns
 * hold compact JSON text.
 *
 *   schema_migrations(version INTEGER PK, name TEXT, applied_at INTEGER)
 *
 *   agents(id TEXT PK               -- agent UUID
 *          name, version, platform TEXT,
 *          state TEXT NOT NULL      -- registry_state_name(): healthy, dead, ...
 *          labels TEXT NOT NULL     -- JSON object {"region":"eu",...}
 *          facts TEXT               -- JSON: last poll body (gpus, slots, ...)
 *          key_id TEXT              -- key the agent authenticated with
 *          first_seen INTEGER NOT NULL, last_seen INTEGER NOT NULL)
 *
 *   agent_models(agent_id TEXT -> agents(id) ON DELETE CASCADE,
 *          model TEXT, aliases TEXT NOT NULL (JSON array of strings),
 *          quantization TEXT, context_length INTEGER, vram_bytes INTEGER,
 *          loaded INTEGER NOT NULL (0/1), PRIMARY KEY (agent_id, model))
 *
 *   api_keys(id TEXT PK             -- "key_" + 24 hex, public, shown in lists/logs
 *          hash TEXT UNIQUE NOT NULL-- lowercase hex SHA-256 of the raw key;
 *                                      the raw key is never stored
 *          role TEXT NOT NULL       -- client | agent | admin | enrollment
 *          name TEXT NOT NULL, agent_id TEXT (agent keys: bound on first use),
 *          created_at INTEGER NOT NULL, expires_at, revoked_at, last_used_at INTEGER)
 *
 *   jobs(id TEXT PK, api TEXT NOT NULL (openai|anthropic|native),
 *          kind TEXT, model TEXT NOT NULL, key_id TEXT, agent_id TEXT,
 *          status TEXT NOT NULL     -- queued|assigned|running|done|failed|cancelled
 *          priority INTEGER NOT NULL (0 interactive, 1 batch), attempts INTEGER,
 *          prompt_tokens, completion_tokens, queue_ms, ttft_ms, total_ms INTEGER,
 *          finish_reason, error_code, correlation_id TEXT, seed INTEGER,
 *          error_message TEXT       -- migration 0014: what error_code's client
 *                                      was told (<= 1 KiB), NULL before it
 *          request TEXT             -- JSON input; only when log_prompts or native API
 *          created_at INTEGER NOT NULL, finished_at INTEGER (NULL while unfinished))
 *     -- the request log; index on finished_at (retention) and a partial
 *     -- index on unfinished rows (start-up recovery)
 *
 *   job_checkpoints(job_id TEXT PK -> jobs(id) ON DELETE CASCADE,
 *          text TEXT NOT NULL       -- generated text so far
 *          last_seq INTEGER NOT NULL, updated_at INTEGER NOT NULL)
 *
 *   job_events(job_id TEXT -> jobs(id) ON DELETE CASCADE,   (migration 0002)
 *          first_seq, last_seq INTEGER NOT NULL,
 *          events TEXT NOT NULL     -- JSON array of {seq, type, data}: one
 *                                      checkpoint batch of a native task's events
 *          created_at INTEGER NOT NULL, PRIMARY KEY (job_id, first_seq))
 *     -- statements on it are optional: a DB without the table (custom
 *     -- migrations_dir) opens, and those ops fail and are logged
 *
 *   (0003 key limits and key_usage, 0005 model_pins, 0006 responses,
 *    0007 deployments: see docs/persistence.md "Tables")
 *
 *   servers(id TEXT PK, name TEXT NOT NULL, url TEXT,        (migration 0009)
 *          pid INTEGER, version TEXT, started_at, heartbeat_at,
 *          lease_until INTEGER NOT NULL, stopped_at INTEGER)
 *     -- one row per server process sharing the DB; lease_until renewed by
 *     -- each heartbeat (gps_store_server_beat_async)
 *   jobs columns (migration 0010): owner_server TEXT, lease_until INTEGER,
 *          lease_attempt INTEGER NOT NULL DEFAULT 0 -- the lease of a native
 *          task run by one of several servers (NULL/0 on SQLite)
 *   handoffs(job_id TEXT PK -> jobs(id), model, spec (wire JSON + its
 *          "constraints", gps_job_constraints), from_server,
 *          state (waiting|claimed|cancelled), claimed_by, attempt (fencing),
 *          created_at, deadline)                             (migration 0011)
 *   servers.models TEXT (0011): JSON array of what its healthy agents serve
 * ------------------------------------------------------------------------
 *
 * Threading: gps_store_open/close, the load and *_sync functions run on
 * one "owner" thread (main/loop). The async writers and readers may be
 * called from any thread (normally the loop). Strings and json_t passed to
 * the async functions are borrowed for the duration of the call only: the
 * store copies (or serialises) what it keeps.
 */
#ifndef GPS_STORE_H
#define GPS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

typedef struct gps_store gps_store;

/* Schema version this binary's embedded migrations reach. */
int gps_store_schema_version(void);

/* How long a request-log row's open write may wait for the row's end
 * (gps_store_job_update.coalesce): a request shorter than this is one
 * statement, not two or three (issue 24); a crash loses the rows of the
 * requests then younger than this (they were in flight: their clients saw
 * the connection close), as it loses the last commit interval's writes. */
#define GPS_STORE_ROW_HOLD_MS 250

typedef struct gps_store_opts {
    const char *migrations_dir;  /* NULL = embedded migrations */
    int commit_interval_ms;      /* <= 0: 5 */
    int batch_max;               /* <= 0: 512 ops per transaction */
    int row_hold_ms;             /* 0: GPS_STORE_ROW_HOLD_MS; < 0: rows not held */
    size_t queue_max;            /* 0: 100000 queued ops before dropping writes */
    int busy_timeout_ms;         /* <= 0: 5000 */
} gps_store_opts;

/* Open or create the DB at path: WAL, synchronous=NORMAL, busy_timeout,
 * foreign_keys=ON; apply pending migrations; start the DB thread. A path
 * that starts with postgresql:// or postgres:// is a libpq URI instead:
 * connect (the database must exist), apply pending migrations, start the
 * DB thread; refused with a message when the binary was built without
 * libpq.
 * base: where async read callbacks run (may be NULL: async reads are then
 * refused, writes still work — the CLI case). opts may be NULL.
 * Returns the store, or NULL with a message in err ("not a SQLite database",
 * "schema version 7 is newer than this binary (3)", ...). */
gps_store *gps_store_open(const char *path, struct event_base *base, const gps_store_opts *opts,
                          char *err, size_t errlen);
/* db for messages and logs: a URI without its password (out gets at most
 * outlen - 1 bytes). */
void gps_store_db_label(const char *db, char *out, size_t outlen);
/* Is db a file path (SQLite), as opposed to a database URI? */
bool gps_store_db_is_file(const char *db);

/* Commit everything queued, stop the DB thread, deliver pending read
 * callbacks (on the calling thread), close. NULL is a no-op. Call it on the
 * loop thread with the loop no longer running, or from a CLI. */
void gps_store_close(gps_store *s);
/* Close the owner thread's synchronous connection (start-up loads, CLI
 * writes) once they are done: a server on PostgreSQL then holds the DB
 * thread's and the listener's connections only (issue 28). A later
 * synchronous call opens it again. NULL is a no-op. */
void gps_store_sync_close(gps_store *s);
/* Block until every op enqueued before this call is committed (SIGTERM
 * path). Returns 0, or -1 when the last commit failed. */
int gps_store_flush(gps_store *s);

/* ---- counters for /metrics and the health check (cheap: the queue lock, briefly) ---- */
typedef struct gps_store_stats {
    uint64_t ops_enqueued;       /* writes + reads accepted */
    uint64_t ops_committed;      /* writes executed and committed */
    uint64_t ops_failed;         /* writes that SQLite rejected */
    uint64_t drops;              /* writes dropped: queue full */
    uint64_t batches;            /* transactions committed */
    uint64_t statements;         /* ops run in committed transactions: a write
                                    folded into another runs none (issue 24) */
    uint64_t rows_held;          /* row writes held back for their row's end
                                    (GPS_STORE_ROW_HOLD_MS) */
    uint64_t commit_failures;    /* COMMITs that failed */
    uint64_t queue_depth;        /* ops waiting now: queued, or held for their
                                    row's end (those are in rows_waiting too) */
    uint64_t rows_waiting;       /* row writes held now */
    uint64_t deadline_waits;     /* times the DB thread left foldable writes
                                    queued for its commit deadline */
    uint64_t last_batch_ops;     /* ops in the last committed transaction */
    uint64_t last_commit_us;     /* duration of the last COMMIT */
    uint64_t max_commit_us;      /* longest COMMIT so far */
    int64_t last_commit_wall_ms; /* when the last commit finished (0 = none yet) */
} gps_store_stats;
void gps_store_get_stats(gps_store *s, gps_store_stats *out);

/* Cheap, non-blocking health check for GET /health: true when the DB thread
 * is running and its last COMMIT (if any) succeeded. When false and msg is
 * non-NULL, a reason is written there. */
bool gps_store_healthy(gps_store *s, char *msg, size_t msglen);

/* Backpressure (the database slow or away, ops piling up): 0 while new work
 * may be admitted, else the seconds a client should wait (>= 1) with the
 * reason in msg. On from 3/4 of queue_max queued ops, off again under 1/2
 * (the transitions logged: store_backlog, store_backlog_cleared), so that
 * what admitted work writes still fits in the queue. Loop thread only. */
int gps_store_backlog(gps_store *s, char *msg, size_t msglen);

/* ---- async writes (never block; 0 = queued, -1 = dropped/ENOMEM) ---- */

/* Agent row, inserted or updated (first_seen is kept on update). */
typedef struct gps_store_agent_row {
    const char *id;              /* required, <= 64 chars */
    const char *name, *version, *platform;   /* may be NULL */
    const char *state;           /* required: registry_state_name() */
    const json_t *labels;        /* object, NULL = {} */
    const json_t *facts;         /* any JSON, NULL = none */
    const char *key_id;          /* may be NULL */
    int64_t last_seen;           /* wall ms */
} gps_store_agent_row;
int gps_store_agent_upsert(gps_store *s, gps_store_agent_row row);
/* Cheap transition/heartbeat update of an existing agent row. */
int gps_store_agent_state(gps_store *s, const char *agent_id, const char *state,
                          int64_t last_seen);

typedef struct gps_store_model_row {
    const char *model;           /* required */
    const char *const *aliases;  /* n_aliases strings */
    size_t n_aliases;
    const char *quantization;    /* may be NULL */
    long long context_length;    /* 0 = unknown */
    long long vram_bytes;
    bool loaded;
} gps_store_model_row;
/* Replace the agent's model list with models[0..n) (n may be 0). The
 * agent row must exist (upsert it first; ops run in enqueue order). */
int gps_store_agent_models(gps_store *s, const char *agent_id, const gps_store_model_row *models,
                           size_t n);
/* Delete an agent and its models. */
int gps_store_agent_delete(gps_store *s, const char *agent_id);

/* A new job (request-log row). */
typedef struct gps_store_job_row {
    const char *id;              /* required */
    const char *api;             /* required: "openai" | "anthropic" | "native" */
    const char *kind;            /* "completion" | "chat" | "count_tokens", may be NULL */
    const char *model;           /* required */
    const char *key_id;          /* NULL when auth is off */
    const char *status;          /* required, usually "queued" */
    int priority;                /* 0 interactive, 1 batch */
    const char *correlation_id;  /* may be NULL */
    bool has_seed;
    long long seed;
    int64_t created_at;          /* wall ms */
    const json_t *request;       /* input to keep (prompt/messages/params) or NULL.
                                    Pass it only when log_prompts is on or the job
                                    is a native task (must survive a restart). */
    bool coalesce;               /* as gps_store_job_update.coalesce */
} gps_store_job_row;
int gps_store_job_insert(gps_store *s, gps_store_job_row row);

/* Change some columns of a job row. Fields left at their "unchanged" value
 * (NULL strings, negative numbers) are not touched: initialise with
 * GPS_STORE_JOB_UPDATE_INIT(id) and set what changed. */
typedef struct gps_store_job_update {
    const char *id;              /* required */
    const char *status;
    const char *agent_id;
    int attempts;
    long long prompt_tokens, completion_tokens;
    long long queue_ms, ttft_ms, total_ms;
    const char *finish_reason;
    const char *error_code;
    /* What the client was told with error_code (migration 0014): kept up
     * to STORE's 1 KiB, cut at a UTF-8 character boundary, for a native
     * task read back from its row. A write with a message never folds
     * (coalesce is ignored): give one only for rows that do not coalesce.
     * A schema without the column writes the rest of the update. */
    const char *error_message;
    int64_t finished_at;         /* wall ms; <= 0 unchanged */
    int64_t lease_attempt;       /* > 0: only while the row's lease_attempt is this
                                    (migration 0010: a shared native task's holder) */
    /* No other write of the store concerns this row (no native task events
     * or checkpoints, no handoff): the write may fold into the row's
     * earlier write while that one still waits in the queue. The row is then
     * written once, by one statement, at the commit the first write would
     * have had, and ends as if both had run (issue 24: a relayed request
     * was three statements). A write without it never folds, and no later
     * write folds across it. Fenced updates never fold. Such a write the DB
     * thread takes while its row is still open (no finished_at) waits up to
     * GPS_STORE_ROW_HOLD_MS for the row's end to fold into it; anything
     * else queued behind it (a read, a flush, another kind of write) runs
     * it first, so every read still sees every write queued before it. */
    bool coalesce;
} gps_store_job_update;
#define GPS_STORE_JOB_UPDATE_INIT(job_id)                                                    \
    ((gps_store_job_update){.id = (job_id), .attempts = -1, .prompt_tokens = -1,              \
                            .completion_tokens = -1, .queue_ms = -1, .ttft_ms = -1,           \
                            .total_ms = -1, .finished_at = 0})
int gps_store_job_update_async(gps_store *s, gps_store_job_update u);

/* Save the text generated so far (len bytes, need not be NUL-terminated)
 * and the last event seq of a job. Replaces the previous checkpoint. The
 * job row must exist. */
int gps_store_checkpoint(gps_store *s, const char *job_id, const char *text, size_t len,
                         long long last_seq);

/* Append one checkpoint batch of a native task's event log: events is a
 * non-empty array of {seq, type, data} with contiguous ascending seq (the
 * first and last seq are taken from it). One row, one statement: after a
 * crash a batch is stored whole or not at all. See docs/persistence.md. */
int gps_store_job_events(gps_store *s, const char *job_id, const json_t *events);
/* The same, and *op_seq (not NULL) gets the write's place in the queue, to
 * compare with the done_seq of the durability notification below. */
int gps_store_job_events_seq(gps_store *s, const char *job_id, const json_t *events,
                             uint64_t *op_seq);

/* Durability notification (issue 10 item 6: a native event id is sent to a
 * client only once the event is in the database, so that it means the
 * same thing after a crash). fn runs ON THE LOOP THREAD after a transaction
 * that held job_events writes has been committed or has failed: every op
 * with op_seq <= done_seq has then been executed. failed: a COMMIT, or a
 * job_events write, failed since the previous call, so rows of writes up to
 * done_seq may be missing: write them again (a job_events row is keyed by
 * (job_id, first_seq): writing a batch again replaces it). Calls coalesce
 * (done_seq only grows). Only one listener: set it before the loop runs,
 * and to NULL before arg goes away. Needs the event_base given to open. */
typedef void (*gps_store_commit_fn)(void *arg, uint64_t done_seq, bool failed);
/* Can this DB's schema hold job_events (a custom migrations_dir may lack
 * the table: then no write will ever commit, do not wait for one)? */
bool gps_store_has_job_events(gps_store *s);
void gps_store_set_commit_cb(gps_store *s, gps_store_commit_fn fn, void *arg);

/* Delete finished jobs (finished_at < before_wall_ms) and their
 * checkpoints, in chunks of 1000 rows so other writes interleave. */
int gps_store_purge_jobs(gps_store *s, int64_t before_wall_ms);

/* API keys (auth.c is the usual caller). */
typedef struct gps_store_key_row {
    const char *id;              /* required */
    const char *hash;            /* required: 64 lowercase hex (SHA-256 of the raw key) */
    const char *role;            /* required: client | agent | admin | enrollment */
    const char *name;            /* NULL = "" */
    const char *agent_id;        /* NULL = unbound */
    int64_t created_at;
    int64_t expires_at;          /* 0 = never */
    int64_t revoked_at;          /* 0 = not revoked */
    int64_t last_used_at;        /* 0 = never */
    /* Migration 0003; 0 = unlimited. Written by a second statement. */
    int64_t rpm, tokens_per_day, max_concurrent;
    int64_t max_uses, uses;      /* enrollment tokens */
} gps_store_key_row;
int gps_store_key_insert(gps_store *s, gps_store_key_row row);
int gps_store_key_revoke(gps_store *s, const char *key_id, int64_t revoked_at);
int gps_store_key_used(gps_store *s, const char *key_id, int64_t used_at);
int gps_store_key_bind_agent(gps_store *s, const char *key_id, const char *agent_id);
/* Migration 0003: a key's limits and an enrollment token's use count. */
int gps_store_key_limits(gps_store *s, const char *key_id, int64_t rpm, int64_t tokens_per_day,
                         int64_t max_concurrent, int64_t max_uses);
int gps_store_key_uses(gps_store *s, const char *key_id, int64_t uses);
/* Add to a key's usage row for day (days since the epoch, UTC): upsert
 * that adds each count to what is stored. Counts are >= 0 (-1 otherwise,
 * nothing queued). */
int gps_store_usage_add(gps_store *s, const char *key_id, int64_t day, int64_t requests,
                        int64_t prompt_tokens, int64_t completion_tokens, int64_t rate_limited);

/* ---- async reads: cb runs on the loop thread (the base given to open) ---- */

/* A job as stored. All pointers borrowed: valid during the callback only. */
typedef struct gps_store_job_info {
    const char *id, *api, *kind, *model, *key_id, *agent_id, *status;
    int priority, attempts;
    long long prompt_tokens, completion_tokens;   /* -1 = NULL in the DB */
    long long queue_ms, ttft_ms, total_ms;        /* -1 = NULL */
    const char *finish_reason, *error_code, *correlation_id;
    const char *error_message;                    /* NULL: none stored (a row before
                                                     migration 0014, or no message) */
    bool has_seed;
    long long seed;
    int64_t created_at, finished_at;              /* finished_at 0 = unfinished */
    json_t *request;                              /* borrowed, may be NULL */
    const char *checkpoint_text;                  /* NULL = no checkpoint */
    size_t checkpoint_len;
    long long checkpoint_seq;                     /* -1 = no checkpoint */
    json_t *events;                               /* borrowed: the job_events log
                                                     concatenated (array of {seq,type,
                                                     data}, ascending), NULL = none */
} gps_store_job_info;

/* status: 0 found (job non-NULL), 1 not found (job NULL), -1 error (job NULL). */
typedef void (*gps_store_job_fn)(void *arg, int status, const gps_store_job_info *job);
/* Look a job up by id after every write queued before it. Returns 0, or
 * -1 (no event_base, ENOMEM) in which case cb is never called. */
int gps_store_job_get_async(gps_store *s, const char *id, gps_store_job_fn cb, void *arg);

/* Results of the small reads below: nrows rows of ncols text cells,
 * row-major (cell[row * ncols + col]; NULL = SQL NULL), and for a delete
 * the number of rows it removed. Borrowed for the callback. status 0, or
 * -1 (SQLite error, or a schema without the table) with res NULL. */
typedef struct gps_store_cells {
    size_t nrows, ncols;
    const char *const *cell;
    int64_t changes;
} gps_store_cells;
typedef void (*gps_store_cells_fn)(void *arg, int status, const gps_store_cells *res);

/* ---- native tasks shared by several servers (migration 0010) ----
 * docs/scaling.md "Native tasks across servers". The server running a
 * native task holds it: jobs.owner_server, lease_until (wall ms) and
 * lease_attempt (the fencing token). */

/* Does this DB's schema hold the lease columns (all statements below)? */
bool gps_store_has_task_leases(gps_store *s);
/* A new task's lease (queued write, after the job's insert). */
int gps_store_task_own(gps_store *s, const char *job_id, const char *server_id,
                       int64_t lease_until, int64_t attempt);
/* Extend the lease of every unfinished task server_id holds (queued write;
 * a task claimed by another server meanwhile is no longer its). */
int gps_store_task_renew(gps_store *s, const char *server_id, int64_t lease_until);
/* Take over at most limit unfinished native tasks whose lease expired
 * before now_ms (rows without a lease: a minute after their creation) and
 * whose model is one of models (a JSON array of names): owner server_id,
 * lease_until, attempt + 1, in one UPDATE, so that each expired lease is
 * taken by one server. cb (loop thread) gets rows of (id, new attempt). */
int gps_store_task_claim_async(gps_store *s, const char *server_id, int64_t lease_until,
                               int64_t now_ms, const json_t *models, int limit,
                               gps_store_cells_fn cb, void *arg);
/* ---- requests' owners on a shared DB (jobs.owner_server) ----
 * docs/scaling.md "Requests of a server that is gone". Every job a server
 * on a shared DB creates names it (its gps_cluster_id) so that a server
 * starting fails only what is no longer anyone's. */

/* Do the statements below exist (the 0010 columns and 0009's servers)? */
bool gps_store_has_job_owners(gps_store *s);
/* gps_store_job_insert with owner_server (NULL/"" or no such column: the
 * plain insert). */
int gps_store_job_insert_owned(gps_store *s, gps_store_job_row row, const char *owner_server);
/* Mark failed (SERVER_RESTART, finished_at now_ms) every unfinished
 * non-native job whose owner has not renewed its servers row since
 * dead_before or has no row (no owner: created before dead_before). cb
 * gets the number of rows in res->changes. */
int gps_store_jobs_fail_orphans_async(gps_store *s, int64_t now_ms, int64_t dead_before,
                                      gps_store_cells_fn cb, void *arg);

/* gps_store_job_events_seq for the holder of attempt only: when the row's
 * lease_attempt is another (a server took the task over), the write fails
 * (logged, counted, reported to the commit listener as failed). */
int gps_store_job_events_fenced(gps_store *s, const char *job_id, const json_t *events,
                                int64_t attempt, uint64_t *op_seq);
/* gps_store_checkpoint by the holder of attempt only (attempt <= 0: any). */
int gps_store_checkpoint_fenced(gps_store *s, const char *job_id, const char *text, size_t len,
                                long long last_seq, int64_t attempt);
/* One row: the task's lease_attempt (no row: no such job). */
int gps_store_task_lease_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                               void *arg);
/* A follower's read: rows of (finished_at or NULL, events batch or NULL)
 * for the job_events batches holding seqs after after_seq, in order; no
 * row when the job does not exist. */
int gps_store_task_follow_async(gps_store *s, const char *job_id, long long after_seq,
                                gps_store_cells_fn cb, void *arg);
/* A DELETE of a task another server runs (migration 0012): mark the row
 * (jobs.cancel_requested = now_ms) if it is an unfinished native task;
 * res->changes says whether it was; status -1 also when its transaction
 * did not commit. The owner finds the marks with gps_store_task_cancels_async:
 * rows of (id), its unfinished tasks with a cancel asked. */
bool gps_store_has_task_cancel(gps_store *s);
int gps_store_task_cancel_request_async(gps_store *s, const char *job_id, int64_t now_ms,
                                        gps_store_cells_fn cb, void *arg);
int gps_store_task_cancels_async(gps_store *s, const char *server_id, gps_store_cells_fn cb,
                                 void *arg);
/* One row (none: no such job): the task's mark, NULL when none. */
int gps_store_task_cancel_get_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                                    void *arg);

/* ---- wake-ups across servers sharing a PostgreSQL database ----
 * LISTEN/NOTIFY: a server that wrote what another one waits for (an
 * offer, a relayed batch) notifies a channel; the others LISTEN on a
 * connection of their own, watched by their loop, instead of polling.
 * A notification can be lost (the listener was reconnecting): listeners
 * keep a slow poll. SQLite: nothing (one server, nobody to wake). */

/* Queued write: notify channel with payload (both copied; payload under
 * 8000 bytes). It commits with the writes queued before it or after them,
 * never before: a listener woken by it reads them. 0 (nothing queued) on
 * SQLite; -1 when dropped (queue full, ENOMEM). */
int gps_store_notify(gps_store *s, const char *channel, const char *payload);

typedef struct gps_store_listener gps_store_listener;
/* On the loop thread: one notification (channel and payload borrowed for
 * the call); or channel NULL each time the listener (re)starts listening,
 * after the first connect and after each reconnect: what was notified
 * while it was away is lost, so look at the database now. It must not
 * free or add a listener. */
typedef void (*gps_store_notify_fn)(void *arg, const char *channel, const char *payload);
/* LISTEN to channels (NULL-terminated; names of [a-z0-9_], copied) on the
 * store's one listening connection to its database, shared by every
 * listener of s (issue 28: one connection, not one per caller) and made
 * with the first one, its socket watched by the first one's base (the loop
 * never waits on it: the connect is started here and finished by the
 * loop). A listener added once the LISTENs went out makes the connection
 * again (every listener hears channel NULL). A connection lost (the
 * database restarted) is made again, after 0.1 s doubling up to 5 s. Each
 * listener hears its own channels only. NULL on SQLite, without libpq, on
 * a bad channel name or ENOMEM: the caller only polls. A listener may be
 * freed after gps_store_close (the connection closes with the last). */
gps_store_listener *gps_store_listen(gps_store *s, struct event_base *base,
                                     const char *const *channels, gps_store_notify_fn fn,
                                     void *arg);
/* Close the connection, stop its events. NULL is a no-op. */
void gps_store_listener_free(gps_store_listener *l);

/* ---- the hand-off of a job to another server (migration 0011) ----
 * docs/scaling.md "3e. Hand-off of a job to another server". Only on a
 * shared (PostgreSQL) database; SQLite stores never offer. Relayed
 * batches go into job_events with seqs attempt * GPS_HANDOFF_SEQ_BASE +
 * index (index from 0 for each claim). */
#define GPS_HANDOFF_SEQ_BASE 1000000000LL

/* Does this DB's schema hold the handoffs table and servers.models? */
bool gps_store_has_handoffs(gps_store *s);
/* Queued write: what server_id's healthy agents serve (JSON array). */
int gps_store_server_models(gps_store *s, const char *server_id, const json_t *models);
/* Does this DB's schema hold servers.free (migration 0013)? */
bool gps_store_has_server_free(gps_store *s);
/* Queued write: what server_id's free ready agents could take now (JSON
 * array of {"m": [names], "l": {labels}, "n": free slots}). -1 without
 * migration 0013. */
int gps_store_server_free(gps_store *s, const char *server_id, const json_t *free_slots);
/* Rows of (models[, free]) of the other servers whose lease is live at
 * now_ms: free (a second column, NULL for a server that never wrote it)
 * when gps_store_has_server_free. */
int gps_store_handoff_peers_async(gps_store *s, const char *server_id, int64_t now_ms,
                                  gps_store_cells_fn cb, void *arg);
/* Queued write (after the job's insert): an offer, state waiting. spec is
 * the job's wire object (serialised). */
int gps_store_handoff_offer(gps_store *s, const char *job_id, const char *model,
                            const json_t *spec, const char *from_server, int64_t created_at,
                            int64_t deadline);
/* Claim at most limit waiting offers of models (JSON array of names) whose
 * deadline is after now_ms, offered by another server than server_id:
 * rows of (job_id, spec, attempt). */
int gps_store_handoff_claim_async(gps_store *s, const char *server_id, int64_t now_ms,
                                  const json_t *models, int limit, gps_store_cells_fn cb,
                                  void *arg);
/* Before a claim: rows of (job_id, model, constraints) of at most limit
 * waiting offers of models by other servers than server_id, oldest first,
 * deadline after now_ms (constraints: the text of the spec's
 * "constraints" member, gps_job_constraints; NULL when absent). Locks
 * nothing. */
int gps_store_handoff_peek_async(gps_store *s, const char *server_id, int64_t now_ms,
                                 const json_t *models, int limit, gps_store_cells_fn cb,
                                 void *arg);
/* Claim those of job_ids (JSON array) still waiting with a deadline after
 * now_ms (SKIP LOCKED): rows of (job_id, spec, attempt), as the claim. */
int gps_store_handoff_claim_ids_async(gps_store *s, const char *server_id, int64_t now_ms,
                                      const json_t *job_ids, gps_store_cells_fn cb, void *arg);
/* A relayed batch (fenced): stored only while the row is claimed by
 * server_id at attempt; cb gets status -1 when refused (or failed). */
int gps_store_handoff_events_async(gps_store *s, const char *job_id, const char *server_id,
                                   int64_t attempt, long long first_seq, long long last_seq,
                                   const json_t *events, gps_store_cells_fn cb, void *arg);
/* The follower's read: rows of (state, claimed_by, attempt, first_seq,
 * events) for the batches whose last seq is >= from_seq, in order (one row
 * with NULL batch cells when none); no row when the offer is gone. */
int gps_store_handoff_follow_async(gps_store *s, const char *job_id, long long from_seq,
                                   gps_store_cells_fn cb, void *arg);
/* Rows of (job_id, attempt) server_id still holds claimed. */
int gps_store_handoff_mine_async(gps_store *s, const char *server_id, gps_store_cells_fn cb,
                                 void *arg);
/* The offering server withdraws an offer (its own agent can run the job
 * now): the row goes only while it is waiting; cb's res->changes is 1 when
 * withdrawn, 0 when a peer claimed it first (or it is gone). */
int gps_store_handoff_withdraw_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                                     void *arg);
/* Queued write at the offering job's end: done, the row goes; otherwise it
 * is marked cancelled (its claimer stops the job). */
int gps_store_handoff_end(gps_store *s, const char *job_id, bool done);
/* The sweep: claimed rows of servers whose lease ended before now_ms go
 * back to waiting (cb: res->changes), offers of such servers are marked
 * cancelled. */
int gps_store_handoff_sweep_async(gps_store *s, int64_t now_ms, gps_store_cells_fn cb,
                                  void *arg);

/* Stored Responses (migration 0006; see migrations/0006_responses.sql).
 * key_id is "" for requests made with auth off. */
typedef struct gps_store_response_row {
    const char *id, *key_id;
    int64_t created_at, expires_at;   /* wall ms */
    /* Each value as a tree, or (tree NULL) as JSON text of _len bytes. */
    const json_t *object;             /* the response object */
    const json_t *context;            /* chat messages through this response */
    const json_t *items;              /* [{id, message}] of its output items, or NULL */
    const char *object_text, *context_text, *items_text;
    size_t object_len, context_len, items_len;
    int64_t keep_per_key;             /* > 0: then drop the key's older ones past this */
} gps_store_response_row;
int gps_store_response_put(gps_store *s, const gps_store_response_row *r);
/* One row: object, context (unexpired, this key's only). */
int gps_store_response_get_async(gps_store *s, const char *id, const char *key_id,
                                 int64_t now_ms, gps_store_cells_fn cb, void *arg);
/* Rows of item_id, message for the ids (a JSON array of strings) this key
 * stored and that have not expired; missing ids are simply absent. */
int gps_store_response_items_async(gps_store *s, const char *key_id, const json_t *ids,
                                   int64_t now_ms, gps_store_cells_fn cb, void *arg);
/* res->changes: 1 when this key's response id was deleted, else 0. */
int gps_store_response_delete_async(gps_store *s, const char *id, const char *key_id,
                                    gps_store_cells_fn cb, void *arg);
/* Delete expired responses (and their items), in chunks. */
int gps_store_purge_responses(gps_store *s, int64_t now_ms);

/* ok: SELECT 1 ran on the DB thread; msg describes a failure. */
typedef void (*gps_store_ping_fn)(void *arg, bool ok, const char *msg);
int gps_store_ping_async(gps_store *s, gps_store_ping_fn cb, void *arg);

/* ---- synchronous reads (start-up, CLI; block on SQLite) ---- */

typedef struct gps_store_agent_info {
    const char *id, *name, *version, *platform, *state, *key_id;
    json_t *labels;              /* borrowed object (never NULL) */
    json_t *facts;               /* borrowed, may be NULL */
    int64_t first_seen, last_seen;
    gps_store_model_row *models; /* borrowed array */
    size_t n_models;
} gps_store_agent_info;
/* Callbacks return 0 to continue, non-zero to stop (the load then returns
 * that value). Return -1 with err on SQLite failure. */
typedef int (*gps_store_agent_fn)(void *arg, const gps_store_agent_info *a);
int gps_store_load_agents(gps_store *s, gps_store_agent_fn cb, void *arg, char *err,
                          size_t errlen);

typedef int (*gps_store_key_fn)(void *arg, const gps_store_key_row *k);
/* Every key, revoked and expired ones included (ordered by created_at). */
int gps_store_load_keys(gps_store *s, gps_store_key_fn cb, void *arg, char *err, size_t errlen);

typedef int (*gps_store_job_load_fn)(void *arg, const gps_store_job_info *job);
/* Jobs with finished_at NULL (queued/assigned/running at the last stop),
 * oldest first, with their checkpoint. */
int gps_store_load_unfinished_jobs(gps_store *s, gps_store_job_load_fn cb, void *arg, char *err,
                                   size_t errlen);

/* Insert a key row synchronously (CLI `keys create`). 0 or -1 with err. */
int gps_store_key_insert_sync(gps_store *s, const gps_store_key_row *row, char *err,
                              size_t errlen);
/* Today's usage rows (start-up, limits.c): cb gets each key's counts for
 * day; return non-zero to stop. 0 or -1 with err (no key_usage table). */
typedef int (*gps_store_usage_fn)(void *arg, const char *key_id, int64_t day, int64_t requests,
                                  int64_t prompt_tokens, int64_t completion_tokens,
                                  int64_t rate_limited);
int gps_store_load_usage(gps_store *s, int64_t day, gps_store_usage_fn cb, void *arg, char *err,
                         size_t errlen);
/* Revoke synchronously (CLI). Returns 0, 1 when no such (unrevoked) key,
 * -1 with err. */
int gps_store_key_revoke_sync(gps_store *s, const char *key_id, int64_t revoked_at, char *err,
                              size_t errlen);

/* ---- admin API: the request log, filtered (async read, DB thread) ---- */

/* Filters of GET /admin/jobs. NULL strings match any value; the others
 * are exact matches. */
typedef struct gps_store_job_filter {
    const char *status, *model, *agent_id, *key_id;
    int64_t before;              /* only jobs created before this (wall ms), 0 = no cursor */
    int limit;                   /* rows at most, >= 1 */
} gps_store_job_filter;
/* status 0: jobs[0..n) newest first (created_at, then id, descending),
 * without request, checkpoint or events (NULL / -1); -1 error (jobs NULL,
 * n 0). Everything is borrowed for the callback only. */
typedef void (*gps_store_jobs_fn)(void *arg, int status, const gps_store_job_info *jobs,
                                  size_t n);
/* Read after every write queued before it; cb runs on the loop thread.
 * The filter's strings are copied. Returns 0, or -1 (no event_base,
 * ENOMEM, limit < 1) in which case cb is never called. */
int gps_store_jobs_list_async(gps_store *s, const gps_store_job_filter *f, gps_store_jobs_fn cb,
                              void *arg);

/* Model pins (migration 0005, docs/admin.md "Model pins"): name -> the
 * sha256 of the file that must serve it. Set/delete are queued writes like
 * the others whose outcome nobody hears (the admin routes use the _async
 * forms below; these serve tools and tests); load runs at start-up. Returns
 * 0 or -1 (load: with err; no model_pins table is an error there). */
int gps_store_pin_set(gps_store *s, const char *name, const char *sha256, int64_t created_at,
                      const char *created_by);
int gps_store_pin_delete(gps_store *s, const char *name);
typedef int (*gps_store_pin_fn)(void *arg, const char *name, const char *sha256,
                                int64_t created_at, const char *created_by);
int gps_store_load_pins(gps_store *s, gps_store_pin_fn cb, void *arg, char *err, size_t errlen);
/* status 0: the write ran and its transaction committed; -1: it did not
 * (database unreachable, no such table, the statement or the COMMIT
 * failed). Runs on the loop thread. */
typedef void (*gps_store_status_fn)(void *arg, int status);
/* The same two writes for an operator's change, answered only once the
 * database holds it (docs/admin.md "Model pins"), as the deployments'
 * gps_store_deploy_put_async: queued, never dropped, committed at once, cb
 * on the loop thread. Returns 0, or -1 (no event_base, ENOMEM, DB thread
 * gone): cb is then never called. */
int gps_store_pin_set_async(gps_store *s, const char *name, const char *sha256,
                            int64_t created_at, const char *created_by,
                            gps_store_status_fn cb, void *arg);
int gps_store_pin_delete_async(gps_store *s, const char *name, gps_store_status_fn cb,
                               void *arg);
/* Does this DB's schema hold the model_pins table (migration 0005)? */
bool gps_store_has_pins(gps_store *s);

/* Deployments (migration 0007, docs/admin.md "Deployments"): the desired
 * state the server places on agents (fleet/deploy.h decides; these are its
 * write-through and start-up load). Strings are borrowed for the call. */
typedef struct gps_store_deploy_row {
    const char *name, *source;
    const char *sha256;          /* NULL: not checked */
    int replicas;
    const char *labels_json;     /* a JSON object as text ("{}" when NULL on write) */
    int64_t bytes;               /* file size, 0 unknown */
    int64_t created_at;
    const char *created_by;      /* may be NULL */
} gps_store_deploy_row;
typedef struct gps_store_replica_row {
    const char *deployment, *agent_id;
    const char *state;           /* assigned, downloading, loading, ready, failed */
    const char *reason;          /* may be NULL */
    int64_t bytes, total, rate;  /* download figures as of this write */
    int64_t updated_at;
} gps_store_replica_row;
/* Queued writes, like the others; delete of a deployment drops its
 * replicas. 0 or -1. */
int gps_store_deploy_put(gps_store *s, const gps_store_deploy_row *d);
int gps_store_deploy_delete(gps_store *s, const char *name);
/* gps_store_status_fn: with the model pins, above. */
/* The same two writes for an operator's change, which is answered only
 * once the database holds it (docs/admin.md "Deployments"): queued like
 * the others (never dropped: the caller waits), committed at once as a
 * read is, and cb (loop thread) says whether the row is in the database.
 * Returns 0, or -1 (no event_base, ENOMEM, DB thread gone): cb is then
 * never called. */
int gps_store_deploy_put_async(gps_store *s, const gps_store_deploy_row *d,
                               gps_store_status_fn cb, void *arg);
int gps_store_deploy_delete_async(gps_store *s, const char *name, gps_store_status_fn cb,
                                  void *arg);
/* Does this DB's schema hold the deployments tables, either of them (a
 * custom migrations_dir may lack migration 0007)? */
bool gps_store_has_deployments(gps_store *s);
int gps_store_replica_put(gps_store *s, const gps_store_replica_row *r);
int gps_store_replica_delete(gps_store *s, const char *deployment, const char *agent_id);
/* Start-up: every deployment (dcb), then every replica (rcb). A callback
 * returning non-zero stops the load. 0, or -1 with err (no tables: err). */
typedef int (*gps_store_deploy_fn)(void *arg, const gps_store_deploy_row *d);
typedef int (*gps_store_replica_fn)(void *arg, const gps_store_replica_row *r);
int gps_store_load_deployments(gps_store *s, gps_store_deploy_fn dcb, gps_store_replica_fn rcb,
                               void *arg, char *err, size_t errlen);

/* Servers that share this database (migration 0009, docs/scaling.md
 * section 3): each announces itself, renews a lease with a heartbeat and
 * marks itself stopped on a clean shutdown. Strings borrowed. */
typedef struct gps_store_server_row {
    const char *id, *name, *url, *version;   /* url may be NULL */
    int64_t pid;
    int64_t started_at, heartbeat_at, lease_until;   /* wall ms */
    int64_t stopped_at;                              /* 0 = running */
} gps_store_server_row;
/* Does this DB's schema hold the servers table (a custom migrations_dir
 * may lack it: then do not announce)? */
bool gps_store_has_servers(gps_store *s);
/* gps_store_status_fn (above): no servers table is a failure too. */
/* Announce or renew (one upsert of id's row; stopped_at is cleared): a
 * read-like op, committed at once, cb says whether it held. Returns 0, or
 * -1 (no event_base, ENOMEM, DB thread gone): cb is then never called. */
int gps_store_server_beat_async(gps_store *s, const gps_store_server_row *r,
                                gps_store_status_fn cb, void *arg);
/* Queued writes: mark id stopped at `at` (clean shutdown: its lease ends
 * then too); delete the rows whose lease ended before `before`. */
int gps_store_server_stop(gps_store *s, const char *id, int64_t at);
int gps_store_server_purge(gps_store *s, int64_t before);
/* Every server row, oldest start first. Borrowed for the callback; status
 * -1 with n 0 on failure. */
typedef void (*gps_store_servers_fn)(void *arg, int status, const gps_store_server_row *rows,
                                     size_t n);
int gps_store_servers_async(gps_store *s, gps_store_servers_fn cb, void *arg);

/* The re-reads that keep several servers in step (loop thread callbacks,
 * after every write queued before them; rows borrowed for the call): every
 * key with its limits (migration 0003 columns required), and every key's
 * usage of one day. 0, or -1 when cb will never be called. */
typedef void (*gps_store_keys_fn)(void *arg, int status, const gps_store_key_row *rows,
                                  size_t n);
int gps_store_keys_async(gps_store *s, gps_store_keys_fn cb, void *arg);
typedef struct gps_store_usage_row {
    const char *key_id;
    int64_t requests, prompt_tokens, completion_tokens, rate_limited;
} gps_store_usage_row;
typedef void (*gps_store_usage_rows_fn)(void *arg, int status, int64_t day,
                                        const gps_store_usage_row *rows, size_t n);
int gps_store_usage_async(gps_store *s, int64_t day, gps_store_usage_rows_fn cb, void *arg);

#endif
