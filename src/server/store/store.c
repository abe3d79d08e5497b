/*
 * store.c: persistence behind a DB thread (contract in store.h), the
 * engine-neutral part: the statement table, ops and their bind spec, the
 * queue, the DB thread with its group commit, read results handed back to
 * the loop, migrations and start-up loads. A database engine is a table of
 * operations (store_engine.h): store_sqlite.c, store_pg.c.
 *
 * One way to run SQL. Every statement is a row of the table `stmts`
 * (name, flags, SQL). Its values are built by one bind spec (b_spec: "ttjz"
 * = text, text, JSON, integer-or-NULL) into an op, and run by stmt_exec
 * (bind, step every row into a row handler, reset), either on the DB thread
 * (writes and reads queued by the loop: group commit) or on the owner
 * thread's own connection (migrations, start-up loads, CLI writes:
 * sync_exec). Only transaction control and migration scripts go through
 * the engine's script(). A statement's SQL is portable (SQLite's dialect,
 * which PostgreSQL shares for most of what the store runs); where the two
 * differ (INSERT OR REPLACE, json_each, MIN as a scalar, ...) the row
 * carries PostgreSQL's own text beside it.
 *
 * Layout, low level to high level:
 *   - the statement table; values, ops and the bind spec;
 *   - connections (an engine's, behind conn_*) and stmt_exec;
 *   - the queue and the DB thread (group commit);
 *   - read results handed back to the loop through an event;
 *   - opening: the engine for the path or URI, migrations, statements;
 *   - the public async writers and readers, then the synchronous loads.
 */
#include "server/store/store.h"
#include "server/store/store_engine.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

/* ------------------------------------------------------------------------ */
/* Embedded migrations                                                      */
/* ------------------------------------------------------------------------ */

struct migration {
    int version;
    const char *name;
    const char *sql;
};

#include "store_migrations.inc"

#define N_EMBEDDED (sizeof(embedded_migrations) / sizeof(embedded_migrations[0]))

int gps_store_schema_version(void)
{
    int v = 0;
    for (size_t i = 0; i < N_EMBEDDED; i++)
        if (embedded_migrations[i].version > v)
            v = embedded_migrations[i].version;
    return v;
}

/* ------------------------------------------------------------------------ */
/* Statements                                                               */
/* ------------------------------------------------------------------------ */

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
 *   beside the row writes held for their row's end (held_add_locked)
 *   instead of running them first. With API keys a request queues a usage
 *   write at admission: were it to run the held writes, keyed deployments
 *   would lose the hold; and the heartbeat, queued ahead, would wait
 *   behind them. */
enum { F_OPT = 1, F_SYNC = 2, F_CELLS = 4, F_BESIDE = 8 };

#define JOB_COLUMNS                                                                          \
    "j.id, j.api, j.kind, j.model, j.key_id, j.agent_id, j.status, j.priority, j.attempts, " \
    "j.prompt_tokens, j.completion_tokens, j.queue_ms, j.ttft_ms, j.total_ms, "              \
    "j.finish_reason, j.error_code, j.correlation_id, j.seed, j.created_at, j.finished_at, " \
    "j.request, c.text, c.last_seq "                                                         \
    "FROM jobs j LEFT JOIN job_checkpoints c ON c.job_id = j.id "

#define PURGE_CHUNK 1000

/* Every statement the store runs. A row: the name (for logs), flags, and
 * the SQL; its parameters ?1..?N are bound from an op's values, which the
 * function that queues or runs it builds with one bind spec (b_spec). */
static const struct {
    const char *name;
    int flags;
    const char *sql;   /* portable: SQLite runs it, PostgreSQL too unless pg is set */
    const char *pg;    /* PostgreSQL's text where the dialects differ, or NULL */
} stmts[K_COUNT] = {

    [K_AGENT_UPSERT] = {"agent_upsert", F_BESIDE,
        "INSERT INTO agents (id, name, version, platform, state, labels, facts, key_id, "
        "first_seen, last_seen) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9) "
        "ON CONFLICT(id) DO UPDATE SET name = excluded.name, version = excluded.version, "
        "platform = excluded.platform, state = excluded.state, labels = excluded.labels, "
        "facts = excluded.facts, key_id = COALESCE(excluded.key_id, agents.key_id), "
        "last_seen = excluded.last_seen", NULL},

    [K_AGENT_STATE] = {"agent_state", F_BESIDE,
        "UPDATE agents SET state = ?2, "
        "last_seen = CASE WHEN ?3 > 0 THEN ?3 ELSE last_seen END WHERE id = ?1", NULL},

    [K_MODELS_CLEAR] = {"agent_models_clear", F_BESIDE, "DELETE FROM agent_models WHERE agent_id = ?1", NULL},

    [K_MODEL_INSERT] = {"agent_model_insert", F_BESIDE,
        "INSERT OR REPLACE INTO agent_models (agent_id, model, aliases, quantization, "
        "context_length, vram_bytes, loaded) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        "INSERT INTO agent_models (agent_id, model, aliases, quantization, context_length, "
        "vram_bytes, loaded) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (agent_id, model) "
        "DO UPDATE SET aliases = excluded.aliases, quantization = excluded.quantization, "
        "context_length = excluded.context_length, vram_bytes = excluded.vram_bytes, "
        "loaded = excluded.loaded"},

    [K_AGENT_DELETE] = {"agent_delete", F_BESIDE, "DELETE FROM agents WHERE id = ?1", NULL},

    [K_JOB_INSERT] = {"job_insert", 0,
        "INSERT INTO jobs (id, api, kind, model, key_id, status, priority, correlation_id, "
        "seed, created_at, request) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)", NULL},

    [K_JOB_UPDATE] = {"job_update", 0,
        "UPDATE jobs SET status = COALESCE(?2, status), agent_id = COALESCE(?3, agent_id), "
        "attempts = COALESCE(?4, attempts), prompt_tokens = COALESCE(?5, prompt_tokens), "
        "completion_tokens = COALESCE(?6, completion_tokens), "
        "queue_ms = COALESCE(?7, queue_ms), ttft_ms = COALESCE(?8, ttft_ms), "
        "total_ms = COALESCE(?9, total_ms), finish_reason = COALESCE(?10, finish_reason), "
        "error_code = COALESCE(?11, error_code), finished_at = COALESCE(?12, finished_at) "
        "WHERE id = ?1", NULL},

    [K_CHECKPOINT] = {"checkpoint", 0,
        "INSERT INTO job_checkpoints (job_id, text, last_seq, updated_at) "
        "VALUES (?1, ?2, ?3, ?4) ON CONFLICT(job_id) DO UPDATE SET text = excluded.text, "
        "last_seq = excluded.last_seq, updated_at = excluded.updated_at", NULL},

    [K_PURGE] = {"purge_jobs", 0,
        "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE finished_at IS NOT NULL "
        "AND finished_at < ?1 LIMIT 1000)", NULL},

    [K_KEY_INSERT] = {"key_insert", F_BESIDE,
        "INSERT INTO api_keys (id, hash, role, name, agent_id, created_at, expires_at, "
        "revoked_at, last_used_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)", NULL},

    [K_KEY_REVOKE] = {"key_revoke", F_BESIDE,
        "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL", NULL},

    [K_KEY_USED] = {"key_used", F_BESIDE, "UPDATE api_keys SET last_used_at = ?2 WHERE id = ?1", NULL},

    [K_KEY_BIND] = {"key_bind", F_BESIDE,
        "UPDATE api_keys SET agent_id = ?2 WHERE id = ?1 AND agent_id IS NULL", NULL},

    [K_JOB_GET] = {"job_get", 0, "SELECT " JOB_COLUMNS "WHERE j.id = ?1", NULL},

    [K_PING] = {"ping", 0, "SELECT count(*) FROM schema_migrations", NULL},

    [K_EVENTS_ADD] = {"job_events_add", F_OPT,
        "INSERT OR REPLACE INTO job_events (job_id, first_seq, last_seq, events, created_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5)",
        "INSERT INTO job_events (job_id, first_seq, last_seq, events, created_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (job_id, first_seq) DO UPDATE SET "
        "last_seq = excluded.last_seq, events = excluded.events, "
        "created_at = excluded.created_at"},

    [K_EVENTS_GET] = {"job_events_get", F_OPT,
        "SELECT events FROM job_events WHERE job_id = ?1 ORDER BY first_seq", NULL},

    [K_KEY_LIMITS] = {"key_limits", F_OPT | F_BESIDE,
        "UPDATE api_keys SET rpm = ?2, tokens_per_day = ?3, max_concurrent = ?4, "
        "max_uses = ?5 WHERE id = ?1", NULL},

    [K_KEY_USES] = {"key_uses", F_OPT | F_BESIDE, "UPDATE api_keys SET uses = ?2 WHERE id = ?1", NULL},

    [K_USAGE_ADD] = {"key_usage_add", F_OPT | F_BESIDE,
        "INSERT INTO key_usage (key_id, day, requests, prompt_tokens, completion_tokens, "
        "rate_limited) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(key_id, day) DO UPDATE "
        /* Saturating (limits.c's ceiling, INT64_MAX/4): SQLite turns an
         * overflowing sum into a REAL; MIN makes it an integer again. */
        "SET requests = MIN(requests + excluded.requests, 2305843009213693951), "
        "prompt_tokens = MIN(prompt_tokens + excluded.prompt_tokens, 2305843009213693951), "
        "completion_tokens = MIN(completion_tokens + excluded.completion_tokens, "
        "2305843009213693951), "
        "rate_limited = MIN(rate_limited + excluded.rate_limited, 2305843009213693951)",
        /* The same atomic add (one statement: two servers adding to one
         * key's day both count), LEAST for SQLite's scalar MIN. */
        "INSERT INTO key_usage (key_id, day, requests, prompt_tokens, completion_tokens, "
        "rate_limited) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (key_id, day) DO UPDATE "
        "SET requests = LEAST(key_usage.requests + excluded.requests, 2305843009213693951), "
        "prompt_tokens = LEAST(key_usage.prompt_tokens + excluded.prompt_tokens, "
        "2305843009213693951), completion_tokens = LEAST(key_usage.completion_tokens + "
        "excluded.completion_tokens, 2305843009213693951), rate_limited = "
        "LEAST(key_usage.rate_limited + excluded.rate_limited, 2305843009213693951)"},
    /* Same column layout as JOB_COLUMNS (job_info_from_row reads by
     * index) without the request and the checkpoint text: a list of up to
     * 1000 rows should not copy every prompt. NULL filters match all. */

    [K_JOB_LIST] = {"job_list", 0,
        "SELECT j.id, j.api, j.kind, j.model, j.key_id, j.agent_id, j.status, j.priority, "
        "j.attempts, j.prompt_tokens, j.completion_tokens, j.queue_ms, j.ttft_ms, "
        "j.total_ms, j.finish_reason, j.error_code, j.correlation_id, j.seed, "
        "j.created_at, j.finished_at, NULL, NULL, NULL FROM jobs j "
        "WHERE (?1 IS NULL OR j.status = ?1) AND (?2 IS NULL OR j.model = ?2) "
        "AND (?3 IS NULL OR j.agent_id = ?3) AND (?4 IS NULL OR j.key_id = ?4) "
        "AND (?5 IS NULL OR j.created_at < ?5) "
        "ORDER BY j.created_at DESC, j.id DESC LIMIT ?6",
        /* PostgreSQL cannot infer the type of a parameter only tested
         * for NULL: say it. */
        "SELECT j.id, j.api, j.kind, j.model, j.key_id, j.agent_id, j.status, j.priority, "
        "j.attempts, j.prompt_tokens, j.completion_tokens, j.queue_ms, j.ttft_ms, "
        "j.total_ms, j.finish_reason, j.error_code, j.correlation_id, j.seed, "
        "j.created_at, j.finished_at, NULL, NULL, NULL FROM jobs j "
        "WHERE (?1::text IS NULL OR j.status = ?1::text) "
        "AND (?2::text IS NULL OR j.model = ?2::text) "
        "AND (?3::text IS NULL OR j.agent_id = ?3::text) "
        "AND (?4::text IS NULL OR j.key_id = ?4::text) "
        "AND (?5::bigint IS NULL OR j.created_at < ?5::bigint) "
        "ORDER BY j.created_at DESC, j.id DESC LIMIT ?6"},

    [K_SCHEMA_VERSION] = {"schema_version", F_SYNC,
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations", NULL},

    [K_MIGRATION_RECORD] = {"migration_record", F_SYNC,
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)", NULL},

    [K_LOAD_AGENTS] = {"load_agents", F_SYNC,
        "SELECT id, name, version, platform, state, key_id, labels, facts, first_seen, "
        "last_seen FROM agents ORDER BY id", NULL},

    [K_LOAD_MODELS] = {"load_agent_models", F_SYNC,
        "SELECT model, aliases, quantization, context_length, vram_bytes, loaded "
        "FROM agent_models WHERE agent_id = ?1 ORDER BY model", NULL},
    /* With migration 0003's limit columns; K_LOAD_KEYS_BASE without them
     * (every key then loads as unlimited). */

    [K_LOAD_KEYS] = {"load_keys", F_SYNC | F_OPT,
        "SELECT id, hash, role, name, agent_id, created_at, expires_at, revoked_at, "
        "last_used_at, rpm, tokens_per_day, max_concurrent, max_uses, uses "
        "FROM api_keys ORDER BY created_at, id", NULL},

    [K_LOAD_KEYS_BASE] = {"load_keys_base", F_SYNC,
        "SELECT id, hash, role, name, agent_id, created_at, expires_at, revoked_at, "
        "last_used_at FROM api_keys ORDER BY created_at, id", NULL},

    [K_LOAD_JOBS] = {"load_unfinished_jobs", F_SYNC,
        "SELECT " JOB_COLUMNS "WHERE j.finished_at IS NULL ORDER BY j.created_at, j.id", NULL},

    [K_LOAD_USAGE] = {"load_usage", F_SYNC,
        "SELECT key_id, requests, prompt_tokens, completion_tokens, rate_limited "
        "FROM key_usage WHERE day = ?1", NULL},
    /* Model pins (migration 0005). */

    [K_PIN_SET] = {"model_pin_set", F_OPT | F_BESIDE,
        "INSERT INTO model_pins (name, sha256, created_at, created_by) VALUES (?1, ?2, ?3, ?4) "
        "ON CONFLICT(name) DO UPDATE SET sha256 = excluded.sha256, "
        "created_at = excluded.created_at, created_by = excluded.created_by", NULL},

    [K_PIN_DELETE] = {"model_pin_delete", F_OPT | F_BESIDE, "DELETE FROM model_pins WHERE name = ?1", NULL},

    [K_LOAD_PINS] = {"load_model_pins", F_SYNC | F_OPT,
        "SELECT name, sha256, created_at, created_by FROM model_pins ORDER BY name", NULL},
    /* Deployments (migration 0007). Replicas go with their deployment
     * (ON DELETE CASCADE). */

    [K_DEPLOY_PUT] = {"deployment_put", F_OPT | F_BESIDE,
        "INSERT INTO deployments (name, source, sha256, replicas, labels, bytes, created_at, "
        "created_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(name) DO UPDATE SET "
        "source = excluded.source, sha256 = excluded.sha256, replicas = excluded.replicas, "
        "labels = excluded.labels, bytes = excluded.bytes", NULL},

    [K_DEPLOY_DELETE] = {"deployment_delete", F_OPT | F_BESIDE, "DELETE FROM deployments WHERE name = ?1", NULL},

    [K_REPLICA_PUT] = {"replica_put", F_OPT | F_BESIDE,
        "INSERT OR REPLACE INTO deployment_replicas (deployment, agent_id, state, reason, "
        "bytes, total, rate, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        "INSERT INTO deployment_replicas (deployment, agent_id, state, reason, bytes, total, "
        "rate, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (deployment, "
        "agent_id) DO UPDATE SET state = excluded.state, reason = excluded.reason, "
        "bytes = excluded.bytes, total = excluded.total, rate = excluded.rate, "
        "updated_at = excluded.updated_at"},

    [K_REPLICA_DELETE] = {"replica_delete", F_OPT | F_BESIDE,
        "DELETE FROM deployment_replicas WHERE deployment = ?1 AND agent_id = ?2", NULL},

    [K_LOAD_DEPLOYS] = {"load_deployments", F_SYNC | F_OPT,
        "SELECT name, source, sha256, replicas, labels, bytes, created_at, created_by "
        "FROM deployments ORDER BY name", NULL},

    [K_LOAD_REPLICAS] = {"load_deployment_replicas", F_SYNC | F_OPT,
        "SELECT deployment, agent_id, state, reason, bytes, total, rate, updated_at "
        "FROM deployment_replicas ORDER BY deployment, agent_id", NULL},
    /* Stored responses (migration 0006). The items come as one JSON array
     * of {id, message} and land in one statement. */

    [K_RESP_PUT] = {"response_put", F_OPT | F_BESIDE,
        "INSERT OR REPLACE INTO responses (id, key_id, created_at, expires_at, object, "
        "context) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        /* Ids are random and never stored twice; an update keeps the
         * items (SQLite's REPLACE would drop them with the old row). */
        "INSERT INTO responses (id, key_id, created_at, expires_at, object, context) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (id) DO UPDATE SET "
        "key_id = excluded.key_id, created_at = excluded.created_at, "
        "expires_at = excluded.expires_at, object = excluded.object, "
        "context = excluded.context"},

    [K_RESP_ITEMS_PUT] = {"response_items_put", F_OPT | F_BESIDE,
        "INSERT OR REPLACE INTO response_items (item_id, response_id, key_id, message) "
        "SELECT json_extract(value, '$.id'), ?1, ?2, json_extract(value, '$.message') "
        "FROM json_each(?3)",
        /* json, not jsonb: the message's text is kept as written. */
        "INSERT INTO response_items (item_id, response_id, key_id, message) "
        "SELECT e->>'id', ?1, ?2, e->>'message' FROM json_array_elements(?3::json) AS e "
        "ON CONFLICT (item_id) DO UPDATE SET response_id = excluded.response_id, "
        "key_id = excluded.key_id, message = excluded.message"},
    /* A key keeps its newest ?2 responses. */

    [K_RESP_TRIM] = {"response_trim", F_OPT | F_BESIDE,
        "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE key_id = ?1 "
        "ORDER BY created_at DESC, id DESC LIMIT -1 OFFSET ?2)",
        "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE key_id = ?1 "
        "ORDER BY created_at DESC, id DESC OFFSET ?2)"},

    [K_RESP_GET] = {"response_get", F_OPT | F_CELLS | F_BESIDE,
        "SELECT object, context FROM responses WHERE id = ?1 AND key_id = ?2 "
        "AND expires_at > ?3", NULL},

    [K_RESP_ITEMS_GET] = {"response_items_get", F_OPT | F_CELLS | F_BESIDE,
        "SELECT i.item_id, i.message FROM response_items i JOIN responses r "
        "ON r.id = i.response_id WHERE i.key_id = ?1 AND r.expires_at > ?3 "
        "AND i.item_id IN (SELECT value FROM json_each(?2))",
        "SELECT i.item_id, i.message FROM response_items i JOIN responses r "
        "ON r.id = i.response_id WHERE i.key_id = ?1 AND r.expires_at > ?3 "
        "AND i.item_id IN (SELECT json_array_elements_text(?2::json))"},

    [K_RESP_DELETE] = {"response_delete", F_OPT | F_CELLS | F_BESIDE,
        "DELETE FROM responses WHERE id = ?1 AND key_id = ?2", NULL},

    [K_RESP_PURGE] = {"response_purge", F_OPT | F_BESIDE,
        "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE expires_at < ?1 "
        "LIMIT 1000)", NULL},

    /* Servers (migration 0009). The announce and every heartbeat are one
     * upsert: a row lost meanwhile (a purge by another server after a long
     * partition) comes back whole. */
    [K_SERVER_BEAT] = {"server_beat", F_OPT | F_BESIDE,
        "INSERT INTO servers (id, name, url, pid, version, started_at, heartbeat_at, "
        "lease_until, stopped_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL) "
        "ON CONFLICT(id) DO UPDATE SET name = excluded.name, url = excluded.url, "
        "heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until, "
        "stopped_at = NULL", NULL},

    [K_SERVER_STOP] = {"server_stop", F_OPT | F_BESIDE,
        "UPDATE servers SET stopped_at = ?2, lease_until = ?2 WHERE id = ?1", NULL},

    [K_SERVER_PURGE] = {"server_purge", F_OPT | F_BESIDE,
        "DELETE FROM servers WHERE lease_until < ?1", NULL},

    [K_SERVER_LIST] = {"server_list", F_OPT | F_BESIDE,
        "SELECT id, name, url, pid, version, started_at, heartbeat_at, lease_until, stopped_at "
        "FROM servers ORDER BY started_at, id", NULL},

    [K_KEYS_GET] = {"keys_get", F_OPT | F_BESIDE,
        "SELECT id, hash, role, name, agent_id, created_at, expires_at, revoked_at, "
        "last_used_at, rpm, tokens_per_day, max_concurrent, max_uses, uses "
        "FROM api_keys ORDER BY created_at, id", NULL},

    [K_USAGE_GET] = {"usage_get", F_OPT | F_BESIDE,
        "SELECT key_id, requests, prompt_tokens, completion_tokens, rate_limited "
        "FROM key_usage WHERE day = ?1", NULL},
    /* Wake the listeners of channel ?1 with payload ?2 (gps_store_notify).
     * PostgreSQL delivers it when its transaction commits: queued after a
     * write, never before that write is committed. SQLite never runs it
     * (one server: nobody to wake); its text only has to prepare. */

    [K_NOTIFY] = {"notify", F_OPT, "SELECT ?1, ?2", "SELECT pg_notify(?1, ?2)"},
    /* Native tasks across servers (migration 0010, docs/scaling.md "Native
     * tasks across servers"). A new task's lease. */

    [K_TASK_OWN] = {"task_own", F_OPT,
        "UPDATE jobs SET owner_server = ?2, lease_until = ?3, lease_attempt = ?4 "
        "WHERE id = ?1", NULL},
    /* Every unfinished task this server holds, in one statement. */

    [K_TASK_RENEW] = {"task_renew", F_OPT,
        "UPDATE jobs SET lease_until = ?2 WHERE owner_server = ?1 AND finished_at IS NULL",
        NULL},
    /* Take over unfinished native tasks whose lease expired (a row written
     * before 0010 has none: a minute after its creation), of the models
     * in ?4 (a JSON array: what this server's agents serve), at most ?5.
     * The outer WHERE repeats the expiry: on PostgreSQL a second server's
     * UPDATE waits for the first one's row lock and then re-checks it on
     * the new row, so each expired lease is taken once. Returns the rows
     * taken with their new attempt (the fencing token). */

    [K_TASK_CLAIM] = {"task_claim", F_OPT | F_CELLS,
        "UPDATE jobs SET owner_server = ?1, lease_until = ?2, "
        "lease_attempt = lease_attempt + 1 WHERE id IN (SELECT id FROM jobs "
        "WHERE finished_at IS NULL AND api = 'native' "
        "AND COALESCE(lease_until, created_at + 60000) < ?3 "
        "AND model IN (SELECT value FROM json_each(?4)) LIMIT ?5) "
        "AND finished_at IS NULL AND COALESCE(lease_until, created_at + 60000) < ?3 "
        "RETURNING id, CAST(lease_attempt AS TEXT)",
        "UPDATE jobs SET owner_server = ?1, lease_until = ?2, "
        "lease_attempt = lease_attempt + 1 WHERE id IN (SELECT id FROM jobs "
        "WHERE finished_at IS NULL AND api = 'native' "
        "AND COALESCE(lease_until, created_at + 60000) < ?3::bigint "
        "AND model IN (SELECT json_array_elements_text(?4::json)) LIMIT ?5) "
        "AND finished_at IS NULL AND COALESCE(lease_until, created_at + 60000) < ?3::bigint "
        "RETURNING id, CAST(lease_attempt AS TEXT)"},
    /* A request-log row with the server that holds its client (a shared
     * DB): K_JOB_INSERT plus owner_server ?12. */

    [K_JOB_INSERT_OWNED] = {"job_insert_owned", F_OPT,
        "INSERT INTO jobs (id, api, kind, model, key_id, status, priority, correlation_id, "
        "seed, created_at, request, owner_server) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)", NULL},
    /* Unfinished OpenAI/Anthropic requests whose server is gone: its row in
     * servers has had no renewal since ?2 (now minus two leases) or was
     * purged. Rows without an owner (written before owners were recorded)
     * count as gone once created before ?2. Native tasks are left to the
     * claim (K_TASK_CLAIM). */

    [K_JOBS_FAIL_ORPHANS] = {"jobs_fail_orphans", F_OPT | F_CELLS,
        "UPDATE jobs SET status = 'failed', error_code = 'SERVER_RESTART', finished_at = ?1 "
        "WHERE finished_at IS NULL AND api <> 'native' AND ((owner_server IS NULL AND "
        "created_at < ?2) OR (owner_server IS NOT NULL AND owner_server NOT IN "
        "(SELECT id FROM servers WHERE lease_until >= ?2)))",
        NULL},
    /* K_EVENTS_ADD for the holder of attempt ?6 only: for an older attempt
     * the events are NULL, which NOT NULL refuses (the write fails, is
     * logged and is not released to clients). */

    [K_EVENTS_ADD_FENCED] = {"job_events_add_fenced", F_OPT,
        "INSERT OR REPLACE INTO job_events (job_id, first_seq, last_seq, events, created_at) "
        "VALUES (?1, ?2, ?3, CASE WHEN EXISTS (SELECT 1 FROM jobs WHERE id = ?1 "
        "AND lease_attempt = ?6) THEN ?4 END, ?5)",
        "INSERT INTO job_events (job_id, first_seq, last_seq, events, created_at) "
        "VALUES (?1, ?2, ?3, CASE WHEN EXISTS (SELECT 1 FROM jobs WHERE id = ?1::text "
        "AND lease_attempt = ?6::bigint) THEN ?4::text END, ?5) "
        "ON CONFLICT (job_id, first_seq) DO UPDATE SET "
        "last_seq = excluded.last_seq, events = excluded.events, "
        "created_at = excluded.created_at"},
    /* A follower on another server: the batches holding seqs after ?2,
     * with the row's finished_at (no row: the task is gone). */

    [K_TASK_FOLLOW] = {"task_follow", F_OPT | F_CELLS,
        "SELECT CAST(j.finished_at AS TEXT), e.events FROM jobs j LEFT JOIN job_events e "
        "ON e.job_id = j.id AND e.last_seq > ?2 WHERE j.id = ?1 ORDER BY e.first_seq", NULL},
    /* The attempt a task's lease is at (its holder checks it after a
     * fenced write failed). */

    [K_TASK_LEASE_GET] = {"task_lease_get", F_OPT | F_CELLS,
        "SELECT CAST(lease_attempt AS TEXT) FROM jobs WHERE id = ?1", NULL},
    /* K_JOB_UPDATE and K_CHECKPOINT by the holder of lease attempt ?13 /
     * ?5 only: a server that lost its task's lease changes nothing. */

    [K_JOB_UPDATE_FENCED] = {"job_update_fenced", F_OPT,
        "UPDATE jobs SET status = COALESCE(?2, status), agent_id = COALESCE(?3, agent_id), "
        "attempts = COALESCE(?4, attempts), prompt_tokens = COALESCE(?5, prompt_tokens), "
        "completion_tokens = COALESCE(?6, completion_tokens), "
        "queue_ms = COALESCE(?7, queue_ms), ttft_ms = COALESCE(?8, ttft_ms), "
        "total_ms = COALESCE(?9, total_ms), finish_reason = COALESCE(?10, finish_reason), "
        "error_code = COALESCE(?11, error_code), finished_at = COALESCE(?12, finished_at) "
        "WHERE id = ?1 AND lease_attempt = ?13", NULL},

    [K_CHECKPOINT_FENCED] = {"checkpoint_fenced", F_OPT,
        "INSERT INTO job_checkpoints (job_id, text, last_seq, updated_at) "
        "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ?1 "
        "AND lease_attempt = ?5) ON CONFLICT(job_id) DO UPDATE SET text = excluded.text, "
        "last_seq = excluded.last_seq, updated_at = excluded.updated_at",
        "INSERT INTO job_checkpoints (job_id, text, last_seq, updated_at) "
        "SELECT ?1::text, ?2::text, ?3::bigint, ?4::bigint WHERE EXISTS (SELECT 1 FROM jobs "
        "WHERE id = ?1::text AND lease_attempt = ?5::bigint) ON CONFLICT (job_id) DO UPDATE "
        "SET text = excluded.text, last_seq = excluded.last_seq, "
        "updated_at = excluded.updated_at"},

    /* The hand-off of a job to another server (migration 0011,
     * docs/scaling.md "3e"). What this server's healthy agents serve. */
    [K_SERVER_MODELS] = {"server_models", F_OPT | F_BESIDE,
        "UPDATE servers SET models = ?2 WHERE id = ?1", NULL},
    /* What the other live servers serve: where a hand-off may go. */

    [K_HANDOFF_PEERS] = {"handoff_peers", F_OPT | F_CELLS | F_BESIDE,
        "SELECT models FROM servers WHERE id <> ?1 AND lease_until >= ?2 "
        "AND models IS NOT NULL", NULL},

    /* Migration 0013: what this server's free ready agents could take
     * now, and the same of the other live servers beside their models
     * (K_HANDOFF_PEERS with the free column). */
    [K_SERVER_FREE] = {"server_free", F_OPT | F_BESIDE,
        "UPDATE servers SET free = ?2 WHERE id = ?1", NULL},

    [K_HANDOFF_PEERS_FREE] = {"handoff_peers_free", F_OPT | F_CELLS | F_BESIDE,
        "SELECT models, free FROM servers WHERE id <> ?1 AND lease_until >= ?2 "
        "AND models IS NOT NULL", NULL},

    [K_HANDOFF_OFFER] = {"handoff_offer", F_OPT,
        "INSERT INTO handoffs (job_id, model, spec, from_server, state, attempt, created_at, "
        "deadline) VALUES (?1, ?2, ?3, ?4, 'waiting', 0, ?5, ?6)", NULL},
    /* Take at most ?4 waiting offers of the models in ?3 (a JSON array)
     * before their deadline, oldest first: claimed by ?1, attempt + 1 (the
     * fencing token). On PostgreSQL SKIP LOCKED: two servers claiming at
     * once take disjoint rows and never wait on each other. */

    [K_HANDOFF_CLAIM] = {"handoff_claim", F_OPT | F_CELLS,
        "UPDATE handoffs SET state = 'claimed', claimed_by = ?1, attempt = attempt + 1 "
        "WHERE job_id IN (SELECT job_id FROM handoffs WHERE state = 'waiting' "
        "AND deadline > ?2 AND model IN (SELECT value FROM json_each(?3)) "
        "AND from_server <> ?1 ORDER BY created_at LIMIT ?4) AND state = 'waiting' "
        "RETURNING job_id, spec, CAST(attempt AS TEXT)",
        "UPDATE handoffs SET state = 'claimed', claimed_by = ?1, attempt = attempt + 1 "
        "WHERE job_id IN (SELECT job_id FROM handoffs WHERE state = 'waiting' "
        "AND deadline > ?2::bigint AND model IN (SELECT json_array_elements_text(?3::json)) "
        "AND from_server <> ?1 ORDER BY created_at LIMIT ?4 FOR UPDATE SKIP LOCKED) "
        "RETURNING job_id, spec, CAST(attempt AS TEXT)"},
    /* What a claimer looks at before it claims: at most ?4 waiting offers
     * of the models in ?3 (a JSON array; an offer whose fallback_models
     * name one of them too: a server that serves only a fallback runs the
     * job under it) before their deadline, of other
     * servers than ?1, oldest first, with what constrains where they run
     * (the spec's "constraints" member) but not the spec. No lock: the
     * claim below decides. */

    [K_HANDOFF_PEEK] = {"handoff_peek", F_OPT | F_CELLS,
        "SELECT job_id, model, json_extract(spec, '$.constraints') FROM handoffs "
        "WHERE state = 'waiting' AND deadline > ?2 AND from_server <> ?1 "
        "AND (model IN (SELECT value FROM json_each(?3)) OR EXISTS (SELECT 1 FROM "
        "json_each(spec, '$.constraints.fallback_models') fb WHERE fb.value IN "
        "(SELECT value FROM json_each(?3)))) ORDER BY created_at LIMIT ?4",
        "SELECT job_id, model, (spec::json -> 'constraints')::text FROM handoffs "
        "WHERE state = 'waiting' AND deadline > ?2::bigint AND from_server <> ?1::text "
        "AND (model IN (SELECT json_array_elements_text(?3::json)) OR EXISTS (SELECT 1 "
        "FROM json_array_elements_text(COALESCE(spec::json -> 'constraints' -> "
        "'fallback_models', '[]'::json)) fb WHERE fb IN "
        "(SELECT json_array_elements_text(?3::json)))) ORDER BY created_at LIMIT ?4"},
    /* Claim the offers ?3 (a JSON array of job ids) still waiting before
     * their deadline, as K_HANDOFF_CLAIM (SKIP LOCKED on PostgreSQL: an
     * offer a racing claimer or its withdraw holds is left out). */

    [K_HANDOFF_CLAIM_IDS] = {"handoff_claim_ids", F_OPT | F_CELLS,
        "UPDATE handoffs SET state = 'claimed', claimed_by = ?1, attempt = attempt + 1 "
        "WHERE job_id IN (SELECT value FROM json_each(?3)) AND state = 'waiting' "
        "AND deadline > ?2 RETURNING job_id, spec, CAST(attempt AS TEXT)",
        "UPDATE handoffs SET state = 'claimed', claimed_by = ?1, attempt = attempt + 1 "
        "WHERE job_id IN (SELECT job_id FROM handoffs WHERE job_id IN "
        "(SELECT json_array_elements_text(?3::json)) AND state = 'waiting' "
        "AND deadline > ?2::bigint FOR UPDATE SKIP LOCKED) "
        "RETURNING job_id, spec, CAST(attempt AS TEXT)"},
    /* A relayed batch, stored only while the row is claimed by ?7 at
     * attempt ?6: else the events are NULL, which NOT NULL refuses (as
     * K_EVENTS_ADD_FENCED). */

    [K_HANDOFF_EVENTS] = {"handoff_events", F_OPT | F_CELLS,
        "INSERT INTO job_events (job_id, first_seq, last_seq, events, created_at) "
        "VALUES (?1, ?2, ?3, CASE WHEN EXISTS (SELECT 1 FROM handoffs WHERE job_id = ?1 "
        "AND attempt = ?6 AND claimed_by = ?7 AND state = 'claimed') THEN ?4 END, ?5)",
        "INSERT INTO job_events (job_id, first_seq, last_seq, events, created_at) "
        "VALUES (?1::text, ?2, ?3, CASE WHEN EXISTS (SELECT 1 FROM handoffs "
        "WHERE job_id = ?1::text AND attempt = ?6::bigint AND claimed_by = ?7::text "
        "AND state = 'claimed') THEN ?4::text END, ?5)"},
    /* The offering server's follower: the row's state, claimer and
     * attempt, and the relayed batches holding seqs from ?2 on. */

    [K_HANDOFF_FOLLOW] = {"handoff_follow", F_OPT | F_CELLS,
        "SELECT h.state, h.claimed_by, CAST(h.attempt AS TEXT), CAST(e.first_seq AS TEXT), "
        "e.events FROM handoffs h LEFT JOIN job_events e ON e.job_id = h.job_id "
        "AND e.last_seq >= ?2 WHERE h.job_id = ?1 ORDER BY e.first_seq", NULL},
    /* The claimer: which of its rows are still its own (the others were
     * cancelled, or taken back after its lease lapsed). */

    [K_HANDOFF_MINE] = {"handoff_mine", F_OPT | F_CELLS,
        "SELECT job_id, CAST(attempt AS TEXT) FROM handoffs "
        "WHERE claimed_by = ?1 AND state = 'claimed'", NULL},

    [K_HANDOFF_CANCEL] = {"handoff_cancel", F_OPT,
        "UPDATE handoffs SET state = 'cancelled' WHERE job_id = ?1", NULL},

    [K_HANDOFF_DELETE] = {"handoff_delete", F_OPT,
        "DELETE FROM handoffs WHERE job_id = ?1", NULL},
    /* The offering server takes back an offer of a job its own agent can
     * run now: res->changes 1 withdrawn, 0 claimed by a peer first (the
     * claim's row lock is held to its commit, so the two never both win). */

    [K_HANDOFF_WITHDRAW] = {"handoff_withdraw", F_OPT | F_CELLS,
        "DELETE FROM handoffs WHERE job_id = ?1 AND state = 'waiting'", NULL},
    /* Rows claimed by a server whose lease ended go back to waiting. */

    [K_HANDOFF_SWEEP] = {"handoff_sweep", F_OPT | F_CELLS,
        "UPDATE handoffs SET state = 'waiting', claimed_by = NULL WHERE state = 'claimed' "
        "AND claimed_by NOT IN (SELECT id FROM servers WHERE lease_until >= ?1)", NULL},
    /* Offers of a server that is gone: their client went with it. */

    [K_HANDOFF_SWEEP_FROM] = {"handoff_sweep_from", F_OPT,
        "UPDATE handoffs SET state = 'cancelled' WHERE state <> 'cancelled' "
        "AND from_server NOT IN (SELECT id FROM servers WHERE lease_until >= ?1)", NULL},
    /* A DELETE answered by a server that does not run the task: ask its
     * owner (migration 0012). res->changes 0: no such unfinished native
     * task (finished meanwhile, or never was). */

    [K_TASK_CANCEL_REQ] = {"task_cancel_request", F_OPT | F_CELLS,
        "UPDATE jobs SET cancel_requested = ?2 WHERE id = ?1 AND api = 'native' "
        "AND finished_at IS NULL", NULL},
    /* The cancels asked of the unfinished tasks ?1 holds. */

    [K_TASK_CANCELS] = {"task_cancels", F_OPT | F_CELLS,
        "SELECT id FROM jobs WHERE owner_server = ?1 AND finished_at IS NULL "
        "AND cancel_requested IS NOT NULL", NULL},
    /* One task's mark (a claimant reads it before resuming the task). */

    [K_TASK_CANCEL_GET] = {"task_cancel_get", F_OPT | F_CELLS,
        "SELECT CAST(cancel_requested AS TEXT) FROM jobs WHERE id = ?1", NULL},
    /* A request-log row written whole: K_JOB_INSERT_OWNED with the
     * K_JOB_UPDATE values that reached the queue while its insert still
     * waited there (fold_pack; issue 24: one statement a request instead
     * of three). */

    [K_JOB_INSERT_ROW] = {"job_insert_row", F_OPT,
        "INSERT INTO jobs (id, api, kind, model, key_id, status, priority, correlation_id, "
        "seed, created_at, request, owner_server, agent_id, attempts, prompt_tokens, "
        "completion_tokens, queue_ms, ttft_ms, total_ms, finish_reason, error_code, "
        "finished_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
        "?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)", NULL},
};

/* ------------------------------------------------------------------------ */
/* Values and ops                                                           */
/* ------------------------------------------------------------------------ */

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
    gps_store_status_fn status_cb;   /* server_beat */
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
    /* A key's usage add open to folding (usage_fold_locked): in the
     * store's usage table while it waits in the queue. */
    bool in_usage;
    struct op *unext;          /* usage table chain */
    /* Taken off the queue while its row was open: held back for the row's
     * later writes to fold into it (held_add_locked). */
    bool held;
    uint64_t hold_until_us;    /* monotonic: runs then at the latest */
    struct op *hnext;          /* held list chain */
    char msg[160];             /* ping: failure text */
    int nv;
    val v[];
} op;

static void rows_free(op *o)
{
    for (size_t i = 0; i < o->nrows; i++)
        free(o->rows[i]);
    free(o->rows);
    o->rows = NULL;
    o->nrows = 0;
}

#define MAXV 24

/* Builder: values borrowed from the caller (or owned temporaries from
 * json_dumps), packed into one op by b_pack. */
typedef struct opb {
    int kind;
    int nv;
    val v[MAXV];
    char *owned[MAXV];
    int nowned;
    bool oom;
} opb;

static val *b_slot(opb *b)
{
    if (b->nv >= MAXV) {   /* programming error: MAXV too small for a statement */
        b->oom = true;
        return NULL;
    }
    val *v = &b->v[b->nv++];
    memset(v, 0, sizeof(*v));
    return v;
}

static void b_textn(opb *b, const char *s, size_t len)
{
    val *v = b_slot(b);
    if (v && s) {
        v->t = V_TEXT;
        v->s = s;
        v->len = len;
    }
}

static void b_int(opb *b, int64_t i)
{
    val *v = b_slot(b);
    if (v) {
        v->t = V_INT;
        v->i = i;
    }
}

/* The values of statement kind, from a bind spec: one character per
 * parameter ?1, ?2, ... in order, each taking its argument(s):
 *   t  const char *           text (NULL binds NULL)
 *   T  const char *, size_t   text of that length (NULL binds NULL)
 *   i  int64_t                integer
 *   n  int64_t                integer, NULL when negative ("unchanged", "unknown")
 *   z  int64_t                integer, NULL when zero ("never", "none")
 *   j  const json_t *         compact JSON text (NULL binds NULL)
 *   -                         NULL (no argument)
 * Integers are read as int64_t: callers cast. Text is borrowed until
 * b_pack or b_release; JSON is serialised here (owned by b). */
static void b_vspec(opb *b, int kind, const char *spec, va_list ap)
{
    memset(b, 0, sizeof(*b));
    b->kind = kind;
    for (const char *c = spec; *c; c++) {
        switch (*c) {
        case 't': {
            const char *t = va_arg(ap, const char *);
            b_textn(b, t, t ? strlen(t) : 0);
            break;
        }
        case 'T': {
            const char *t = va_arg(ap, const char *);
            size_t len = va_arg(ap, size_t);
            b_textn(b, t, len);
            break;
        }
        case 'i':
        case 'n':
        case 'z': {
            int64_t i = va_arg(ap, int64_t);
            if ((*c == 'n' && i < 0) || (*c == 'z' && i == 0))
                b_slot(b);
            else
                b_int(b, i);
            break;
        }
        case 'j': {
            const json_t *j = va_arg(ap, const json_t *);
            /* gp_json_dump_append writes json_dumps' bytes at a fraction of
             * its cost: a stored Responses reply (3 values, the loop's
             * thread) was ~200,000 instructions through json_dumps. */
            gp_buf d;
            gp_buf_init(&d);
            char *txt = NULL;
            if (j && gp_json_dump_append(&d, j) == 0 && gp_buf_append(&d, "", 0) == 0)
                txt = gp_buf_steal(&d);
            gp_buf_free(&d);
            if (j && !txt)
                b->oom = true;
            if (txt)
                b->owned[b->nowned++] = txt;
            b_textn(b, txt, txt ? strlen(txt) : 0);
            break;
        }
        default:   /* '-' */
            b_slot(b);
            break;
        }
    }
}

static void b_spec(opb *b, int kind, const char *spec, ...)
{
    va_list ap;
    va_start(ap, spec);
    b_vspec(b, kind, spec, ap);
    va_end(ap);
}

static void b_release(opb *b)
{
    for (int i = 0; i < b->nowned; i++)
        free(b->owned[i]);
    b->nowned = 0;
}

/* Pack the builder into one allocation (new op, caller owns). NULL on
 * ENOMEM. Releases the builder's temporaries in both cases. */
static op *b_pack(opb *b)
{
    op *o = NULL;
    if (b->oom)
        goto done;
    size_t total = sizeof(op) + (size_t)b->nv * sizeof(val);
    for (int i = 0; i < b->nv; i++)
        if (b->v[i].t == V_TEXT)
            total += b->v[i].len + 1;
    o = calloc(1, total);
    if (!o)
        goto done;
    o->kind = b->kind;
    o->nv = b->nv;
    char *p = (char *)&o->v[b->nv];
    for (int i = 0; i < b->nv; i++) {
        o->v[i] = b->v[i];
        if (b->v[i].t == V_TEXT) {
            memcpy(p, b->v[i].s, b->v[i].len);
            p[b->v[i].len] = '\0';
            o->v[i].s = p;
            p += b->v[i].len + 1;
        }
    }
done:
    b_release(b);
    return o;
}

/* Copy a row an engine lent (new, caller frees). NULL on ENOMEM. */
static row *row_dup(const row *src)
{
    int n = src->n;
    size_t total = sizeof(row) + (size_t)n * sizeof(val);
    for (int i = 0; i < n; i++)
        if (src->v[i].t == V_TEXT)
            total += src->v[i].len + 1;
    row *r = calloc(1, total);
    if (!r)
        return NULL;
    r->n = n;
    char *p = (char *)&r->v[n];
    for (int i = 0; i < n; i++) {
        r->v[i] = src->v[i];
        if (src->v[i].t == V_TEXT) {
            if (src->v[i].len)
                memcpy(p, src->v[i].s, src->v[i].len);
            p[src->v[i].len] = '\0';
            r->v[i].s = p;
            p += src->v[i].len + 1;
        }
    }
    return r;
}

static const char *rs(const row *r, int i) { return r->v[i].t == V_TEXT ? r->v[i].s : NULL; }
static int64_t ri(const row *r, int i, int64_t dflt)
{
    return r->v[i].t == V_INT ? r->v[i].i : dflt;
}

/* A count read back (tokens, attempts, ms): a row out of range (written
 * before the server bounded what agents report, or edited by hand) is
 * clamped into 0..max so that no reader's sum overflows; NULL stays dflt. */
static int64_t ri_count(const row *r, int i, int64_t dflt, int64_t max)
{
    if (r->v[i].t != V_INT)
        return dflt;
    return r->v[i].i < 0 ? dflt : r->v[i].i > max ? max : r->v[i].i;
}
#define STORE_MAX_COUNT (1LL << 40)

/* ------------------------------------------------------------------------ */
/* The store                                                                */
/* ------------------------------------------------------------------------ */

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
    uint64_t row_hold_us;        /* 0: rows are not held (held_add_locked) */

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
                                    a plain write need not wake it (enqueue_locked) */
    int flush_waiters;
    size_t q_nowait;             /* queued ops that are not may_wait (db_hold) */
    uint64_t seq_enqueued;
    uint64_t seq_done;           /* every op with seq <= this is executed and committed */
    uint64_t seq_taken;          /* the highest seq taken off the queue */
    op *hhead, *htail;           /* held row writes, in the order taken (held_add_locked) */
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

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Is statement k of the table prepared on c (on first use)? false when
 * this DB's schema cannot run it (errmsg(c) says why, on the first try). */
static bool conn_stmt(conn *c, int k)
{
    if (!c->tried[k]) {
        c->tried[k] = true;
        c->ok[k] = c->eng->prepare(c->h, k, stmts[k].sql, stmts[k].pg) == 0;
    }
    return c->ok[k];
}

static void conn_close(conn *c)
{
    if (c->h)
        c->eng->conn_close(c->h);
    const gps_store__engine *eng = c->eng;
    memset(c, 0, sizeof(*c));
    c->eng = eng;
}

static const char *conn_err(conn *c) { return c->h ? c->eng->errmsg(c->h) : "no connection"; }

/* The one way a statement runs, on the DB thread and the owner thread
 * alike: prepare k if needed, bind v[0..nv) to ?1..?nv, each row to each
 * (NULL: rows are ignored). 0 (every row, or *stopped = each's non-zero
 * value) or -1 (conn_err says why). *changes (may be NULL): rows changed. */
static int stmt_exec(conn *c, int k, const val *v, int nv, row_fn each, void *arg, int *stopped,
                     int64_t *changes)
{
    int64_t ch = 0;
    *stopped = 0;
    if (!conn_stmt(c, k))
        return -1;
    int rc = c->eng->exec(c->h, k, v, nv, each, arg, stopped, &ch);
    if (changes)
        *changes = ch;
    return rc;
}

static int exec_simple(conn *c, const char *sql, char *err, size_t errlen)
{
    return c->eng->script(c->h, sql, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* DB thread                                                                */
/* ------------------------------------------------------------------------ */

static void enqueue_locked(gps_store *s, op *first, op *last, size_t count);

/* ------------------------------------------------------------------------ */
/* Folding job-row writes                                                   */
/* ------------------------------------------------------------------------ */

/* A request-log row was three statements (insert at submit, update at
 * assignment, update at the end: ~20,000 instructions each on SQLite, a
 * fifth of the server's cost per request; issue 24). Writes run at the
 * group commit that follows them, so the updates of a row whose earlier
 * write still waits in the queue fold into that write: the row is written
 * once, whole, by the statement that was queued first, and ends as if
 * every write had run, at the commit it would have had. Only writes the
 * caller marks coalesce fold (no other op of the store concerns that row:
 * no native task events, checkpoints or handoffs to stay ordered with).
 * Guarded by mu: the DB thread takes an op out of the table as it takes
 * it off the queue. */
#define PEND_BUCKETS 1024

static size_t pend_slot(const char *id)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h & (PEND_BUCKETS - 1);
}

static op *pend_find(gps_store *s, const char *id)
{
    for (op *o = s->pend[pend_slot(id)]; o; o = o->pnext)
        if (strcmp(o->v[0].s, id) == 0)
            return o;
    return NULL;
}

static void pend_add(gps_store *s, op *o)
{
    op **b = &s->pend[pend_slot(o->v[0].s)];
    o->pnext = *b;
    *b = o;
    o->pending = true;
}

static void pend_del(gps_store *s, op *o)
{
    for (op **pp = &s->pend[pend_slot(o->v[0].s)]; *pp; pp = &(*pp)->pnext)
        if (*pp == o) {
            *pp = o->pnext;
            break;
        }
    o->pnext = NULL;
    o->pending = false;
}

/* Usage adds (K_USAGE_ADD: ?1 key, ?2 day, ?3..?6 counts added). A key's
 * adds are sums, so one queued for the same key and day while another
 * still waits in the queue adds its counts into it instead of queueing a
 * statement of its own: with API keys every request queued two (its
 * admission and its accounting), two of its three statements at 64
 * clients on one key (issue 24). Never across a read of key_usage
 * (usage_seal_locked): a server merging the other servers' counts keeps
 * what it added after queueing the read on top of what the read returns,
 * so an add folded into an op before the read would count twice. All
 * under mu; the DB thread takes an op out of the table as it takes it off
 * the queue. */
#define USAGE_CEILING 2305843009213693951LL /* INT64_MAX / 4, as the SQL's MIN */

static size_t usage_slot(const char *key_id)
{
    return pend_slot(key_id) & (USAGE_BUCKETS - 1);
}

/* Under mu: fold o (a usage add) into the one queued for its key and day;
 * true when it did (o is then the caller's to free). */
static bool usage_fold_locked(gps_store *s, const op *o)
{
    for (op *q = s->usage[usage_slot(o->v[0].s)]; q; q = q->unext)
        if (q->v[1].i == o->v[1].i && strcmp(q->v[0].s, o->v[0].s) == 0) {
            for (int i = 2; i < 6; i++) {
                int64_t a = q->v[i].i, b = o->v[i].i;
                q->v[i].i = b > 0 && a > USAGE_CEILING - b ? USAGE_CEILING : a + b;
            }
            q->folds++;
            s->stats.ops_enqueued++;
            return true;
        }
    return false;
}

static void usage_add_locked(gps_store *s, op *o)
{
    op **b = &s->usage[usage_slot(o->v[0].s)];
    o->unext = *b;
    *b = o;
    o->in_usage = true;
}

static void usage_del_locked(gps_store *s, op *o)
{
    for (op **pp = &s->usage[usage_slot(o->v[0].s)]; *pp; pp = &(*pp)->unext)
        if (*pp == o) {
            *pp = o->unext;
            break;
        }
    o->unext = NULL;
    o->in_usage = false;
}

/* Under mu: a read of key_usage is being queued: nothing queued after it
 * folds into an add queued before it. */
static void usage_seal_locked(gps_store *s)
{
    for (size_t i = 0; i < USAGE_BUCKETS; i++) {
        for (op *o = s->usage[i], *next; o; o = next) {
            next = o->unext;
            o->unext = NULL;
            o->in_usage = false;
        }
        s->usage[i] = NULL;
    }
}

/* Column of K_JOB_INSERT_ROW that K_JOB_UPDATE's value j (1..11) sets. */
static int row_col_of_update(int j) { return j == 1 ? 5 : 10 + j; }

/* The op that does what base (a job insert, K_JOB_INSERT_ROW or
 * K_JOB_UPDATE) and then update u (K_JOB_UPDATE of the same row) do: an
 * insert becomes K_JOB_INSERT_ROW with the update's columns, an update one
 * update (K_JOB_UPDATE sets what is not NULL: the later value wins). New,
 * NULL on ENOMEM. */
static op *fold_pack(const op *base, const op *u)
{
    bool ins = base->kind != K_JOB_UPDATE;
    opb b;
    memset(&b, 0, sizeof(b));
    b.kind = ins ? K_JOB_INSERT_ROW : K_JOB_UPDATE;
    b.nv = ins ? 22 : 12;
    for (int i = 0; i < base->nv && i < b.nv; i++)
        b.v[i] = base->v[i]; /* borrowed: b_pack copies */
    if (ins && b.v[13].t == V_NULL) {
        b.v[13].t = V_INT;   /* attempts: NOT NULL DEFAULT 0 */
        b.v[13].i = 0;
    }
    for (int j = 1; j < u->nv && j < 12; j++)
        if (u->v[j].t != V_NULL)
            b.v[ins ? row_col_of_update(j) : j] = u->v[j];
    return b_pack(&b);
}

static bool row_ended(const op *o);

/* Under mu, for a job-row write o (coalesce as the caller said): true
 * when o folded into the row's pending write (o is then the caller's to
 * free). Tried before the queue_max check: a fold takes no place in the
 * queue, and a row's end refused there would leave the row unfinished for
 * good while held writes fill the queue. *found gets the row's pending
 * write (or NULL) for fold_miss_locked, which runs under the same hold of
 * mu: one look-up a write. */
static bool fold_locked(gps_store *s, op *o, bool coalesce, op **found)
{
    *found = NULL;
    if (!s->pend)
        return false;
    op *p = *found = pend_find(s, o->v[0].s);
    if (p && coalesce && o->kind == K_JOB_UPDATE) {
        op *m = fold_pack(p->fold ? p->fold : p, o);
        if (m) {
            free(p->fold);
            p->fold = m;
            p->folds++;
            s->stats.ops_enqueued++;
            if (p->held && row_ended(p)) {
                /* The row ended: its held write is due. A group waiting
                 * for its deadline runs it there; an idle DB thread is
                 * woken (low load: a wake a request costs nothing). */
                s->held_ready = true;
                if (s->db_idle)
                    pthread_cond_signal(&s->cv_work);
            }
            return true;
        }
    }
    return false;
}

/* Under mu, a job-row write o that did not fold is about to be queued
 * (p: its row's pending write, as fold_locked found it): returns whether
 * it enters the pending table once queued. */
static bool fold_miss_locked(gps_store *s, op *o, bool coalesce, op *p)
{
    if (!s->pend)
        return false;
    if (p) {
        pend_del(s, p); /* o is queued after it: nothing later folds across o */
        if (p->held)
            s->held_drain = true; /* and p runs before o (group_fill) */
    }
    return coalesce && (o->kind == K_JOB_UPDATE || s->w.ok[K_JOB_INSERT_ROW]);
}

static json_t *events_collect(conn *c, const char *job_id);

/* Row handlers of the DB thread's reads: the op collects its rows. */
static int keep_first_row(void *arg, const row *r)
{
    op *o = arg;
    o->result = row_dup(r);
    return o->result ? 1 : -1;
}

static int append_row(void *arg, const row *src)
{
    op *o = arg;
    row **grown = realloc(o->rows, (o->nrows + 1) * sizeof *grown);
    if (!grown)
        return -1;
    o->rows = grown;
    row *r = row_dup(src);
    if (!r)
        return -1;
    o->rows[o->nrows++] = r;
    return 0;
}

/* Run one op on the DB thread. Returns true when it was a write that
 * succeeded, false otherwise (reads return false; *failed tells a failed
 * write). */
static bool run_op(gps_store *s, op *o, bool *failed)
{
    conn *c = &s->w;
    *failed = false;
    if (!conn_stmt(c, o->kind)) {
        /* An optional statement this DB's schema does not support. */
        *failed = true;
        if (o->kind == K_SERVER_BEAT)
            o->status = -1;   /* no lease without the table */
        gp_log_write(GP_LOG_ERROR, "store_write_failed", NULL,
                     json_pack("{s:s}", "op", stmts[o->kind].name),
                     "store op %s is not supported by this database's schema",
                     stmts[o->kind].name);
        return false;
    }
    int stopped;
    int64_t changes = 0;
    switch (o->kind) {
    case K_JOB_GET: {
        int rc = stmt_exec(c, o->kind, o->v, o->nv, keep_first_row, o, &stopped, NULL);
        o->status = rc != 0 || stopped < 0 ? -1 : o->result ? 0 : 1;
        if (o->status == 0)
            o->events = events_collect(c, o->v[0].s);
        return false;
    }
    case K_JOB_LIST:
    case K_SERVER_LIST:
    case K_KEYS_GET:
    case K_USAGE_GET:
    case K_RESP_GET:
    case K_RESP_ITEMS_GET:
    case K_RESP_DELETE:
    case K_TASK_CLAIM:
    case K_TASK_FOLLOW:
    case K_TASK_LEASE_GET:
    case K_JOBS_FAIL_ORPHANS:
    case K_HANDOFF_PEERS:
    case K_HANDOFF_PEERS_FREE:
    case K_HANDOFF_CLAIM:
    case K_HANDOFF_PEEK:
    case K_HANDOFF_CLAIM_IDS:
    case K_HANDOFF_WITHDRAW:
    case K_HANDOFF_EVENTS:
    case K_HANDOFF_FOLLOW:
    case K_HANDOFF_MINE:
    case K_HANDOFF_SWEEP:
    case K_TASK_CANCEL_REQ:
    case K_TASK_CANCELS:
    case K_TASK_CANCEL_GET:
        o->status =
            stmt_exec(c, o->kind, o->v, o->nv, append_row, o, &stopped, &changes) == 0 &&
                    stopped == 0
                ? 0
                : -1;
        o->changes = o->kind == K_RESP_DELETE || o->kind == K_JOBS_FAIL_ORPHANS ||
                             o->kind == K_HANDOFF_SWEEP || o->kind == K_HANDOFF_WITHDRAW ||
                             o->kind == K_TASK_CANCEL_REQ
                         ? changes
                         : 0;
        if (o->status)
            rows_free(o);
        return false;
    case K_PING:
        o->status = stmt_exec(c, o->kind, o->v, o->nv, NULL, NULL, &stopped, NULL) == 0 ? 0 : -1;
        if (o->status)
            snprintf(o->msg, sizeof(o->msg), "%s", conn_err(c));
        return false;
    default:
        break;
    }
    if (stmt_exec(c, o->kind, o->v, o->nv, NULL, NULL, &stopped, &changes) != 0) {
        *failed = true;
        o->status = -1;   /* a heartbeat's caller learns it (server_beat) */
        gp_log_write(GP_LOG_ERROR, "store_write_failed", NULL,
                     json_pack("{s:s, s:s}", "op", stmts[o->kind].name, "engine", s->eng->name),
                     "store write %s failed: %s", stmts[o->kind].name, conn_err(c));
        return false;
    }
    if ((o->kind == K_PURGE || o->kind == K_RESP_PURGE) && changes >= PURGE_CHUNK) {
        /* More to delete: go again after whatever queued meanwhile, so a
         * big purge never holds one long transaction. */
        opb b;
        b_spec(&b, o->kind, "i", o->v[0].i);
        op *again = b_pack(&b);
        if (again) {
            pthread_mutex_lock(&s->mu);
            enqueue_locked(s, again, again, 1);
            pthread_mutex_unlock(&s->mu);
        }
    }
    return true;
}

static void timespec_in_us(struct timespec *ts, uint64_t us_from_now)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(us_from_now / 1000000);
    ts->tv_nsec += (long)(us_from_now % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* A read: its caller waits for the result (committed first). */
static bool op_is_read(const op *o)
{
    return o->kind == K_JOB_GET || o->kind == K_PING || o->kind == K_JOB_LIST ||
           o->kind == K_SERVER_BEAT || o->kind == K_SERVER_LIST || o->kind == K_KEYS_GET ||
           o->kind == K_USAGE_GET || (stmts[o->kind].flags & F_CELLS);
}

/* DB thread: wake the loop (on_wake). An eventfd write cannot block
 * (the counter would have to reach 2^64 - 1) nor fail but for a bug. */
static void wake_loop(gps_store *s)
{
    uint64_t one = 1;
    while (write(s->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

/* Under mu, in a group transaction whose queue is not empty: true when
 * the DB thread may leave what is queued until the commit deadline. A
 * request-log row was inserted at once when its write was the first of a
 * group, and its assignment and end updates, queued a millisecond later,
 * could no longer fold into it: at low load every row cost three
 * statements (issue 24). Every write of a group commits at its deadline
 * whenever it runs, so running the foldable ones there delays nothing;
 * anything else queued (a read, native task events or writes, an op
 * queued ahead), a flush, a read or events already in the group (commit
 * now) or a full batch runs the queue at once, in order. */
static bool db_hold(const gps_store *s, bool commit_soon)
{
    return !commit_soon && !s->flush_waiters && !s->stop && s->q_nowait == 0 &&
           s->stats.queue_depth - s->stats.rows_waiting < (uint64_t)s->batch_max;
}

/* ------------------------------------------------------------------------ */
/* Held rows                                                                */
/* ------------------------------------------------------------------------ */

/* Has the row's end (finished_at) reached this write, itself or folded? */
static bool row_ended(const op *o)
{
    const op *w = o->fold ? o->fold : o;
    return (w->kind == K_JOB_INSERT_ROW && w->v[21].t != V_NULL) ||
           (w->kind == K_JOB_UPDATE && w->v[11].t != V_NULL);
}

/* Would o, taken off the queue now, be held (held_add_locked)? */
static bool would_hold(const gps_store *s, const op *o)
{
    return s->row_hold_us && o->pending && !row_ended(o);
}

/* Under mu, o just taken off the queue: hold it back instead of running
 * it? A request-log row write open to folding whose row has not ended
 * waits up to row_hold_ms on the held list, still in the pending table, so
 * that the row's later writes fold into it (folding within one group
 * missed every request longer than the group: 1.87 statements a request
 * at 64 zero-delay streams, issue 24). */
static bool held_add_locked(gps_store *s, op *o, uint64_t now)
{
    if (!would_hold(s, o))
        return false;
    o->held = true;
    o->hold_until_us = now + s->row_hold_us;
    o->hnext = NULL;
    if (s->htail)
        s->htail->hnext = o;
    else
        s->hhead = o;
    s->htail = o;
    s->stats.rows_held++;
    s->stats.rows_waiting++; /* still in queue_depth: the backlog counts it */
    return true;
}

/* Under mu: may o run while row writes are held? Not when it concerns
 * jobs (F_BESIDE), nor when a write of a held row could not fold
 * (held_drain): the held writes run first, so that o sees them. */
static bool held_runs_first(const gps_store *s, const op *o)
{
    return s->hhead && (s->held_drain || (!o->may_wait && !(stmts[o->kind].flags & F_BESIDE)));
}

/* Under mu: is a held write due to run (its row ended, its hold is over,
 * or a flush or the stop wants everything written)? */
static bool held_due_locked(const gps_store *s, uint64_t now)
{
    return s->hhead && (s->held_ready || s->held_drain || s->flush_waiters || s->stop ||
                        now >= s->hhead->hold_until_us);
}

/* Under mu: take off the held list (and out of the pending table: nothing
 * folds into them any more) the writes due now, or all of them, at most
 * max (what is left of the group's batch_max); returns them chained by
 * next, in the order they were held. What the cap leaves stays due. */
static op *held_take_locked(gps_store *s, uint64_t now, bool all, uint64_t max)
{
    all = all || s->held_drain || s->flush_waiters || s->stop;
    op *run = NULL, **tail = &run;
    op *keep = NULL, *keep_tail = NULL;
    uint64_t taken = 0;
    bool capped = false;
    for (op *o = s->hhead, *next; o; o = next) {
        next = o->hnext;
        o->hnext = NULL;
        bool due = all || row_ended(o) || now >= o->hold_until_us;
        if (due && taken >= max)
            capped = true;
        if (due && !capped) {
            o->held = false;
            if (o->pending)
                pend_del(s, o);
            o->next = NULL;
            *tail = o;
            tail = &o->next;
            taken++;
            s->stats.rows_waiting--;
            s->stats.queue_depth--;
        } else {
            if (keep_tail)
                keep_tail->hnext = o;
            else
                keep = o;
            keep_tail = o;
        }
    }
    s->hhead = keep;
    s->htail = keep_tail;
    if (!capped) {
        s->held_ready = false;
        s->held_drain = false;
    }
    return run;
}

/* ------------------------------------------------------------------------ */
/* The DB thread                                                            */
/* ------------------------------------------------------------------------ */

/* What one group transaction did (db_main). */
typedef struct group {
    uint64_t writes_ok, writes_failed, n, last_seq;
    bool has_read, has_events, events_failed;
    bool begun;                /* BEGIN ran (group_begin) */
    bool waited;               /* waited for the deadline with ops queued */
    bool in_tx;                /* and opened a transaction */
    op *done_head, *done_tail; /* finished reads, for the loop */
} group;

/* Called with mu held, returns with it held: open the group's
 * transaction, once, before its first op runs. Not earlier: a group whose
 * ops are all held runs nothing, and an empty transaction still took
 * SQLite's write lock (two round trips on PostgreSQL). On SQLite, BEGIN
 * IMMEDIATE takes the write lock now (waiting up to busy_timeout if a CLI
 * holds it) so that statement errors later are about the statement, not
 * the lock; nothing is taken off the queue meanwhile. */
static void group_begin(gps_store *s, group *g)
{
    if (g->begun)
        return;
    g->begun = true;
    pthread_mutex_unlock(&s->mu);
    char err[256] = "";
    g->in_tx = exec_simple(&s->w, s->eng->begin_sql, err, sizeof(err)) == 0;
    if (!g->in_tx)
        gp_log_write(GP_LOG_ERROR, "store_begin_failed", NULL, NULL,
                     "store: BEGIN failed (%s); writing without a transaction", err);
    pthread_mutex_lock(&s->mu);
}

/* Run o in the group (mu not held); a read is kept for the loop, anything
 * else freed. */
static void group_run(gps_store *s, group *g, op *o)
{
    bool failed;
    bool ok = run_op(s, o->fold ? o->fold : o, &failed);
    g->writes_ok += ok ? 1 + o->folds : 0;
    g->writes_failed += failed ? 1 + o->folds : 0;
    if (o->kind == K_EVENTS_ADD || o->kind == K_EVENTS_ADD_FENCED) {
        g->has_events = true;
        g->events_failed |= !ok;
    }
    g->n++;
    if (op_is_read(o)) {
        g->has_read = true;
        o->next = NULL;
        if (g->done_tail)
            g->done_tail->next = o;
        else
            g->done_head = o;
        g->done_tail = o;
    } else {
        free(o->fold);
        free(o);
    }
}

/* Called with mu held, returns with it held: run the held writes due now
 * (all: every one), as many as the group has room for. */
static void group_run_held(gps_store *s, group *g, bool all)
{
    if (!s->hhead)
        return;
    if (!g->begun) {
        /* The transaction first, then the take: held writes stay counted
         * in the backlog, and open to folding, while BEGIN waits for the
         * lock. Only this thread takes held writes: what is due now is
         * still due after BEGIN. */
        if (!all && !held_due_locked(s, gp_now_mono_us()))
            return;
        group_begin(s, g);
    }
    uint64_t room = g->n < (uint64_t)s->batch_max ? (uint64_t)s->batch_max - g->n : 1;
    op *chain = held_take_locked(s, gp_now_mono_us(), all, room);
    if (!chain)
        return;
    pthread_mutex_unlock(&s->mu);
    while (chain) {
        op *o = chain;
        chain = o->next;
        group_run(s, g, o);
    }
    pthread_mutex_lock(&s->mu);
}

/* Fill one group transaction (mu held on entry and exit): run what is
 * queued, in order, until the queue is empty and the commit is due, or
 * batch_max ops ran, or an op queued ahead ran. */
static void group_fill(gps_store *s, group *g)
{
    uint64_t deadline = gp_now_mono_us() + (uint64_t)s->commit_interval_ms * 1000;
    for (;;) {
        if (!s->qhead || db_hold(s, g->has_read || g->has_events)) {
            /* Commit now when someone waits for it (flush, a read,
             * native task events: their clients get them only once
             * committed) or we are stopping; else keep the transaction
             * open for more writes until the deadline. Ops queued while a
             * COMMIT runs still share the next one. Foldable writes may
             * wait here too (db_hold): at the deadline they run and
             * commit, and so do the held writes then due (a row that
             * ended while the DB thread was idle too: committing it at
             * once made a second commit for every group at one client). */
            uint64_t now = gp_now_mono_us();
            bool commit_now = s->flush_waiters || s->stop || g->has_read || g->has_events ||
                              now >= deadline;
            if (commit_now && !s->qhead) {
                group_run_held(s, g, false);
                if (!s->qhead || g->n >= (uint64_t)s->batch_max)
                    break;
                continue; /* queued while the held ran: they join this commit */
            }
            if (commit_now)
                goto take;
            struct timespec ts;
            timespec_in_us(&ts, deadline - now);
            if (s->qhead && !g->waited) {
                g->waited = true;
                s->stats.deadline_waits++;
            }
            s->tx_waiting = true;
            pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
            s->tx_waiting = false;
            continue;
        }
    take:;
        op *o = s->qhead;
        /* What concerns jobs (a read, a table-wide write, a native
         * task's) runs after every held write: ops run in enqueue order
         * but for the held rows, which the rest does not concern. */
        if (held_runs_first(s, o)) {
            group_run_held(s, g, true);
            if (g->n >= (uint64_t)s->batch_max)
                break;
            continue;
        }
        /* Due held writes (ended, hold over, a flush or the stop waiting)
         * run before the next op: under a queue that never empties they
         * would otherwise wait for an op that concerns jobs, and a flush
         * with them. */
        if (held_due_locked(s, gp_now_mono_us())) {
            uint64_t n0 = g->n;
            group_run_held(s, g, false);
            if (g->n >= (uint64_t)s->batch_max)
                break;
            if (g->n > n0)
                continue;
        }
        if (!g->begun && !would_hold(s, o)) {
            group_begin(s, g); /* mu released: look at the queue again */
            continue;
        }
        s->qhead = o->next;
        if (!s->qhead)
            s->qtail = NULL;
        if (!o->may_wait)
            s->q_nowait--;
        if (o->seq > s->seq_taken)
            s->seq_taken = o->seq;
        if (held_add_locked(s, o, gp_now_mono_us()))
            continue;
        s->stats.queue_depth--;
        if (o->pending)
            pend_del(s, o); /* nothing folds into it once taken */
        if (o->in_usage)
            usage_del_locked(s, o);
        pthread_mutex_unlock(&s->mu);
        bool ahead = o->seq == 0; /* queued ahead (enqueue_front): commit now */
        if (!ahead)
            g->last_seq = o->seq;
        group_run(s, g, o);
        pthread_mutex_lock(&s->mu);
        /* Past the deadline, what is queued still joins this commit (the
         * writes that waited for it without a wake, see enqueue_locked);
         * batch_max bounds the group. */
        if (g->n >= (uint64_t)s->batch_max || ahead)
            break;
    }
}

/* After a group's COMMIT (mu held): every op taken so far is committed
 * but for the held writes, the oldest of which bounds what a flush may
 * count as done. */
static uint64_t seq_committed_locked(const gps_store *s)
{
    if (s->hhead && s->hhead->seq && s->hhead->seq - 1 < s->seq_taken)
        return s->hhead->seq - 1;
    return s->seq_taken;
}

/* Under mu, nothing queued: wait for work (ops, a held write coming due,
 * a flush or the stop). */
static void db_idle_wait(gps_store *s)
{
    while (!s->qhead && !s->stop) {
        uint64_t now = gp_now_mono_us();
        if (held_due_locked(s, now))
            return;
        s->db_idle = true;
        if (s->hhead) {
            struct timespec ts;
            timespec_in_us(&ts, s->hhead->hold_until_us - now);
            pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
        } else {
            pthread_cond_wait(&s->cv_work, &s->mu);
        }
        s->db_idle = false;
    }
}

/* After a group's COMMIT (or its failure), mu not held; returns with mu
 * held: count it, publish what is done, hand finished reads to the loop. */
static void db_committed(gps_store *s, group *g, bool commit_ok, uint64_t commit_us,
                         const char *err)
{
    bool in_tx = g->in_tx;
    /* A heartbeat (a cancel request) holds only once its transaction
     * is committed. */
    for (op *o = g->done_head; o && in_tx && !commit_ok; o = o->next)
        if (o->kind == K_SERVER_BEAT || o->kind == K_TASK_CANCEL_REQ)
            o->status = -1;
    pthread_mutex_lock(&s->mu);
    if (g->n == 0) {
        /* Every op taken was held: no transaction, nothing to count. */
    } else if (commit_ok) {
        s->stats.ops_committed += g->writes_ok;
        s->stats.ops_failed += g->writes_failed;
        s->stats.batches++;
        s->stats.statements += g->n;
        s->stats.last_batch_ops = g->n;
        s->stats.last_commit_us = commit_us;
        if (commit_us > s->stats.max_commit_us)
            s->stats.max_commit_us = commit_us;
        s->stats.last_commit_wall_ms = gp_now_wall_ms();
        s->last_commit_ok = true;
    } else {
        s->stats.ops_failed += g->writes_ok + g->writes_failed;
        s->stats.commit_failures++;
        s->last_commit_ok = false;
        snprintf(s->last_error, sizeof(s->last_error), "last commit failed: %s", err);
    }
    uint64_t done = seq_committed_locked(s);
    if (done > s->seq_done)
        s->seq_done = done;
    bool notify = false, notify_commit = false;
    if (g->has_events) {
        /* Not past a held write of lower seq (store.h: every op up to it
         * executed). The events op drained the older ones, so its own
         * seq stays covered. */
        s->events_done_seq = g->last_seq < done ? g->last_seq : done;
        s->events_failed |= g->events_failed || !commit_ok;
        notify_commit = s->wake_fd >= 0;
    }
    if (g->done_head) {
        if (s->dtail)
            s->dtail->next = g->done_head;
        else
            s->dhead = g->done_head;
        s->dtail = g->done_tail;
        notify = s->wake_fd >= 0;
    }
    if (notify_commit)
        s->pend_commit = true;
    /* One write per batch at most, and none while the loop has a wake
     * it has not read yet: it looks at dhead and pend_commit after
     * reading, under mu, so it sees this batch too. */
    bool wake = (notify || notify_commit) && !s->wake_sent;
    if (wake)
        s->wake_sent = true;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    if (wake)
        wake_loop(s);
    pthread_mutex_lock(&s->mu);
}

static void *db_main(void *arg)
{
    gps_store *s = arg;
    char err[256];

    pthread_mutex_lock(&s->mu);
    for (;;) {
        db_idle_wait(s);
        if (!s->qhead && !s->hhead && s->stop)
            break;
        group g;
        memset(&g, 0, sizeof(g));
        group_fill(s, &g); /* opens the transaction before its first op (group_begin) */
        pthread_mutex_unlock(&s->mu);

        bool commit_ok = true;
        uint64_t commit_us = 0;
        err[0] = '\0';
        if (g.in_tx) {
            uint64_t t0 = gp_now_mono_us();
            if (exec_simple(&s->w, "COMMIT", err, sizeof(err)) != 0) {
                commit_ok = false;
                gp_log_write(GP_LOG_ERROR, "store_commit_failed", NULL,
                             json_pack("{s:I}", "ops", (json_int_t)g.n),
                             "store: COMMIT of %llu ops failed: %s", (unsigned long long)g.n, err);
                exec_simple(&s->w, "ROLLBACK", NULL, 0);
            }
            commit_us = gp_now_mono_us() - t0;
        }
        db_committed(s, &g, commit_ok, commit_us, err);
    }
    s->thread_alive = false;
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Append a chain of count ops. Caller holds mu. */
static void enqueue_locked(gps_store *s, op *first, op *last, size_t count)
{
    for (op *o = first; o; o = o->next) {
        o->seq = ++s->seq_enqueued;
        s->q_nowait += !o->may_wait;
        if (o->kind == K_USAGE_GET)
            usage_seal_locked(s);
    }
    last->next = NULL;
    if (s->qtail)
        s->qtail->next = first;
    else
        s->qhead = first;
    s->qtail = last;
    s->stats.queue_depth += count;
    s->stats.ops_enqueued += count;
    /* Wake the DB thread for the first write of a group, for what someone
     * waits on (reads, native task events), and at batch_max. A plain write
     * that finds a transaction open and waiting for its deadline waits with
     * it: it is committed at that deadline either way, and a wake per write
     * (three per relayed request: insert, assign, finish) was a futex call
     * and a context switch each on the loop's core (issue 24). */
    bool urgent = !s->tx_waiting ||
                  s->stats.queue_depth - s->stats.rows_waiting >= (uint64_t)s->batch_max;
    for (op *o = first; o && !urgent; o = o->next)
        urgent = op_is_read(o) || o->kind == K_EVENTS_ADD || o->kind == K_EVENTS_ADD_FENCED;
    if (urgent)
        pthread_cond_signal(&s->cv_work);
}

static void free_chain(op *o)
{
    while (o) {
        op *next = o->next;
        rows_free(o);
        free(o->result);
        free(o->fold);
        free(o);
        o = next;
    }
}

#define ENQ_USAGE 3 /* enqueue_ex's row: a usage add (usage_fold_locked) */

/* Queue a chain of ops (linked by next). Writes (droppable) are refused
 * beyond queue_max. Takes ownership of the chain in every case. *seq_out
 * (may be NULL) gets the last op's seq: read under the lock, since the DB
 * thread may free the op as soon as it is queued. row: 0 any op; 1 a job
 * row's write, 2 one that may fold (fold_locked); ENQ_USAGE a usage add. */
static int enqueue_ex(gps_store *s, op *first, bool droppable, uint64_t *seq_out, int row)
{
    if (!first)
        return -1;
    size_t count = 1;
    op *last = first;
    while (last->next) {
        last = last->next;
        count++;
    }
    op *pend_hit = NULL; /* fold_locked's look-up, for fold_miss_locked */
    pthread_mutex_lock(&s->mu);
    if (row == ENQ_USAGE ? s->thread_alive && usage_fold_locked(s, first)
                         : row && s->thread_alive && fold_locked(s, first, row > 1, &pend_hit)) {
        pthread_mutex_unlock(&s->mu);
        free_chain(first);
        return 0;
    }
    if (!s->thread_alive || (droppable && s->stats.queue_depth + count > s->queue_max)) {
        bool alive = s->thread_alive;
        s->stats.drops += count;
        uint64_t drops = s->stats.drops;
        int64_t now = gp_now_wall_ms();
        bool log = now - s->last_drop_log_ms >= 1000;
        if (log)
            s->last_drop_log_ms = now;
        pthread_mutex_unlock(&s->mu);
        if (log && alive)
            gp_log_write(GP_LOG_ERROR, "store_queue_full", NULL,
                         json_pack("{s:I, s:I}", "drops_total", (json_int_t)drops, "queue_max",
                                   (json_int_t)s->queue_max),
                         "store: write queue full (%zu ops), dropping writes", s->queue_max);
        else if (log)
            gp_log_write(GP_LOG_ERROR, "store_queue_full", NULL,
                         json_pack("{s:I}", "drops_total", (json_int_t)drops),
                         "store: DB thread not running, dropping writes");
        free_chain(first);
        return -1;
    }
    bool usage = row == ENQ_USAGE;
    bool reg = row && !usage && fold_miss_locked(s, first, row > 1, pend_hit);
    /* a row op is one op; a usage add, too, and it may wait for the
     * deadline as a foldable row write does (db_hold) */
    first->may_wait = reg || usage;
    enqueue_locked(s, first, last, count);
    if (reg)
        pend_add(s, first);
    if (usage)
        usage_add_locked(s, first);
    if (seq_out)
        *seq_out = s->seq_enqueued;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int enqueue_seq(gps_store *s, op *first, bool droppable, uint64_t *seq_out)
{
    return enqueue_ex(s, first, droppable, seq_out, 0);
}

static int enqueue(gps_store *s, op *first, bool droppable)
{
    return enqueue_seq(s, first, droppable, NULL);
}

/* Queue one op ahead of everything waiting: the server's heartbeat, whose
 * lease must not run out behind a backlog of request-log writes (servers
 * sharing the DB would take its tasks over, and it would stop admitting,
 * with the database reachable all along). It takes no seq: flushes wait
 * for the ops queued before them, which this one does not reorder. */
static int enqueue_front(gps_store *s, op *o)
{
    pthread_mutex_lock(&s->mu);
    if (!s->thread_alive) {
        pthread_mutex_unlock(&s->mu);
        free_chain(o);
        return -1;
    }
    /* A renewal of the same leases still waiting (the database slow or
     * away) takes the new expiry instead of another place in the queue:
     * they would pile up, one per renewal period, as long as it is away.
     * The ops queued ahead are the first ones (seq 0), a few at most. */
    for (op *q = s->qhead; o->kind == K_TASK_RENEW && q && q->seq == 0; q = q->next)
        if (q->kind == K_TASK_RENEW && q->nv == o->nv && q->v[0].s && o->v[0].s &&
            strcmp(q->v[0].s, o->v[0].s) == 0) {
            q->v[1].i = o->v[1].i;
            pthread_mutex_unlock(&s->mu);
            free_chain(o);
            return 0;
        }
    o->seq = 0;
    o->may_wait = false;
    s->q_nowait++;
    o->next = s->qhead;
    s->qhead = o;
    if (!s->qtail)
        s->qtail = o;
    s->stats.queue_depth++;
    s->stats.ops_enqueued++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void count_drop(gps_store *s)
{
    pthread_mutex_lock(&s->mu);
    s->stats.drops++;
    pthread_mutex_unlock(&s->mu);
}

/* Queue a write (droppable); *seq_out as enqueue_seq. Releases b. */
static int enqueue_b(gps_store *s, opb *b, uint64_t *seq_out)
{
    op *o = b_pack(b);
    if (!o) {
        count_drop(s);
        return -1;
    }
    return enqueue_seq(s, o, true, seq_out);
}

/* Queue a write of statement kind, its values by bind spec (b_spec). */
static int write_op(gps_store *s, int kind, const char *spec, ...)
{
    opb b;
    va_list ap;
    va_start(ap, spec);
    b_vspec(&b, kind, spec, ap);
    va_end(ap);
    return enqueue_b(s, &b, NULL);
}

/* Queue a write of a job row (write_op): coalesce as
 * gps_store_job_update.coalesce (fold_locked). */
static int row_op(gps_store *s, bool coalesce, int kind, const char *spec, ...)
{
    opb b;
    va_list ap;
    va_start(ap, spec);
    b_vspec(&b, kind, spec, ap);
    va_end(ap);
    op *o = b_pack(&b);
    if (!o) {
        count_drop(s);
        return -1;
    }
    return enqueue_ex(s, o, true, NULL, coalesce ? 2 : 1);
}

/* A read op of statement kind, its values by bind spec (new, caller owns;
 * NULL on ENOMEM). The caller sets its callback and queues it (reads are
 * never dropped). */
static op *read_op(int kind, const char *spec, ...)
{
    opb b;
    va_list ap;
    va_start(ap, spec);
    b_vspec(&b, kind, spec, ap);
    va_end(ap);
    return b_pack(&b);
}

/* ------------------------------------------------------------------------ */
/* Read results, delivered on the loop thread                               */
/* ------------------------------------------------------------------------ */

static void job_info_from_row(const row *r, gps_store_job_info *ji, json_t **request)
{
    memset(ji, 0, sizeof(*ji));
    ji->id = rs(r, 0);
    ji->api = rs(r, 1);
    ji->kind = rs(r, 2);
    ji->model = rs(r, 3);
    ji->key_id = rs(r, 4);
    ji->agent_id = rs(r, 5);
    ji->status = rs(r, 6);
    ji->priority = (int)ri(r, 7, 0);
    ji->attempts = (int)ri_count(r, 8, 0, 1000);
    ji->prompt_tokens = ri_count(r, 9, -1, STORE_MAX_COUNT);
    ji->completion_tokens = ri_count(r, 10, -1, STORE_MAX_COUNT);
    ji->queue_ms = ri_count(r, 11, -1, STORE_MAX_COUNT);
    ji->ttft_ms = ri_count(r, 12, -1, STORE_MAX_COUNT);
    ji->total_ms = ri_count(r, 13, -1, STORE_MAX_COUNT);
    ji->finish_reason = rs(r, 14);
    ji->error_code = rs(r, 15);
    ji->correlation_id = rs(r, 16);
    ji->has_seed = r->v[17].t == V_INT;
    ji->seed = ri(r, 17, 0);
    ji->created_at = ri(r, 18, 0);
    ji->finished_at = ri(r, 19, 0);
    *request = NULL;
    if (r->v[20].t == V_TEXT)
        *request = json_loadb(r->v[20].s, r->v[20].len, JSON_DECODE_ANY, NULL);
    ji->request = *request;
    ji->checkpoint_text = r->v[21].t == V_TEXT ? r->v[21].s : NULL;
    ji->checkpoint_len = r->v[21].t == V_TEXT ? r->v[21].len : 0;
    ji->checkpoint_seq = ri(r, 22, -1);
}

/* Appends one stored batch to the log; a batch that does not parse ends
 * the log there (replay must never skip a seq). */
static int append_batch(void *arg, const row *r)
{
    json_t **all = arg;
    json_t *batch = rs(r, 0) ? json_loadb(rs(r, 0), r->v[0].len, 0, NULL) : NULL;
    if (!*all && json_is_array(batch))
        *all = json_array();
    int stop = !json_is_array(batch) || !*all || json_array_extend(*all, batch) < 0;
    json_decref(batch);
    return stop;
}

/* The stored event log of job_id, read on c: one array of {seq, type,
 * data}, the batches concatenated in seq order (new reference), or NULL
 * when there is none (or no job_events table). */
static json_t *events_collect(conn *c, const char *job_id)
{
    if (!job_id || !conn_stmt(c, K_EVENTS_GET))
        return NULL;
    json_t *all = NULL;
    opb b;
    b_spec(&b, K_EVENTS_GET, "t", job_id);
    int stopped;
    stmt_exec(c, K_EVENTS_GET, b.v, b.nv, append_batch, &all, &stopped, NULL);
    b_release(&b);
    return all;
}

/* F_CELLS results: every row's columns as text, row-major. */
static void deliver_cells(op *o)
{
    gps_store_cells res = {.changes = o->changes};
    const char **cell = NULL;
    if (o->status == 0 && o->nrows) {
        res.ncols = (size_t)o->rows[0]->n;
        cell = calloc(o->nrows * res.ncols, sizeof *cell);
        if (!cell) {
            o->cells_cb(o->arg, -1, NULL);
            return;
        }
        for (size_t i = 0; i < o->nrows; i++)
            for (size_t c = 0; c < res.ncols; c++)
                cell[i * res.ncols + c] = rs(o->rows[i], (int)c);
        res.nrows = o->nrows;
    }
    res.cell = cell;
    o->cells_cb(o->arg, o->status, o->status == 0 ? &res : NULL);
    free(cell);
}

/* The reads of the servers' shared state (servers, keys, usage): rows
 * turned into the caller's structs, borrowed for the callback. */
static void deliver_shared(op *o)
{
    if (o->kind == K_SERVER_BEAT) {
        o->status_cb(o->arg, o->status);
        return;
    }
    size_t n = o->status == 0 ? o->nrows : 0;
    size_t sz = o->kind == K_SERVER_LIST ? sizeof(gps_store_server_row)
                : o->kind == K_KEYS_GET  ? sizeof(gps_store_key_row)
                                         : sizeof(gps_store_usage_row);
    void *v = n ? calloc(n, sz) : NULL;
    int status = n && !v ? -1 : o->status;
    for (size_t i = 0; v && i < n; i++) {
        const row *r = o->rows[i];
        if (o->kind == K_SERVER_LIST)
            ((gps_store_server_row *)v)[i] = (gps_store_server_row){
                .id = rs(r, 0), .name = rs(r, 1), .url = rs(r, 2), .pid = ri(r, 3, 0),
                .version = rs(r, 4), .started_at = ri(r, 5, 0), .heartbeat_at = ri(r, 6, 0),
                .lease_until = ri(r, 7, 0), .stopped_at = ri(r, 8, 0)};
        else if (o->kind == K_KEYS_GET)
            ((gps_store_key_row *)v)[i] = (gps_store_key_row){
                .id = rs(r, 0), .hash = rs(r, 1), .role = rs(r, 2),
                .name = rs(r, 3) ? rs(r, 3) : "", .agent_id = rs(r, 4),
                .created_at = ri(r, 5, 0), .expires_at = ri(r, 6, 0),
                .revoked_at = ri(r, 7, 0), .last_used_at = ri(r, 8, 0), .rpm = ri(r, 9, 0),
                .tokens_per_day = ri(r, 10, 0), .max_concurrent = ri(r, 11, 0),
                .max_uses = ri(r, 12, 0), .uses = ri(r, 13, 0)};
        else
            ((gps_store_usage_row *)v)[i] = (gps_store_usage_row){
                .key_id = rs(r, 0), .requests = ri(r, 1, 0), .prompt_tokens = ri(r, 2, 0),
                .completion_tokens = ri(r, 3, 0), .rate_limited = ri(r, 4, 0)};
    }
    if (status != 0)
        n = 0;
    if (o->kind == K_SERVER_LIST)
        o->servers_cb(o->arg, status, v, n);
    else if (o->kind == K_KEYS_GET)
        o->keys_cb(o->arg, status, v, n);
    else
        o->usage_cb(o->arg, status, o->v[0].i, v, n);
    free(v);
}

static void deliver(op *o)
{
    if (o->kind == K_JOB_GET) {
        if (o->status == 0 && o->result) {
            gps_store_job_info ji;
            json_t *req;
            job_info_from_row(o->result, &ji, &req);
            ji.events = o->events;
            o->job_cb(o->arg, 0, &ji);
            json_decref(req);
        } else {
            o->job_cb(o->arg, o->status, NULL);
        }
    } else if (o->kind == K_PING) {
        o->ping_cb(o->arg, o->status == 0, o->status == 0 ? "ok" : o->msg);
    } else if (stmts[o->kind].flags & F_CELLS) {
        deliver_cells(o);
    } else if (o->kind == K_SERVER_BEAT || o->kind == K_SERVER_LIST || o->kind == K_KEYS_GET ||
               o->kind == K_USAGE_GET) {
        deliver_shared(o);
    } else if (o->kind == K_JOB_LIST) {
        gps_store_job_info *jobs = o->nrows ? calloc(o->nrows, sizeof *jobs) : NULL;
        if (o->nrows && !jobs) {
            o->jobs_cb(o->arg, -1, NULL, 0);
            return;
        }
        for (size_t i = 0; i < o->nrows; i++) {
            json_t *req;
            job_info_from_row(o->rows[i], &jobs[i], &req); /* request is NULL here */
        }
        o->jobs_cb(o->arg, o->status, o->status == 0 ? jobs : NULL,
                   o->status == 0 ? o->nrows : 0);
        free(jobs);
    }
}

static void deliver_all(gps_store *s)
{
    pthread_mutex_lock(&s->mu);
    op *list = s->dhead;
    s->dhead = s->dtail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        op *next = list->next;
        deliver(list);
        json_decref(list->events);
        rows_free(list);
        free(list->result);
        free(list);
        list = next;
    }
}

/* The loop's side of wake_fd: read results ready and/or job_events
 * committed (or failed). Runs on the loop thread. */
static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    gps_store *s = arg;
    uint64_t n;
    (void)what;
    /* Read before looking at the queue: a wake sent after this read
     * (wake_sent cleared below) makes the fd readable again. */
    if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN && errno != EINTR)
        gp_log_write(GP_LOG_ERROR, "store_wake_read_failed", NULL, NULL,
                     "store: reading the DB thread's wake-up: %s", strerror(errno));
    pthread_mutex_lock(&s->mu);
    s->wake_sent = false;
    bool commit = s->pend_commit;
    s->pend_commit = false;
    gps_store_commit_fn fn = s->commit_fn;
    void *farg = s->commit_arg;
    uint64_t done = s->events_done_seq;
    bool failed = s->events_failed;
    if (commit)
        s->events_failed = false;
    pthread_mutex_unlock(&s->mu);
    deliver_all(s);
    if (commit && fn)
        fn(farg, done, failed);
}

bool gps_store_has_job_events(gps_store *s)
{
    return s && s->w.ok[K_EVENTS_ADD];
}

void gps_store_set_commit_cb(gps_store *s, gps_store_commit_fn fn, void *arg)
{
    pthread_mutex_lock(&s->mu);
    s->commit_fn = fn;
    s->commit_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* Opening and migrations                                                   */
/* ------------------------------------------------------------------------ */

typedef struct mig_set {
    struct migration *m;
    char **owned;          /* strings read from a directory */
    size_t n, nowned;
} mig_set;

static void mig_set_free(mig_set *ms)
{
    for (size_t i = 0; i < ms->nowned; i++)
        free(ms->owned[i]);
    free(ms->owned);
    free(ms->m);
    memset(ms, 0, sizeof(*ms));
}

static int mig_cmp(const void *a, const void *b)
{
    const struct migration *x = a, *y = b;
    return (x->version > y->version) - (x->version < y->version);
}

/* Parse "NNNN_name.sql": version or -1. name_out gets "name". */
static int mig_name_parse(const char *fn, char *name_out, size_t name_len)
{
    size_t len = strlen(fn);
    if (len < 10 || strcmp(fn + len - 4, ".sql") != 0 || fn[4] != '_')
        return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        if (fn[i] < '0' || fn[i] > '9')
            return -1;
        v = v * 10 + (fn[i] - '0');
    }
    size_t nl = len - 9;
    if (nl == 0 || nl >= name_len)
        return -1;
    for (size_t i = 0; i < nl; i++) {
        char c = fn[5 + i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return -1;
    }
    memcpy(name_out, fn + 5, nl);
    name_out[nl] = '\0';
    return v;
}

static int mig_own(mig_set *ms, char *str)
{
    char **p = realloc(ms->owned, (ms->nowned + 1) * sizeof(*p));
    if (!p) {
        free(str);
        return -1;
    }
    ms->owned = p;
    ms->owned[ms->nowned++] = str;
    return 0;
}

static int mig_load(mig_set *ms, const char *dir, char *err, size_t errlen)
{
    memset(ms, 0, sizeof(*ms));
    if (!dir) {
        ms->m = calloc(N_EMBEDDED, sizeof(*ms->m));
        if (!ms->m)
            goto oom;
        memcpy(ms->m, embedded_migrations, sizeof(embedded_migrations));
        ms->n = N_EMBEDDED;
        return 0;
    }
    DIR *d = opendir(dir);
    if (!d) {
        seterr(err, errlen, "migrations directory %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        char name[128];
        if (de->d_name[0] == '.' || strlen(de->d_name) < 4 ||
            strcmp(de->d_name + strlen(de->d_name) - 4, ".sql") != 0)
            continue;
        int v = mig_name_parse(de->d_name, name, sizeof(name));
        if (v <= 0) {
            seterr(err, errlen, "migrations directory %s: %s is not named NNNN_name.sql", dir,
                   de->d_name);
            closedir(d);
            goto fail;
        }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        size_t len;
        char *sql = gp_read_file(path, &len, 16 << 20);
        if (!sql) {
            seterr(err, errlen, "%s: %s", path, strerror(errno));
            closedir(d);
            goto fail;
        }
        char *nm = strdup(name);
        struct migration *nm_arr = realloc(ms->m, (ms->n + 1) * sizeof(*ms->m));
        if (mig_own(ms, sql) != 0 || !nm || mig_own(ms, nm) != 0 || !nm_arr) {
            if (nm_arr)
                ms->m = nm_arr;
            closedir(d);
            goto oom;
        }
        ms->m = nm_arr;
        ms->m[ms->n++] = (struct migration){v, nm, sql};
    }
    closedir(d);
    if (ms->n == 0) {
        seterr(err, errlen, "migrations directory %s holds no NNNN_name.sql file", dir);
        goto fail;
    }
    qsort(ms->m, ms->n, sizeof(*ms->m), mig_cmp);
    for (size_t i = 1; i < ms->n; i++)
        if (ms->m[i].version == ms->m[i - 1].version) {
            seterr(err, errlen, "migrations directory %s: version %04d appears twice", dir,
                   ms->m[i].version);
            goto fail;
        }
    return 0;
oom:
    seterr(err, errlen, "out of memory loading migrations");
fail:
    mig_set_free(ms);
    return -1;
}

static int read_int(void *arg, const row *r)
{
    *(int *)arg = (int)ri(r, 0, -1);
    return 0;
}

/* Current schema version inside the open transaction (0 = fresh), -1 on error. */
static int schema_current(conn *c, char *err, size_t errlen)
{
    int v = -1, stopped;
    if (stmt_exec(c, K_SCHEMA_VERSION, NULL, 0, read_int, &v, &stopped, NULL) != 0 || v < 0) {
        seterr(err, errlen, "reading schema_migrations: %s", conn_err(c));
        return -1;
    }
    return v;
}

/* A migration's script in c's engine's dialect, run. 0 or -1 with msg. */
static int migration_run(conn *c, const char *sql, char *msg, size_t msglen)
{
    char *mine = c->eng->migration_sql(sql);
    if (!mine) {
        seterr(msg, msglen, "out of memory");
        return -1;
    }
    int rc = exec_simple(c, mine, msg, msglen);
    free(mine);
    return rc;
}

/* Apply the newer migrations of ms, one transaction each. The engine's
 * migrate_begin_sql serialises servers that open one DB at the same time
 * (SQLite: the write lock; PostgreSQL: a lock on schema_migrations). */
static int migrate(conn *c, const char *path, const mig_set *ms, char *err, size_t errlen)
{
    char msg[512] = "";
    if (migration_run(c,
                      "CREATE TABLE IF NOT EXISTS schema_migrations ("
                      "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                      "applied_at INTEGER NOT NULL)",
                      msg, sizeof(msg)) != 0) {
        seterr(err, errlen, "%s: creating schema_migrations: %s", path, msg);
        return -1;
    }
    int known = ms->n ? ms->m[ms->n - 1].version : 0;
    for (;;) {
        if (exec_simple(c, c->eng->migrate_begin_sql, msg, sizeof(msg)) != 0) {
            seterr(err, errlen, "%s: %s", path, msg);
            return -1;
        }
        int cur = schema_current(c, msg, sizeof(msg));
        if (cur < 0) {
            seterr(err, errlen, "%s: %s", path, msg);
            goto rollback;
        }
        if (cur > known) {
            seterr(err, errlen,
                   "%s: database schema version %d is newer than this binary knows (%d); "
                   "refusing to open it (use a newer gpupool-server)",
                   path, cur, known);
            goto rollback;
        }
        const struct migration *next = NULL;
        for (size_t i = 0; i < ms->n && !next; i++)
            if (ms->m[i].version > cur)
                next = &ms->m[i];
        if (!next) {
            exec_simple(c, "COMMIT", NULL, 0);
            return 0;
        }
        if (migration_run(c, next->sql, msg, sizeof(msg)) != 0) {
            seterr(err, errlen, "%s: migration %04d_%s failed: %s", path, next->version,
                   next->name, msg);
            goto rollback;
        }
        opb b;
        b_spec(&b, K_MIGRATION_RECORD, "iti", (int64_t)next->version, next->name,
               (int64_t)gp_now_wall_ms());
        int stopped;
        int rc = stmt_exec(c, K_MIGRATION_RECORD, b.v, b.nv, NULL, NULL, &stopped, NULL);
        b_release(&b);
        if (rc != 0) {
            seterr(err, errlen, "%s: recording migration %04d: %s", path, next->version,
                   conn_err(c));
            goto rollback;
        }
        if (exec_simple(c, "COMMIT", msg, sizeof(msg)) != 0) {
            seterr(err, errlen, "%s: committing migration %04d: %s", path, next->version, msg);
            goto rollback;
        }
        gp_log_write(GP_LOG_INFO, "store_migration_applied", NULL,
                     json_pack("{s:i, s:s}", "version", next->version, "name", next->name),
                     "applied migration %04d_%s", next->version, next->name);
    }
rollback:
    exec_simple(c, "ROLLBACK", NULL, 0);
    return -1;
}

static bool is_pg_uri(const char *db)
{
    return strncmp(db, "postgresql://", 13) == 0 || strncmp(db, "postgres://", 11) == 0;
}

/* db for messages and logs (new string, caller frees; NULL on ENOMEM): a
 * URI loses the password of its user:password@ part. */
static char *db_label(const char *db)
{
    const char *scheme = strstr(db, "://");
    const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
    const char *colon = at ? memchr(scheme + 3, ':', (size_t)(at - (scheme + 3))) : NULL;
    if (!colon)
        return strdup(db);
    size_t head = (size_t)(colon - db);
    char *out = malloc(head + strlen(at) + 1);
    if (out) {
        memcpy(out, db, head);
        strcpy(out + head, at);
    }
    return out;
}

/* The engine for db: PostgreSQL for a postgresql:// (or postgres://) URI,
 * SQLite for anything else (a path). *label gets db_label(db). NULL with
 * err when this binary has no such engine. */
static const gps_store__engine *engine_for(const char *db, char **label, char *err,
                                           size_t errlen)
{
    const gps_store__engine *eng = is_pg_uri(db) ? gps_store__pg() : &gps_store__sqlite;
    *label = db_label(db);
    if (!*label) {
        seterr(err, errlen, "out of memory");
        return NULL;
    }
    if (!eng)
        seterr(err, errlen,
               "%s: this gpupool-server was built without libpq, so it cannot use a "
               "PostgreSQL database (install libpq-dev, rebuild; or give a file path for "
               "SQLite)",
               *label);
    return eng;
}

void gps_store_db_label(const char *db, char *out, size_t outlen)
{
    char *l = db ? db_label(db) : NULL;
    seterr(out, outlen, "%s", l ? l : "");
    free(l);
}

bool gps_store_db_is_file(const char *db) { return db && !is_pg_uri(db); }

gps_store *gps_store_open(const char *path, struct event_base *base, const gps_store_opts *opts,
                          char *err, size_t errlen)
{
    gps_store *s = NULL;
    mig_set ms = {0};
    bool mu_ok = false;

    if (!path || !*path) {
        seterr(err, errlen, "no database path given");
        return NULL;
    }
    s = calloc(1, sizeof(*s));
    if (s)
        s->wake_fd = -1;
    if (!s || !(s->target = strdup(path))) {
        seterr(err, errlen, "out of memory");
        goto fail;
    }
    if (!(s->eng = engine_for(path, &s->path, err, errlen)))
        goto fail;
    s->w.eng = s->r.eng = s->eng;
    s->commit_interval_ms = opts && opts->commit_interval_ms > 0 ? opts->commit_interval_ms : 5;
    s->batch_max = opts && opts->batch_max > 0 ? opts->batch_max : 512;
    int hold_ms = opts && opts->row_hold_ms ? opts->row_hold_ms : GPS_STORE_ROW_HOLD_MS;
    s->row_hold_us = hold_ms > 0 ? (uint64_t)hold_ms * 1000 : 0;
    s->queue_max = opts && opts->queue_max > 0 ? opts->queue_max : 100000;
    s->busy_timeout_ms = opts && opts->busy_timeout_ms > 0 ? opts->busy_timeout_ms : 5000;
    s->base = base;
    s->last_commit_ok = true;

    if (mig_load(&ms, opts ? opts->migrations_dir : NULL, err, errlen) != 0)
        goto fail;
    s->w.h = s->eng->conn_open(s->target, s->path, s->busy_timeout_ms, K_COUNT, err,
                                 errlen);
    if (!s->w.h)
        goto fail;
    if (migrate(&s->w, s->path, &ms, err, errlen) != 0)
        goto fail;
    /* Every statement of the DB thread, now: a schema the binary cannot
     * use is refused here, and the thread never prepares (so that
     * gps_store_has_job_events may read w.ok from the loop). */
    for (int k = 0; k < K_COUNT; k++) {
        if (stmts[k].flags & F_SYNC)
            continue;
        if (!conn_stmt(&s->w, k) && !(stmts[k].flags & F_OPT)) {
            seterr(err, errlen, "%s: preparing %s: %s (schema out of step with the binary?)",
                   s->path, stmts[k].name, conn_err(&s->w));
            goto fail;
        }
    }
    for (int k = 0; k < K_COUNT; k++)
        s->w.tried[k] = true;

    if (base) {
        s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (s->wake_fd < 0) {
            seterr(err, errlen, "eventfd: %s", strerror(errno));
            goto fail;
        }
        s->ev_wake = event_new(base, s->wake_fd, EV_READ | EV_PERSIST, on_wake, s);
        if (!s->ev_wake || event_add(s->ev_wake, NULL) != 0) {
            seterr(err, errlen, "event_new failed");
            goto fail;
        }
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    s->pend = calloc(PEND_BUCKETS, sizeof(*s->pend)); /* NULL: writes never fold */
    pthread_cond_init(&s->cv_work, &ca);
    pthread_cond_init(&s->cv_done, NULL);
    pthread_condattr_destroy(&ca);
    mu_ok = true;
    s->thread_alive = true;
    if (pthread_create(&s->thread, NULL, db_main, s) != 0) {
        s->thread_alive = false;
        seterr(err, errlen, "cannot start the DB thread: %s", strerror(errno));
        goto fail;
    }
    s->thread_started = true;
    mig_set_free(&ms);
    return s;

fail:
    mig_set_free(&ms);
    if (s) {
        if (s->ev_wake)
            event_free(s->ev_wake);
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        conn_close(&s->w);
        if (mu_ok) {
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv_work);
            pthread_cond_destroy(&s->cv_done);
        }
        free(s->path);
        free(s->target);
        free(s);
    }
    return NULL;
}

void gps_store_close(gps_store *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* Reads finished after the loop stopped: deliver them here so their
     * args are not leaked. */
    deliver_all(s);
    gps_store__listen_detach(s->listen_hub);
    if (s->ev_wake)
        event_free(s->ev_wake);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    conn_close(&s->w);
    conn_close(&s->r);
    free_chain(s->qhead);
    for (op *o = s->hhead; o; o = o->hnext)
        o->next = o->hnext;
    free_chain(s->hhead); /* none after a stop: the DB thread ran them */
    free(s->pend);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    free(s->path);
    free(s->target);
    free(s);
}

int gps_store_flush(gps_store *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->seq_enqueued;
    s->flush_waiters++;
    pthread_cond_signal(&s->cv_work);
    while (s->seq_done < target && s->thread_alive)
        pthread_cond_wait(&s->cv_done, &s->mu);
    s->flush_waiters--;
    int rc = s->seq_done >= target && s->last_commit_ok ? 0 : -1;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void gps_store_get_stats(gps_store *s, gps_store_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

int gps_store_backlog(gps_store *s, char *msg, size_t msglen)
{
    pthread_mutex_lock(&s->mu);
    uint64_t depth = s->stats.queue_depth, drops = s->stats.drops;
    pthread_mutex_unlock(&s->mu);
    uint64_t high = s->queue_max - s->queue_max / 4, low = s->queue_max / 2;
    if (!s->backlog && depth >= high) {
        s->backlog = true;
        gp_log_write(GP_LOG_ERROR, "store_backlog", NULL,
                     json_pack("{s:I,s:I,s:I}", "queue_depth", (json_int_t)depth, "queue_max",
                               (json_int_t)s->queue_max, "drops_total", (json_int_t)drops),
                     "store: %llu ops queued (the database is slow or away): refusing new "
                     "work until fewer than %llu are", (unsigned long long)depth,
                     (unsigned long long)low);
    } else if (s->backlog && depth < low) {
        s->backlog = false;
        gp_log_write(GP_LOG_INFO, "store_backlog_cleared", NULL,
                     json_pack("{s:I}", "queue_depth", (json_int_t)depth),
                     "store: the queue is down to %llu ops: admitting new work again",
                     (unsigned long long)depth);
    }
    if (!s->backlog)
        return 0;
    snprintf(msg, msglen,
             "this server's database is not keeping up (%llu writes queued): it admits no new "
             "work until they are written; retry, here or on another server",
             (unsigned long long)depth);
    return 1;
}

bool gps_store_healthy(gps_store *s, char *msg, size_t msglen)
{
    pthread_mutex_lock(&s->mu);
    bool ok = s->thread_alive && s->last_commit_ok;
    if (!ok)
        seterr(msg, msglen, "%s", !s->thread_alive ? "DB thread not running" : s->last_error);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* Async writes                                                             */
/* ------------------------------------------------------------------------ */

int gps_store_agent_upsert(gps_store *s, gps_store_agent_row r)
{
    if (!r.id || !r.state)
        return -1;
    if (r.labels)
        return write_op(s, K_AGENT_UPSERT, "tttttjjti", r.id, r.name, r.version, r.platform,
                        r.state, r.labels, r.facts, r.key_id, (int64_t)r.last_seen);
    return write_op(s, K_AGENT_UPSERT, "ttttttjti", r.id, r.name, r.version, r.platform,
                    r.state, "{}", r.facts, r.key_id, (int64_t)r.last_seen);
}

int gps_store_agent_state(gps_store *s, const char *agent_id, const char *state,
                          int64_t last_seen)
{
    if (!agent_id || !state)
        return -1;
    return write_op(s, K_AGENT_STATE, "tti", agent_id, state, last_seen);
}

int gps_store_agent_models(gps_store *s, const char *agent_id, const gps_store_model_row *models,
                           size_t n)
{
    if (!agent_id || (n && !models))
        return -1;
    opb b;
    b_spec(&b, K_MODELS_CLEAR, "t", agent_id);
    op *head = b_pack(&b), *tail = head;
    if (!head)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        const gps_store_model_row *m = &models[i];
        if (!m->model)
            continue;
        json_t *al = json_array();
        for (size_t k = 0; al && k < m->n_aliases; k++)
            if (m->aliases[k])
                json_array_append_new(al, json_string(m->aliases[k]));
        if (!al)
            goto oom;
        b_spec(&b, K_MODEL_INSERT, "ttjtzzi", agent_id, m->model, al, m->quantization,
               (int64_t)m->context_length, (int64_t)m->vram_bytes, (int64_t)(m->loaded ? 1 : 0));
        json_decref(al);
        op *o = b_pack(&b);
        if (!o)
            goto oom;
        tail->next = o;
        tail = o;
    }
    /* One chain: the delete and the inserts land in the same transaction
     * unless the batch boundary falls between them (then the next commit
     * follows within milliseconds). */
    return enqueue(s, head, true);
oom:
    free_chain(head);
    count_drop(s);
    return -1;
}

int gps_store_agent_delete(gps_store *s, const char *agent_id)
{
    if (!agent_id)
        return -1;
    return write_op(s, K_AGENT_DELETE, "t", agent_id);
}

int gps_store_job_insert(gps_store *s, gps_store_job_row r)
{
    if (!r.id || !r.api || !r.model || !r.status)
        return -1;
    if (r.has_seed)
        return row_op(s, r.coalesce, K_JOB_INSERT, "ttttttitiij", r.id, r.api, r.kind, r.model,
                      r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                      (int64_t)r.seed, (int64_t)r.created_at, r.request);
    return row_op(s, r.coalesce, K_JOB_INSERT, "ttttttit-ij", r.id, r.api, r.kind, r.model,
                  r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                  (int64_t)r.created_at, r.request);
}

int gps_store_job_insert_owned(gps_store *s, gps_store_job_row r, const char *owner_server)
{
    if (!owner_server || !*owner_server || !s || !s->w.ok[K_JOB_INSERT_OWNED])
        return gps_store_job_insert(s, r);
    if (!r.id || !r.api || !r.model || !r.status)
        return -1;
    if (r.has_seed)
        return row_op(s, r.coalesce, K_JOB_INSERT_OWNED, "ttttttitiijt", r.id, r.api, r.kind,
                      r.model, r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                      (int64_t)r.seed, (int64_t)r.created_at, r.request, owner_server);
    return row_op(s, r.coalesce, K_JOB_INSERT_OWNED, "ttttttit-ijt", r.id, r.api, r.kind,
                  r.model, r.key_id, r.status, (int64_t)r.priority, r.correlation_id,
                  (int64_t)r.created_at, r.request, owner_server);
}

bool gps_store_has_job_owners(gps_store *s)
{
    return s && s->w.ok[K_JOB_INSERT_OWNED] && s->w.ok[K_JOBS_FAIL_ORPHANS];
}

int gps_store_job_update_async(gps_store *s, gps_store_job_update u)
{
    if (!u.id)
        return -1;
    if (u.lease_attempt > 0)
        return row_op(s, false, K_JOB_UPDATE_FENCED, "tttnnnnnnttni", u.id, u.status,
                      u.agent_id, (int64_t)u.attempts, (int64_t)u.prompt_tokens,
                      (int64_t)u.completion_tokens, (int64_t)u.queue_ms, (int64_t)u.ttft_ms,
                      (int64_t)u.total_ms, u.finish_reason, u.error_code,
                      (int64_t)(u.finished_at > 0 ? u.finished_at : -1),
                      (int64_t)u.lease_attempt);
    return row_op(s, u.coalesce, K_JOB_UPDATE, "tttnnnnnnttn", u.id, u.status, u.agent_id,
                  (int64_t)u.attempts, (int64_t)u.prompt_tokens, (int64_t)u.completion_tokens,
                  (int64_t)u.queue_ms, (int64_t)u.ttft_ms, (int64_t)u.total_ms,
                  u.finish_reason, u.error_code,
                  (int64_t)(u.finished_at > 0 ? u.finished_at : -1));
}

int gps_store_checkpoint(gps_store *s, const char *job_id, const char *text, size_t len,
                         long long last_seq)
{
    if (!job_id || (len && !text))
        return -1;
    return write_op(s, K_CHECKPOINT, "tTii", job_id, text ? text : "", len, (int64_t)last_seq,
                    (int64_t)gp_now_wall_ms());
}

int gps_store_checkpoint_fenced(gps_store *s, const char *job_id, const char *text, size_t len,
                                long long last_seq, int64_t attempt)
{
    if (!job_id || (len && !text))
        return -1;
    if (attempt <= 0)
        return gps_store_checkpoint(s, job_id, text, len, last_seq);
    return write_op(s, K_CHECKPOINT_FENCED, "tTiii", job_id, text ? text : "", len,
                    (int64_t)last_seq, (int64_t)gp_now_wall_ms(), attempt);
}

int gps_store_job_events(gps_store *s, const char *job_id, const json_t *events)
{
    return gps_store_job_events_seq(s, job_id, events, NULL);
}

int gps_store_job_events_seq(gps_store *s, const char *job_id, const json_t *events,
                             uint64_t *op_seq)
{
    size_t n = json_array_size(events);
    if (!job_id || n == 0)
        return -1;
    opb b;
    b_spec(&b, K_EVENTS_ADD, "tiiji", job_id,
           (int64_t)json_integer_value(json_object_get(json_array_get(events, 0), "seq")),
           (int64_t)json_integer_value(json_object_get(json_array_get(events, n - 1), "seq")),
           events, (int64_t)gp_now_wall_ms());
    return enqueue_b(s, &b, op_seq);
}

int gps_store_job_events_fenced(gps_store *s, const char *job_id, const json_t *events,
                                int64_t attempt, uint64_t *op_seq)
{
    size_t n = json_array_size(events);
    if (!job_id || n == 0)
        return -1;
    opb b;
    b_spec(&b, K_EVENTS_ADD_FENCED, "tiijii", job_id,
           (int64_t)json_integer_value(json_object_get(json_array_get(events, 0), "seq")),
           (int64_t)json_integer_value(json_object_get(json_array_get(events, n - 1), "seq")),
           events, (int64_t)gp_now_wall_ms(), attempt);
    return enqueue_b(s, &b, op_seq);
}

bool gps_store_has_task_leases(gps_store *s)
{
    return s && s->w.ok[K_TASK_OWN] && s->w.ok[K_TASK_RENEW] && s->w.ok[K_TASK_CLAIM] &&
           s->w.ok[K_EVENTS_ADD_FENCED] && s->w.ok[K_TASK_FOLLOW] && s->w.ok[K_TASK_LEASE_GET] &&
           s->w.ok[K_JOB_UPDATE_FENCED] && s->w.ok[K_CHECKPOINT_FENCED];
}

int gps_store_task_own(gps_store *s, const char *job_id, const char *server_id,
                       int64_t lease_until, int64_t attempt)
{
    if (!job_id || !server_id)
        return -1;
    return write_op(s, K_TASK_OWN, "ttii", job_id, server_id, lease_until, attempt);
}

int gps_store_task_renew(gps_store *s, const char *server_id, int64_t lease_until)
{
    if (!server_id)
        return -1;
    /* ahead of the queue, as the server's heartbeat (enqueue_front): a
     * backlog of request-log writes must not let the lease run out */
    op *o = read_op(K_TASK_RENEW, "ti", server_id, lease_until);
    return o ? enqueue_front(s, o) : -1;
}

int gps_store_purge_jobs(gps_store *s, int64_t before_wall_ms)
{
    return write_op(s, K_PURGE, "i", before_wall_ms);
}

/* The key row's insert and its limits (migration 0003) are two
 * statements, so that the insert itself works on any schema. */
#define KEY_ROW_SPEC "tttttizzz"
#define KEY_ROW_ARGS(r)                                                                          (r)->id, (r)->hash, (r)->role, (r)->name ? (r)->name : "", (r)->agent_id,                        (int64_t)(r)->created_at, (int64_t)(r)->expires_at, (int64_t)(r)->revoked_at,                (int64_t)(r)->last_used_at
#define KEY_LIMITS_SPEC "tiiii"

static bool key_row_has_extras(const gps_store_key_row *r)
{
    return r->rpm || r->tokens_per_day || r->max_concurrent || r->max_uses;
}

int gps_store_key_insert(gps_store *s, gps_store_key_row r)
{
    if (!r.id || !r.hash || !r.role)
        return -1;
    if (write_op(s, K_KEY_INSERT, KEY_ROW_SPEC, KEY_ROW_ARGS(&r)) != 0)
        return -1;
    /* Both land in the same FIFO, in order. */
    if (!key_row_has_extras(&r))
        return 0;
    return gps_store_key_limits(s, r.id, r.rpm, r.tokens_per_day, r.max_concurrent, r.max_uses);
}

int gps_store_key_limits(gps_store *s, const char *key_id, int64_t rpm, int64_t tokens_per_day,
                         int64_t max_concurrent, int64_t max_uses)
{
    if (!key_id)
        return -1;
    return write_op(s, K_KEY_LIMITS, KEY_LIMITS_SPEC, key_id, rpm, tokens_per_day,
                    max_concurrent, max_uses);
}

int gps_store_key_uses(gps_store *s, const char *key_id, int64_t uses)
{
    if (!key_id)
        return -1;
    return write_op(s, K_KEY_USES, "ti", key_id, uses);
}

int gps_store_usage_add(gps_store *s, const char *key_id, int64_t day, int64_t requests,
                        int64_t prompt_tokens, int64_t completion_tokens, int64_t rate_limited)
{
    /* Counts only add: a negative one would make a fold's sum able to
     * overflow (usage_fold_locked clamps positive sums only). */
    if (!key_id || !*key_id || requests < 0 || prompt_tokens < 0 || completion_tokens < 0 ||
        rate_limited < 0)
        return -1;
    opb b;
    b_spec(&b, K_USAGE_ADD, "tiiiii", key_id, day, requests, prompt_tokens, completion_tokens,
           rate_limited);
    op *o = b_pack(&b);
    if (!o) {
        count_drop(s);
        return -1;
    }
    return enqueue_ex(s, o, true, NULL, ENQ_USAGE);
}

int gps_store_key_revoke(gps_store *s, const char *key_id, int64_t revoked_at)
{
    if (!key_id)
        return -1;
    return write_op(s, K_KEY_REVOKE, "ti", key_id, revoked_at);
}

int gps_store_key_used(gps_store *s, const char *key_id, int64_t used_at)
{
    if (!key_id)
        return -1;
    return write_op(s, K_KEY_USED, "ti", key_id, used_at);
}

int gps_store_key_bind_agent(gps_store *s, const char *key_id, const char *agent_id)
{
    if (!key_id || !agent_id)
        return -1;
    return write_op(s, K_KEY_BIND, "tt", key_id, agent_id);
}

/* ------------------------------------------------------------------------ */
/* Async reads                                                              */
/* ------------------------------------------------------------------------ */

int gps_store_job_get_async(gps_store *s, const char *id, gps_store_job_fn cb, void *arg)
{
    if (!s->ev_wake || !id || !cb)
        return -1;
    op *o = read_op(K_JOB_GET, "t", id);
    if (!o)
        return -1;
    o->job_cb = cb;
    o->arg = arg;
    return enqueue(s, o, false);
}

int gps_store_ping_async(gps_store *s, gps_store_ping_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = read_op(K_PING, "");
    if (!o)
        return -1;
    o->ping_cb = cb;
    o->arg = arg;
    return enqueue(s, o, false);
}

/* ---- servers sharing the DB, and the re-reads that keep them in step ---- */

int gps_store_server_beat_async(gps_store *s, const gps_store_server_row *r,
                                gps_store_status_fn cb, void *arg)
{
    if (!s->ev_wake || !r || !r->id || !r->name || !r->version || !cb)
        return -1;
    op *o = read_op(K_SERVER_BEAT, "tttitiii", r->id, r->name, r->url, r->pid, r->version,
                    r->started_at, r->heartbeat_at, r->lease_until);
    if (!o)
        return -1;
    o->status_cb = cb;
    o->arg = arg;
    return enqueue_front(s, o);
}

bool gps_store_has_servers(gps_store *s) { return s && s->w.ok[K_SERVER_BEAT]; }

int gps_store_server_stop(gps_store *s, const char *id, int64_t at)
{
    return id ? write_op(s, K_SERVER_STOP, "ti", id, at) : -1;
}

int gps_store_server_purge(gps_store *s, int64_t before)
{
    return write_op(s, K_SERVER_PURGE, "i", before);
}

/* A read of kind with one callback of the shared-state family. */
static int shared_read(gps_store *s, op *o, void *arg)
{
    if (!o)
        return -1;
    o->arg = arg;
    return enqueue(s, o, false);
}

int gps_store_servers_async(gps_store *s, gps_store_servers_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = read_op(K_SERVER_LIST, "");
    if (o)
        o->servers_cb = cb;
    return shared_read(s, o, arg);
}

int gps_store_keys_async(gps_store *s, gps_store_keys_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = read_op(K_KEYS_GET, "");
    if (o)
        o->keys_cb = cb;
    return shared_read(s, o, arg);
}

int gps_store_usage_async(gps_store *s, int64_t day, gps_store_usage_rows_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    op *o = read_op(K_USAGE_GET, "i", day);
    if (o)
        o->usage_cb = cb;
    return shared_read(s, o, arg);
}

/* Filters of GET /admin/jobs: NULL binds NULL, "any". */
int gps_store_jobs_list_async(gps_store *s, const gps_store_job_filter *f, gps_store_jobs_fn cb,
                              void *arg)
{
    if (!s->ev_wake || !f || !cb || f->limit < 1)
        return -1;
    op *o = read_op(K_JOB_LIST, "ttttzi", f->status, f->model, f->agent_id, f->key_id,
                    (int64_t)f->before, (int64_t)f->limit);
    if (!o)
        return -1;
    o->jobs_cb = cb;
    o->arg = arg;
    return enqueue(s, o, false);
}

/* Stored responses (migration 0006)                                        */

int gps_store_response_put(gps_store *s, const gps_store_response_row *r)
{
    if (!r || !r->id || !r->key_id || (!r->object && !r->object_text) ||
        (!r->context && !r->context_text))
        return -1;
    /* Values given as trees are dumped here; Responses writes its own text
     * (issue 24: the trees were most of a stored reply's cost). */
    gp_buf d[3];
    const json_t *tree[3] = {r->object, r->context, r->items};
    const char *txt[3] = {r->object_text, r->context_text, r->items_text};
    size_t len[3] = {r->object_len, r->context_len, r->items_len};
    int rc = -1;
    for (int i = 0; i < 3; i++)
        gp_buf_init(&d[i]);
    for (int i = 0; i < 3; i++) {
        if (!tree[i])
            continue;
        if (gp_json_dump_append(&d[i], tree[i]) < 0)
            goto done;
        txt[i] = d[i].data;
        len[i] = d[i].len;
    }
    if (write_op(s, K_RESP_PUT, "ttiiTT", r->id, r->key_id, r->created_at, r->expires_at,
                 txt[0], len[0], txt[1], len[1]) != 0)
        goto done;
    /* Same FIFO: the items and the trim follow the row they belong to. An
     * empty array ("[]") has none. */
    if ((r->items ? json_array_size(r->items) > 0 : r->items_text && len[2] > 2) &&
        write_op(s, K_RESP_ITEMS_PUT, "ttT", r->id, r->key_id, txt[2], len[2]) != 0)
        goto done;
    rc = 0;
done:
    for (int i = 0; i < 3; i++)
        gp_buf_free(&d[i]);
    if (rc < 0)
        return -1;
    if (r->keep_per_key > 0)
        return write_op(s, K_RESP_TRIM, "ti", r->key_id, r->keep_per_key);
    return 0;
}

static int cells_op(gps_store *s, op *o, gps_store_cells_fn cb, void *arg)
{
    if (!o)
        return -1;
    o->cells_cb = cb;
    o->arg = arg;
    return enqueue(s, o, false);
}

int gps_store_response_get_async(gps_store *s, const char *id, const char *key_id,
                                 int64_t now_ms, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !id || !key_id || !cb)
        return -1;
    return cells_op(s, read_op(K_RESP_GET, "tti", id, key_id, now_ms), cb, arg);
}

int gps_store_response_items_async(gps_store *s, const char *key_id, const json_t *ids,
                                   int64_t now_ms, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !key_id || !json_is_array(ids) || !cb)
        return -1;
    return cells_op(s, read_op(K_RESP_ITEMS_GET, "tji", key_id, ids, now_ms), cb, arg);
}

int gps_store_response_delete_async(gps_store *s, const char *id, const char *key_id,
                                    gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !id || !key_id || !cb)
        return -1;
    return cells_op(s, read_op(K_RESP_DELETE, "tt", id, key_id), cb, arg);
}

int gps_store_task_claim_async(gps_store *s, const char *server_id, int64_t lease_until,
                               int64_t now_ms, const json_t *models, int limit,
                               gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(models) || limit < 1 || !cb)
        return -1;
    return cells_op(s, read_op(K_TASK_CLAIM, "tiiji", server_id, lease_until, now_ms, models,
                               (int64_t)limit),
                    cb, arg);
}

int gps_store_jobs_fail_orphans_async(gps_store *s, int64_t now_ms, int64_t dead_before,
                                      gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    return cells_op(s, read_op(K_JOBS_FAIL_ORPHANS, "ii", now_ms, dead_before), cb, arg);
}

int gps_store_task_lease_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                               void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, read_op(K_TASK_LEASE_GET, "t", job_id), cb, arg);
}

int gps_store_task_follow_async(gps_store *s, const char *job_id, long long after_seq,
                                gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, read_op(K_TASK_FOLLOW, "ti", job_id, (int64_t)after_seq), cb, arg);
}

/* ---- the hand-off of a job to another server (migration 0011) ---- */

int gps_store_notify(gps_store *s, const char *channel, const char *payload)
{
    if (!s || s->eng == &gps_store__sqlite)
        return 0;
    return write_op(s, K_NOTIFY, "tt", channel, payload ? payload : "");
}

gps_store_listener *gps_store_listen(gps_store *s, struct event_base *base,
                                     const char *const *channels, gps_store_notify_fn fn,
                                     void *arg)
{
    if (!s || s->eng == &gps_store__sqlite)
        return NULL;
    return gps_store__listener_new(&s->listen_hub, s->target, s->path, base, channels, fn,
                                   arg);
}

bool gps_store_has_handoffs(gps_store *s)
{
    return s && s->w.ok[K_HANDOFF_OFFER] && s->w.ok[K_HANDOFF_CLAIM] &&
           s->w.ok[K_HANDOFF_PEEK] && s->w.ok[K_HANDOFF_CLAIM_IDS] &&
           s->w.ok[K_HANDOFF_WITHDRAW] &&
           s->w.ok[K_HANDOFF_EVENTS] && s->w.ok[K_SERVER_MODELS];
}

int gps_store_server_models(gps_store *s, const char *server_id, const json_t *models)
{
    if (!server_id || !json_is_array(models))
        return -1;
    return write_op(s, K_SERVER_MODELS, "tj", server_id, models);
}

bool gps_store_has_server_free(gps_store *s)
{
    return s && s->w.ok[K_SERVER_FREE] && s->w.ok[K_HANDOFF_PEERS_FREE];
}

int gps_store_server_free(gps_store *s, const char *server_id, const json_t *free_slots)
{
    if (!server_id || !json_is_array(free_slots) || !gps_store_has_server_free(s))
        return -1;
    return write_op(s, K_SERVER_FREE, "tj", server_id, free_slots);
}

int gps_store_handoff_peers_async(gps_store *s, const char *server_id, int64_t now_ms,
                                  gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !server_id || !cb)
        return -1;
    int k = gps_store_has_server_free(s) ? K_HANDOFF_PEERS_FREE : K_HANDOFF_PEERS;
    return cells_op(s, read_op(k, "ti", server_id, now_ms), cb, arg);
}

int gps_store_handoff_offer(gps_store *s, const char *job_id, const char *model,
                            const json_t *spec, const char *from_server, int64_t created_at,
                            int64_t deadline)
{
    if (!job_id || !model || !spec || !from_server)
        return -1;
    return write_op(s, K_HANDOFF_OFFER, "ttjtii", job_id, model, spec, from_server, created_at,
                    deadline);
}

int gps_store_handoff_claim_async(gps_store *s, const char *server_id, int64_t now_ms,
                                  const json_t *models, int limit, gps_store_cells_fn cb,
                                  void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(models) || limit < 1 || !cb)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_CLAIM, "tiji", server_id, now_ms, models,
                               (int64_t)limit),
                    cb, arg);
}

int gps_store_handoff_peek_async(gps_store *s, const char *server_id, int64_t now_ms,
                                 const json_t *models, int limit, gps_store_cells_fn cb,
                                 void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(models) || limit < 1 || !cb)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_PEEK, "tiji", server_id, now_ms, models,
                               (int64_t)limit),
                    cb, arg);
}

int gps_store_handoff_claim_ids_async(gps_store *s, const char *server_id, int64_t now_ms,
                                      const json_t *job_ids, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !server_id || !json_is_array(job_ids) || !cb)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_CLAIM_IDS, "tij", server_id, now_ms, job_ids), cb,
                    arg);
}

int gps_store_handoff_events_async(gps_store *s, const char *job_id, const char *server_id,
                                   int64_t attempt, long long first_seq, long long last_seq,
                                   const json_t *events, gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !server_id || !json_is_array(events) || !cb)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_EVENTS, "tiijiit", job_id, (int64_t)first_seq,
                               (int64_t)last_seq, events, (int64_t)gp_now_wall_ms(), attempt,
                               server_id),
                    cb, arg);
}

int gps_store_handoff_follow_async(gps_store *s, const char *job_id, long long from_seq,
                                   gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_FOLLOW, "ti", job_id, (int64_t)from_seq), cb, arg);
}

int gps_store_handoff_mine_async(gps_store *s, const char *server_id, gps_store_cells_fn cb,
                                 void *arg)
{
    if (!s->ev_wake || !server_id || !cb)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_MINE, "t", server_id), cb, arg);
}

int gps_store_handoff_withdraw_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                                     void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_WITHDRAW, "t", job_id), cb, arg);
}

int gps_store_handoff_end(gps_store *s, const char *job_id, bool done)
{
    if (!job_id)
        return -1;
    return write_op(s, done ? K_HANDOFF_DELETE : K_HANDOFF_CANCEL, "t", job_id);
}

int gps_store_handoff_sweep_async(gps_store *s, int64_t now_ms, gps_store_cells_fn cb,
                                  void *arg)
{
    if (!s->ev_wake || !cb)
        return -1;
    if (write_op(s, K_HANDOFF_SWEEP_FROM, "i", now_ms) != 0)
        return -1;
    return cells_op(s, read_op(K_HANDOFF_SWEEP, "i", now_ms), cb, arg);
}

bool gps_store_has_task_cancel(gps_store *s)
{
    return gps_store_has_task_leases(s) && s->w.ok[K_TASK_CANCEL_REQ] &&
           s->w.ok[K_TASK_CANCELS] && s->w.ok[K_TASK_CANCEL_GET];
}

int gps_store_task_cancel_request_async(gps_store *s, const char *job_id, int64_t now_ms,
                                        gps_store_cells_fn cb, void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, read_op(K_TASK_CANCEL_REQ, "ti", job_id, now_ms), cb, arg);
}

int gps_store_task_cancels_async(gps_store *s, const char *server_id, gps_store_cells_fn cb,
                                 void *arg)
{
    if (!s->ev_wake || !server_id || !cb)
        return -1;
    return cells_op(s, read_op(K_TASK_CANCELS, "t", server_id), cb, arg);
}

int gps_store_task_cancel_get_async(gps_store *s, const char *job_id, gps_store_cells_fn cb,
                                    void *arg)
{
    if (!s->ev_wake || !job_id || !cb)
        return -1;
    return cells_op(s, read_op(K_TASK_CANCEL_GET, "t", job_id), cb, arg);
}

int gps_store_purge_responses(gps_store *s, int64_t now_ms)
{
    return write_op(s, K_RESP_PURGE, "i", now_ms);
}

/* ------------------------------------------------------------------------ */
/* Synchronous: start-up loads and CLI writes, on the owner thread          */
/* ------------------------------------------------------------------------ */

static conn *sync_conn(gps_store *s, char *err, size_t errlen)
{
    if (!s->r.h)
        s->r.h = s->eng->conn_open(s->target, s->path, s->busy_timeout_ms, K_COUNT, err,
                                 errlen);
    return s->r.h ? &s->r : NULL;
}

void gps_store_sync_close(gps_store *s)
{
    if (s)
        conn_close(&s->r);
}

/* Run statement kind with its values by bind spec on the owner thread's
 * connection, each row to each (may be NULL). Returns 0, each's non-zero
 * value (it stopped; it set err if it failed), or -1 with err
 * ("<path>: <what>: <SQLite's message>"). */
static int sync_exec(gps_store *s, row_fn each, void *arg, const char *what, char *err,
                     size_t errlen, int kind, const char *spec, ...)
{
    conn *c = sync_conn(s, err, errlen);
    if (!c)
        return -1;
    opb b;
    va_list ap;
    va_start(ap, spec);
    b_vspec(&b, kind, spec, ap);
    va_end(ap);
    int ret = -1, stopped = 0;
    if (b.oom)
        seterr(err, errlen, "%s: %s: out of memory", s->path, what);
    else if (stmt_exec(c, kind, b.v, b.nv, each, arg, &stopped, &s->sync_changes) != 0)
        seterr(err, errlen, "%s: %s: %s", s->path, what, conn_err(c));
    else
        ret = stopped;
    b_release(&b);
    return ret;
}

/* ---- agents ---- */

/* The models of one agent, as rows pointing into copies kept here. */
typedef struct models_tmp {
    gps_store_model_row *m;
    row **rows;              /* the copied result rows (strings) */
    json_t *keep;            /* parsed alias arrays (alias strings) */
    const char ***aliases;   /* per model, array of alias pointers */
    size_t n;
} models_tmp;

static void models_tmp_free(models_tmp *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->rows[i]);
        free(t->aliases[i]);
    }
    free(t->rows);
    free(t->aliases);
    free(t->m);
    json_decref(t->keep);
    memset(t, 0, sizeof(*t));
}

/* One agent_models row into t; 1 (stop) on ENOMEM. */
static int model_row(void *arg, const row *src)
{
    models_tmp *t = arg;
    size_t k = t->n;
    gps_store_model_row *m = realloc(t->m, (k + 1) * sizeof(*m));
    if (m)
        t->m = m;
    row **rows = realloc(t->rows, (k + 1) * sizeof(*rows));
    if (rows)
        t->rows = rows;
    const char ***al = realloc(t->aliases, (k + 1) * sizeof(*al));
    if (al)
        t->aliases = al;
    row *r = m && rows && al ? row_dup(src) : NULL;
    if (!r)
        return 1;
    t->rows[k] = r;
    t->aliases[k] = NULL;
    t->n++;
    json_t *aj = rs(r, 1) ? json_loads(rs(r, 1), 0, NULL) : NULL;
    size_t na = 0;
    if (json_is_array(aj) && json_array_size(aj)) {
        t->aliases[k] = calloc(json_array_size(aj), sizeof(char *));
        if (!t->aliases[k]) {
            json_decref(aj);
            return 1;
        }
        for (size_t i = 0; i < json_array_size(aj); i++)
            if (json_is_string(json_array_get(aj, i)))
                t->aliases[k][na++] = json_string_value(json_array_get(aj, i));
    }
    if (aj)
        json_array_append_new(t->keep, aj);   /* keeps the alias strings alive */
    t->m[k] = (gps_store_model_row){
        .model = rs(r, 0) ? rs(r, 0) : "",
        .aliases = t->aliases[k],
        .n_aliases = na,
        .quantization = rs(r, 2),
        .context_length = ri(r, 3, 0),
        .vram_bytes = ri(r, 4, 0),
        .loaded = ri(r, 5, 0) != 0,
    };
    return 0;
}

typedef struct load_ctx {
    gps_store *s;
    union {                  /* the caller's callback, of the load's type */
        gps_store_agent_fn agent;
        gps_store_key_fn key;
        gps_store_job_load_fn job;
        gps_store_usage_fn usage;
        gps_store_pin_fn pin;
        gps_store_deploy_fn deploy;
        gps_store_replica_fn replica;
    } cb;
    void *arg;
    char *err;
    size_t errlen;
    bool extras;             /* keys: the 0003 columns are there */
    int64_t day;             /* usage */
} load_ctx;

static int agent_row(void *arg, const row *src)
{
    load_ctx *c = arg;
    /* A copy: the models are read (another statement) before the callback. */
    row *r = row_dup(src);
    if (!r) {
        seterr(c->err, c->errlen, "out of memory");
        return -1;
    }
    gps_store_agent_info a = {
        .id = rs(r, 0),
        .name = rs(r, 1),
        .version = rs(r, 2),
        .platform = rs(r, 3),
        .state = rs(r, 4),
        .key_id = rs(r, 5),
        .first_seen = ri(r, 8, 0),
        .last_seen = ri(r, 9, 0),
    };
    a.labels = rs(r, 6) ? json_loads(rs(r, 6), 0, NULL) : NULL;
    if (!json_is_object(a.labels)) {
        json_decref(a.labels);
        a.labels = json_object();
    }
    a.facts = rs(r, 7) ? json_loads(rs(r, 7), JSON_DECODE_ANY, NULL) : NULL;
    models_tmp mt = {.keep = json_array()};
    int ret = -1;
    if (!a.id) {
        seterr(c->err, c->errlen, "%s: agent row without id", c->s->path);
    } else if (!mt.keep) {
        seterr(c->err, c->errlen, "out of memory");
    } else {
        /* -1: err says why */
        int mrc = sync_exec(c->s, model_row, &mt, "reading agent_models", c->err, c->errlen,
                            K_LOAD_MODELS, "t", a.id);
        if (mrc > 0)
            seterr(c->err, c->errlen, "out of memory");
        if (mrc == 0) {
            a.models = mt.m;
            a.n_models = mt.n;
            ret = c->cb.agent(c->arg, &a);
        }
    }
    models_tmp_free(&mt);
    json_decref(a.labels);
    json_decref(a.facts);
    free(r);
    return ret;
}

int gps_store_load_agents(gps_store *s, gps_store_agent_fn cb, void *arg, char *err,
                          size_t errlen)
{
    load_ctx c = {.s = s, .cb.agent = cb, .arg = arg, .err = err, .errlen = errlen};
    return sync_exec(s, agent_row, &c, "reading agents", err, errlen, K_LOAD_AGENTS, "");
}

/* ---- keys ---- */

static int key_row(void *arg, const row *r)
{
    load_ctx *c = arg;
    gps_store_key_row k = {
        .id = rs(r, 0),
        .hash = rs(r, 1),
        .role = rs(r, 2),
        .name = rs(r, 3) ? rs(r, 3) : "",
        .agent_id = rs(r, 4),
        .created_at = ri(r, 5, 0),
        .expires_at = ri(r, 6, 0),
        .revoked_at = ri(r, 7, 0),
        .last_used_at = ri(r, 8, 0),
        .rpm = c->extras ? ri(r, 9, 0) : 0,
        .tokens_per_day = c->extras ? ri(r, 10, 0) : 0,
        .max_concurrent = c->extras ? ri(r, 11, 0) : 0,
        .max_uses = c->extras ? ri(r, 12, 0) : 0,
        .uses = c->extras ? ri(r, 13, 0) : 0,
    };
    return k.id && k.hash && k.role ? c->cb.key(c->arg, &k) : 0;
}

int gps_store_load_keys(gps_store *s, gps_store_key_fn cb, void *arg, char *err, size_t errlen)
{
    load_ctx c = {.s = s, .cb.key = cb, .arg = arg, .err = err, .errlen = errlen};
    conn *sc = sync_conn(s, err, errlen);
    if (!sc)
        return -1;
    /* A DB migrated by a custom set without 0003 has no limit columns:
     * then every key loads as unlimited. */
    c.extras = conn_stmt(sc, K_LOAD_KEYS);
    return sync_exec(s, key_row, &c, "reading api_keys", err, errlen,
                     c.extras ? K_LOAD_KEYS : K_LOAD_KEYS_BASE, "");
}

int gps_store_key_insert_sync(gps_store *s, const gps_store_key_row *row_in, char *err,
                              size_t errlen)
{
    if (!row_in || !row_in->id || !row_in->hash || !row_in->role) {
        seterr(err, errlen, "key row needs id, hash and role");
        return -1;
    }
    bool extras = key_row_has_extras(row_in);
    /* Key and limits in one transaction: a key never exists without the
     * limits it was created with. */
    conn *c = extras ? sync_conn(s, err, errlen) : NULL;
    char msg[256] = "";
    if (extras && (!c || exec_simple(c, s->eng->begin_sql, msg, sizeof(msg)) != 0)) {
        if (c)
            seterr(err, errlen, "%s: inserting key: %s", s->path, msg);
        return -1;
    }
    int ret = sync_exec(s, NULL, NULL, "inserting key", err, errlen, K_KEY_INSERT, KEY_ROW_SPEC,
                        KEY_ROW_ARGS(row_in));
    if (ret == 0 && extras)
        ret = sync_exec(s, NULL, NULL, "setting key limits", err, errlen, K_KEY_LIMITS,
                        KEY_LIMITS_SPEC, row_in->id, row_in->rpm, row_in->tokens_per_day,
                        row_in->max_concurrent, row_in->max_uses);
    if (extras && exec_simple(c, ret == 0 ? "COMMIT" : "ROLLBACK", msg, sizeof(msg)) != 0 &&
        ret == 0) {
        seterr(err, errlen, "%s: inserting key: %s", s->path, msg);
        ret = -1;
    }
    return ret;
}

int gps_store_key_revoke_sync(gps_store *s, const char *key_id, int64_t revoked_at, char *err,
                              size_t errlen)
{
    if (sync_exec(s, NULL, NULL, "revoking key", err, errlen, K_KEY_REVOKE, "ti", key_id,
                  revoked_at) != 0)
        return -1;
    return s->sync_changes > 0 ? 0 : 1;
}

/* ---- unfinished jobs, usage ---- */

static int job_row(void *arg, const row *src)
{
    load_ctx *c = arg;
    /* A copy: the event log is read (another statement) before the callback. */
    row *r = row_dup(src);
    if (!r) {
        seterr(c->err, c->errlen, "out of memory");
        return -1;
    }
    gps_store_job_info ji;
    json_t *req;
    job_info_from_row(r, &ji, &req);
    /* Optional (no job_events table before migration 0002). */
    ji.events = events_collect(&c->s->r, ji.id);
    int ret = c->cb.job(c->arg, &ji);
    json_decref(req);
    json_decref(ji.events);
    free(r);
    return ret;
}

int gps_store_load_unfinished_jobs(gps_store *s, gps_store_job_load_fn cb, void *arg, char *err,
                                   size_t errlen)
{
    load_ctx c = {.s = s, .cb.job = cb, .arg = arg, .err = err, .errlen = errlen};
    return sync_exec(s, job_row, &c, "reading jobs", err, errlen, K_LOAD_JOBS, "");
}

static int usage_row(void *arg, const row *r)
{
    load_ctx *c = arg;
    const char *id = rs(r, 0);
    if (!id)
        return 0;
    return c->cb.usage(c->arg, id, c->day, ri(r, 1, 0), ri(r, 2, 0), ri(r, 3, 0), ri(r, 4, 0));
}

int gps_store_load_usage(gps_store *s, int64_t day, gps_store_usage_fn cb, void *arg, char *err,
                         size_t errlen)
{
    load_ctx c = {.s = s, .cb.usage = cb, .arg = arg, .err = err, .errlen = errlen, .day = day};
    return sync_exec(s, usage_row, &c, "reading key_usage", err, errlen, K_LOAD_USAGE, "i", day);
}

/* ---- model pins ---- */

int gps_store_pin_set(gps_store *s, const char *name, const char *sha256, int64_t created_at,
                      const char *created_by)
{
    if (!name || !sha256)
        return -1;
    return write_op(s, K_PIN_SET, "ttit", name, sha256, created_at, created_by);
}

int gps_store_pin_delete(gps_store *s, const char *name)
{
    if (!name)
        return -1;
    return write_op(s, K_PIN_DELETE, "t", name);
}

static int pin_row(void *arg, const row *r)
{
    load_ctx *c = arg;
    const char *name = rs(r, 0), *sha = rs(r, 1);
    if (!name || !sha)
        return 0;
    return c->cb.pin(c->arg, name, sha, ri(r, 2, 0), rs(r, 3));
}

int gps_store_load_pins(gps_store *s, gps_store_pin_fn cb, void *arg, char *err, size_t errlen)
{
    load_ctx c = {.s = s, .cb.pin = cb, .arg = arg, .err = err, .errlen = errlen};
    return sync_exec(s, pin_row, &c, "reading model_pins", err, errlen, K_LOAD_PINS, "");
}

/* ---- deployments ---- */

int gps_store_deploy_put(gps_store *s, const gps_store_deploy_row *d)
{
    if (!d || !d->name || !d->source)
        return -1;
    return write_op(s, K_DEPLOY_PUT, "tttitiit", d->name, d->source, d->sha256,
                    (int64_t)d->replicas, d->labels_json ? d->labels_json : "{}",
                    (int64_t)d->bytes, d->created_at, d->created_by);
}

int gps_store_deploy_delete(gps_store *s, const char *name)
{
    if (!name)
        return -1;
    return write_op(s, K_DEPLOY_DELETE, "t", name);
}

int gps_store_replica_put(gps_store *s, const gps_store_replica_row *r)
{
    if (!r || !r->deployment || !r->agent_id || !r->state)
        return -1;
    return write_op(s, K_REPLICA_PUT, "ttttiiii", r->deployment, r->agent_id, r->state,
                    r->reason, (int64_t)r->bytes, (int64_t)r->total, (int64_t)r->rate,
                    r->updated_at);
}

int gps_store_replica_delete(gps_store *s, const char *deployment, const char *agent_id)
{
    if (!deployment || !agent_id)
        return -1;
    return write_op(s, K_REPLICA_DELETE, "tt", deployment, agent_id);
}

static int deploy_row(void *arg, const row *r)
{
    load_ctx *c = arg;
    gps_store_deploy_row d = {
        .name = rs(r, 0),
        .source = rs(r, 1),
        .sha256 = rs(r, 2),
        .replicas = (int)ri(r, 3, 0),
        .labels_json = rs(r, 4),
        .bytes = ri(r, 5, 0),
        .created_at = ri(r, 6, 0),
        .created_by = rs(r, 7),
    };
    if (!d.name || !d.source)
        return 0;
    return c->cb.deploy(c->arg, &d);
}

static int replica_row(void *arg, const row *src)
{
    load_ctx *c = arg;
    gps_store_replica_row r = {
        .deployment = rs(src, 0),
        .agent_id = rs(src, 1),
        .state = rs(src, 2),
        .reason = rs(src, 3),
        .bytes = ri(src, 4, 0),
        .total = ri(src, 5, 0),
        .rate = ri(src, 6, 0),
        .updated_at = ri(src, 7, 0),
    };
    if (!r.deployment || !r.agent_id || !r.state)
        return 0;
    return c->cb.replica(c->arg, &r);
}

int gps_store_load_deployments(gps_store *s, gps_store_deploy_fn dcb, gps_store_replica_fn rcb,
                               void *arg, char *err, size_t errlen)
{
    load_ctx c = {.s = s, .cb.deploy = dcb, .arg = arg, .err = err, .errlen = errlen};
    if (sync_exec(s, deploy_row, &c, "reading deployments", err, errlen, K_LOAD_DEPLOYS, "") < 0)
        return -1;
    c.cb.replica = rcb;
    return sync_exec(s, replica_row, &c, "reading deployment_replicas", err, errlen,
                     K_LOAD_REPLICAS, "");
}
