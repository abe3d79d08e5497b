/*
 * store_stmts.c: every statement the store runs, one table (store_priv.h
 * names its rows, K_*).
 */
#include "server/store/store_priv.h"

/* Every statement the store runs. A row: the name (for logs), flags, and
 * the SQL; its parameters ?1..?N are bound from an op's values, which the
 * function that queues or runs it builds with one bind spec (store_b_spec). */
/* The columns a job update sets, ?2..?12 (COALESCE: NULL keeps the
 * column), shared by its four statements: plain or fenced by the lease,
 * with or without the error message (migration 0014). */
#define JOB_UPDATE_SET                                                                     \
    "UPDATE jobs SET status = COALESCE(?2, status), agent_id = COALESCE(?3, agent_id), "   \
    "attempts = COALESCE(?4, attempts), prompt_tokens = COALESCE(?5, prompt_tokens), "     \
    "completion_tokens = COALESCE(?6, completion_tokens), "                                \
    "queue_ms = COALESCE(?7, queue_ms), ttft_ms = COALESCE(?8, ttft_ms), "                 \
    "total_ms = COALESCE(?9, total_ms), finish_reason = COALESCE(?10, finish_reason), "    \
    "error_code = COALESCE(?11, error_code), finished_at = COALESCE(?12, finished_at)"

const store_stmt store_stmts[K_COUNT] = {

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
        JOB_UPDATE_SET " WHERE id = ?1", NULL},

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
    /* Same column layout as JOB_COLUMNS (store_job_info_from_row reads by
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
        JOB_UPDATE_SET " WHERE id = ?1 AND lease_attempt = ?13", NULL},

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
    /* K_JOB_UPDATE and K_JOB_UPDATE_FENCED that also write the error
     * message (?13); never folded (store_write.c: only rows that do not
     * coalesce carry a message). */

    [K_JOB_UPDATE_MSG] = {"job_update_msg", F_OPT,
        JOB_UPDATE_SET ", error_message = COALESCE(?13, error_message) WHERE id = ?1", NULL},

    [K_JOB_UPDATE_FENCED_MSG] = {"job_update_fenced_msg", F_OPT,
        JOB_UPDATE_SET ", error_message = COALESCE(?13, error_message) "
        "WHERE id = ?1 AND lease_attempt = ?14", NULL},
    /* K_JOB_GET with the message as column JOB_COL_ERROR_MESSAGE; K_JOB_GET
     * ops run it when the schema has the column (store_db.c). */

    [K_JOB_GET_MSG] = {"job_get_msg", F_OPT,
        "SELECT " JOB_COLUMNS_LIST ", j.error_message " JOB_COLUMNS_FROM "WHERE j.id = ?1", NULL},
};
