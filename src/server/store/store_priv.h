/*
 * store_priv.h: what the files of the store module share (store.c says
 * which file holds what). Private to the store's own .c files: the rest
 * of the server sees store.h only. Short type names (op, row, val, conn)
 * stay short here since no file outside the module includes this one.
 */
#ifndef GPS_STORE_PRIV_H
#define GPS_STORE_PRIV_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/store/store.h"
#include "server/store/store_engine.h"

/* The statements of the table (store_stmts.c), by kind. */
enum {
    /* writes and reads of the DB thread */
    K_AGENT_UPSERT = 0,
    K_AGENT_STATE,
    K_MODELS_CLEAR,
    K_MODEL_INSERT,
    K_AGENT_DELETE,
    K_JOB_INSERT,
    K_JOB_UPDATE,
    K_CHECKPOINT,
    K_PURGE,
    K_KEY_INSERT,
    K_KEY_REVOKE,
    K_KEY_USED,
    K_KEY_BIND,
    K_JOB_GET,
    K_PING,
    K_EVENTS_ADD,
    K_EVENTS_GET,
    K_KEY_LIMITS,
    K_KEY_USES,
    K_USAGE_ADD,
    K_JOB_LIST,
    /* the owner thread's: migrations and start-up loads */
    K_SCHEMA_VERSION,
    K_MIGRATION_RECORD,
    K_LOAD_AGENTS,
    K_LOAD_MODELS,
    K_LOAD_KEYS,
    K_LOAD_KEYS_BASE,
    K_LOAD_JOBS,
    K_LOAD_USAGE,
    K_PIN_SET,
    K_PIN_DELETE,
    K_LOAD_PINS,
    K_RESP_PUT,
    K_RESP_ITEMS_PUT,
    K_RESP_TRIM,
    K_RESP_GET,
    K_RESP_ITEMS_GET,
    K_RESP_DELETE,
    K_RESP_PURGE,
    K_DEPLOY_PUT,
    K_DEPLOY_DELETE,
    K_REPLICA_PUT,
    K_REPLICA_DELETE,
    K_LOAD_DEPLOYS,
    K_LOAD_REPLICAS,
    /* servers sharing the DB (migration 0009) and the periodic re-reads
     * that keep keys and usage in step across them */
    K_SERVER_BEAT,
    K_SERVER_STOP,
    K_SERVER_PURGE,
    K_SERVER_LIST,
    K_KEYS_GET,
    K_USAGE_GET,
    /* a wake-up of the other servers (PostgreSQL: pg_notify) */
    K_NOTIFY,
    /* native tasks shared by several servers (migration 0010) */
    K_TASK_OWN,
    K_TASK_RENEW,
    K_TASK_CLAIM,
    K_EVENTS_ADD_FENCED,
    K_TASK_FOLLOW,
    K_TASK_LEASE_GET,
    K_JOB_UPDATE_FENCED,
    K_CHECKPOINT_FENCED,
    /* requests' owners on a shared DB (jobs.owner_server, migration 0010) */
    K_JOB_INSERT_OWNED,
    K_JOBS_FAIL_ORPHANS,
    /* the hand-off of a job to another server (migration 0011) */
    K_SERVER_MODELS,
    K_HANDOFF_PEERS,
    K_HANDOFF_OFFER,
    K_HANDOFF_CLAIM,
    K_HANDOFF_PEEK,
    K_HANDOFF_CLAIM_IDS,
    K_HANDOFF_EVENTS,
    K_HANDOFF_FOLLOW,
    K_HANDOFF_MINE,
    K_HANDOFF_CANCEL,
    K_HANDOFF_DELETE,
    K_HANDOFF_WITHDRAW,
    K_HANDOFF_SWEEP,
    K_HANDOFF_SWEEP_FROM,
    /* a task's cancel asked of its owner through the row (migration 0012) */
    K_TASK_CANCEL_REQ,
    K_TASK_CANCELS,
    K_TASK_CANCEL_GET,
    K_JOB_INSERT_ROW,
    /* what each server's agents could take now (migration 0013) */
    K_SERVER_FREE,
    K_HANDOFF_PEERS_FREE,
    /* a failed job's message beside its code (migration 0014): the
     * updates that write it and the job read that returns it */
    K_JOB_UPDATE_MSG,
    K_JOB_UPDATE_FENCED_MSG,
    K_JOB_GET_MSG,
    K_COUNT
};

/* Statement flags.
 * F_OPT: a DB migrated by an older or custom migration set may lack its
 *   table or columns (job_events: 0002; key limits and usage: 0003): its
 *   op then fails (logged) instead of the open.
 * F_SYNC: run on the owner thread's connection only (migrations, loads):
 *   not prepared on the DB thread's connection at open.
 * F_CELLS: an async read (or a write whose caller wants the changed row
 *   count) answered through gps_store_cells_fn.
 * F_BESIDE: touches neither jobs nor what hangs off them (job_events,
 *   checkpoints, hand-offs, leases, notifications about them): it runs
 *   beside the row writes held for their row's end (store_held_add_locked)
 *   instead of running them first. With API keys a request queues a usage
 *   write at admission: were it to run the held writes, keyed deployments
 *   would lose the hold; and the heartbeat, queued ahead, would wait
 *   behind them. */
enum { F_OPT = 1, F_SYNC = 2, F_CELLS = 4, F_BESIDE = 8 };

#define JOB_COLUMNS_LIST                                                                     \
    "j.id, j.api, j.kind, j.model, j.key_id, j.agent_id, j.status, j.priority, j.attempts, " \
    "j.prompt_tokens, j.completion_tokens, j.queue_ms, j.ttft_ms, j.total_ms, "              \
    "j.finish_reason, j.error_code, j.correlation_id, j.seed, j.created_at, j.finished_at, " \
    "j.request, c.text, c.last_seq "
#define JOB_COLUMNS_FROM "FROM jobs j LEFT JOIN job_checkpoints c ON c.job_id = j.id "
#define JOB_COLUMNS JOB_COLUMNS_LIST JOB_COLUMNS_FROM
/* Column of j.error_message in K_JOB_GET_MSG's row (after JOB_COLUMNS'). */
#define JOB_COL_ERROR_MESSAGE 23
/* The most bytes of a job's error message the row keeps (migration 0014). */
#define STORE_ERROR_MESSAGE_MAX 1024

#define PURGE_CHUNK 1000

/* ---- values and ops ---- */

/* The engine-neutral values and rows of store_engine.h, short names here. */
enum { V_NULL = GPS_STORE__NULL, V_INT = GPS_STORE__INT, V_TEXT = GPS_STORE__TEXT };
typedef gps_store__val val;
typedef gps_store__row row;
typedef gps_store__row_fn row_fn;

typedef struct op {
    struct op *next;
    uint64_t seq;
    int kind;                  /* K_* */
    /* reads */
    gps_store_job_fn job_cb;
    gps_store_ping_fn ping_cb;
    void *arg;
    int status;                /* job_get: 0 found, 1 none, -1 error; ping: 0 ok */
    row *result;               /* job_get: the row (owned) */
    json_t *events;            /* job_get: the stored event log (owned), or NULL */
    gps_store_jobs_fn jobs_cb; /* job_list */
    gps_store_cells_fn cells_cb; /* F_CELLS statements */
    gps_store_status_fn status_cb;   /* server_beat, deployment changes: a write whose
                                        caller waits for its outcome (a read then) */
    gps_store_servers_fn servers_cb; /* server_list */
    gps_store_keys_fn keys_cb;       /* keys_get */
    gps_store_usage_rows_fn usage_cb;/* usage_get */
    int64_t changes;           /* F_CELLS: rows the statement changed */
    row **rows;                /* job_list: nrows rows (owned) */
    size_t nrows;
    /* A job-row write open to folding (gps_store_job_update.coalesce):
     * while it waits in the queue it is in the store's pending table, and
     * what later writes of the row fold into it is the op run instead. */
    struct op *fold;           /* run instead of this op (owned), or NULL */
    struct op *pnext;          /* pending table chain */
    bool pending;              /* in the pending table */
    bool may_wait;             /* queued open to folding: the DB thread may hold it
                                  to its commit deadline (db_hold) */
    uint32_t folds;            /* writes folded into it (counted as ops) */
    /* A key's usage add open to folding (store_usage_fold_locked): in the
     * store's usage table while it waits in the queue. */
    bool in_usage;
    struct op *unext;          /* usage table chain */
    /* Taken off the queue while its row was open: held back for the row's
     * later writes to fold into it (store_held_add_locked). */
    bool held;
    uint64_t hold_until_us;    /* monotonic: runs then at the latest */
    struct op *hnext;          /* held list chain */
    char msg[160];             /* ping: failure text */
    int nv;
    val v[];
} op;
#define MAXV 24

/* Builder: values borrowed from the caller (or owned temporaries from
 * json_dumps), packed into one op by store_b_pack. */
typedef struct opb {
    int kind;
    int nv;
    val v[MAXV];
    char *owned[MAXV];
    int nowned;
    bool oom;
} opb;

/* A row's text, or integer, at column i (NULL, or dflt, when it holds
 * another type). */
static inline const char *rs(const row *r, int i) { return r->v[i].t == V_TEXT ? r->v[i].s : NULL; }
static inline int64_t ri(const row *r, int i, int64_t dflt)
{
    return r->v[i].t == V_INT ? r->v[i].i : dflt;
}

/* A count read back (tokens, attempts, ms): a row out of range (written
 * before the server bounded what agents report, or edited by hand) is
 * clamped into 0..max so that no reader's sum overflows; NULL stays dflt. */
static inline int64_t ri_count(const row *r, int i, int64_t dflt, int64_t max)
{
    if (r->v[i].t != V_INT)
        return dflt;
    return r->v[i].i < 0 ? dflt : r->v[i].i > max ? max : r->v[i].i;
}
#define STORE_MAX_COUNT (1LL << 40)

/* ---- the store ---- */

/* A connection of an engine and the statements of the table prepared on
 * it (lazily, once: tried[k] says whether k was tried, ok[k] whether it
 * was prepared). */
typedef struct conn {
    const gps_store__engine *eng;
    void *h;                     /* the engine's connection; NULL = not open */
    bool tried[K_COUNT];
    bool ok[K_COUNT];
} conn;

#define USAGE_BUCKETS 64

struct gps_store {
    const gps_store__engine *eng;
    char *target;                /* what the engine opens: a path or a URI */
    char *path;                  /* for messages: the path, or the URI without its password */
    conn w;                      /* write connection: DB thread only (after open); its
                                    statements are all prepared at open */
    conn r;                      /* synchronous connection: owner thread, lazily opened
                                    (start-up loads, CLI writes) */
    gps_store__listen_hub *listen_hub; /* every gps_store_listen's one connection
                                          (NULL: none yet); outlives the store
                                          while listeners are left */
    int busy_timeout_ms;
    int commit_interval_ms;
    int batch_max;
    size_t queue_max;
    uint64_t row_hold_us;        /* 0: rows are not held (store_held_add_locked) */

    struct event_base *base;
    /* The DB thread never touches the event_base (only the loop thread
     * touches libevent objects; the server runs libevent without its
     * thread locks): it wakes the loop by writing to wake_fd, an eventfd
     * that ev_wake, an event owned by the loop, reads. What there is to do
     * is in the fields below guarded by mu (dhead, pend_commit). */
    int wake_fd;                 /* -1: no base (CLI use) */
    struct event *ev_wake;

    pthread_t thread;
    bool thread_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;      /* DB thread waits for ops */
    pthread_cond_t cv_done;      /* flushers wait for commits */
    /* everything below is guarded by mu */
    op *qhead, *qtail;
    op *dhead, *dtail;           /* finished reads awaiting delivery on the loop */
    bool wake_sent;              /* wake_fd written, not yet read by the loop */
    bool pend_commit;            /* job_events committed since the loop last looked */
    bool stop;
    bool thread_alive;
    bool tx_waiting;             /* DB thread waits in a group for its commit deadline:
                                    a plain write need not wake it (store_enqueue_locked) */
    int flush_waiters;
    size_t q_nowait;             /* queued ops that are not may_wait (db_hold) */
    uint64_t seq_enqueued;
    uint64_t seq_done;           /* every op with seq <= this is executed and committed */
    uint64_t seq_taken;          /* the highest seq taken off the queue */
    op *hhead, *htail;           /* held row writes, in the order taken (store_held_add_locked) */
    bool held_ready;             /* a held row ended: its write is due */
    bool held_drain;             /* a write of a held row did not fold: run every held
                                    write before the next op */
    bool db_idle;                /* DB thread waits with no group open (db_idle_wait) */
    /* Durability notification (gps_store_set_commit_cb). */
    gps_store_commit_fn commit_fn;
    void *commit_arg;
    uint64_t events_done_seq;    /* last op of the last transaction with job_events */
    bool events_failed;          /* a failure since the last notification */
    bool last_commit_ok;
    char last_error[320];
    int64_t last_drop_log_ms;
    bool backlog;                /* loop thread: refusing new work (gps_store_backlog) */
    gps_store_stats stats;
    op **pend;                   /* PEND_BUCKETS chains: queued job-row writes open to
                                    folding, by job id (NULL: no folding) */
    op *usage[USAGE_BUCKETS];    /* queued usage adds open to folding, by key (under mu) */
    int64_t sync_changes;        /* rows the last sync_exec changed (owner thread) */
};

/* The pending table's buckets (store_fold.c; allocated at open). */
#define PEND_BUCKETS 1024

/* store_enqueue_ex's row: a usage add (store_usage_fold_locked). */
#define ENQ_USAGE 3

/* The key row's insert and its limits (migration 0003) are two
 * statements, so that the insert itself works on any schema (store_write.c,
 * store_sync.c). */
#define KEY_ROW_SPEC "tttttizzz"
#define KEY_ROW_ARGS(r)                                                                   \
    (r)->id, (r)->hash, (r)->role, (r)->name ? (r)->name : "", (r)->agent_id,             \
        (int64_t)(r)->created_at, (int64_t)(r)->expires_at, (int64_t)(r)->revoked_at,     \
        (int64_t)(r)->last_used_at
#define KEY_LIMITS_SPEC "tiiii"

/* A row of the statement table (store_stmts.c). */
typedef struct store_stmt {
    const char *name;
    int flags;
    const char *sql;   /* portable: SQLite runs it, PostgreSQL too unless pg is set */
    const char *pg;    /* PostgreSQL's text where the dialects differ, or NULL */
} store_stmt;

extern const store_stmt store_stmts[K_COUNT];

/* values, ops, connections (store_op.c) */
void store_rows_free(op *o);
void store_b_vspec(opb *b, int kind, const char *spec, va_list ap);
void store_b_spec(opb *b, int kind, const char *spec, ...);
void store_b_release(opb *b);
op *store_b_pack(opb *b);
row *store_row_dup(const row *src);
void store_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool store_conn_stmt(conn *c, int k);
void store_conn_close(conn *c);
const char *store_conn_err(conn *c);
int store_stmt_exec(conn *c, int k, const val *v, int nv, row_fn each, void *arg, int *stopped,
                    int64_t *changes);
int store_exec_simple(conn *c, const char *sql, char *err, size_t errlen);

/* folding and held rows, under mu (store_fold.c) */
void store_pend_add(gps_store *s, op *o);
void store_pend_del(gps_store *s, op *o);
bool store_usage_fold_locked(gps_store *s, const op *o);
void store_usage_add_locked(gps_store *s, op *o);
void store_usage_del_locked(gps_store *s, op *o);
void store_usage_seal_locked(gps_store *s);
bool store_fold_locked(gps_store *s, op *o, bool coalesce, op **found);
bool store_fold_miss_locked(gps_store *s, op *o, bool coalesce, op *p);
bool store_would_hold(const gps_store *s, const op *o);
bool store_held_add_locked(gps_store *s, op *o, uint64_t now);
bool store_held_runs_first(const gps_store *s, const op *o);
bool store_held_due_locked(const gps_store *s, uint64_t now);
op *store_held_take_locked(gps_store *s, uint64_t now, bool all, uint64_t max);

/* the DB thread (store_db.c) */
bool store_op_is_read(const op *o);
void *store_db_main(void *arg);

/* the queue (store_queue.c) */
void store_enqueue_locked(gps_store *s, op *first, op *last, size_t count);
void store_free_chain(op *o);
int store_enqueue_ex(gps_store *s, op *first, bool droppable, uint64_t *seq_out, int row);
int store_enqueue(gps_store *s, op *first, bool droppable);
int store_enqueue_front(gps_store *s, op *o);
void store_count_drop(gps_store *s);
int store_enqueue_b(gps_store *s, opb *b, uint64_t *seq_out);
int store_write_op(gps_store *s, int kind, const char *spec, ...);
int store_row_op(gps_store *s, bool coalesce, int kind, const char *spec, ...);
op *store_read_op(int kind, const char *spec, ...);

/* read results on the loop (store_deliver.c) */
/* Column i of r as JSON (flags as json_loadb's): a new reference; NULL
 * for SQL NULL or a text that is not JSON (a damaged row: each caller says
 * what that reads as), or NULL with *oom set when an allocation failed
 * during the load (gp_json_load_checked: the text may well be JSON, and
 * jansson may have read it changed): then the caller's read fails, as it
 * does for a failed step. */
json_t *store_col_json(const row *r, int i, size_t flags, bool *oom);
/* The job of row r (JOB_COLUMNS) into *ji, borrowing from r, and its
 * request parsed into *request (new reference, or NULL; ji->request is the
 * same). 0, or -1 out of memory (*request NULL, ji partly filled). */
int store_job_info_from_row(const row *r, gps_store_job_info *ji, json_t **request);
/* The stored event log of job_id, read on c, into *events: one array of
 * {seq, type, data}, the batches concatenated in seq order (new
 * reference), NULL when there is none (or no job_events table). 0, or
 * with *events NULL -1 (a failed step: store_conn_err says why) or -2 (out
 * of memory). */
int store_events_collect(conn *c, const char *job_id, json_t **events);
void store_deliver_all(gps_store *s);
void store_on_wake(evutil_socket_t fd, short what, void *arg);

/* the async writers (store_write.c) */
bool store_key_row_has_extras(const gps_store_key_row *r);

#endif
