-- gpupool schema, version 1. Applied once, in one transaction, by the
-- server's store at start-up (src/server/store.c) and recorded in
-- schema_migrations. Never edit a released migration: add NNNN_name.sql.
-- Times are wall-clock milliseconds since the epoch; JSON columns hold
-- compact JSON text. The summary at the top of src/server/store.h must
-- stay in step with this file.

-- Agents seen by the registry: their durable copy, read back at start-up.
CREATE TABLE agents (
    id          TEXT PRIMARY KEY,            -- agent UUID (kept in the agent's state dir)
    name        TEXT,
    version     TEXT,
    platform    TEXT,
    state       TEXT NOT NULL,               -- registering|healthy|suspect|dead|draining|offline
    labels      TEXT NOT NULL DEFAULT '{}',  -- JSON object
    facts       TEXT,                        -- JSON: last poll body (gpus, slots, ...)
    key_id      TEXT,                        -- key the agent authenticated with
    first_seen  INTEGER NOT NULL,
    last_seen   INTEGER NOT NULL
);

-- Models an agent serves (replaced as a whole when its list changes).
CREATE TABLE agent_models (
    agent_id        TEXT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    model           TEXT NOT NULL,
    aliases         TEXT NOT NULL DEFAULT '[]',  -- JSON array of strings
    quantization    TEXT,
    context_length  INTEGER,
    vram_bytes      INTEGER,
    loaded          INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, model)
);
CREATE INDEX agent_models_model ON agent_models(model);

-- API keys. Only the SHA-256 of a key is stored, never the key itself.
CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,          -- "key_" + 24 hex, public
    hash          TEXT NOT NULL UNIQUE,      -- lowercase hex SHA-256 of the raw key
    role          TEXT NOT NULL CHECK (role IN ('client', 'agent', 'admin', 'enrollment')),
    name          TEXT NOT NULL DEFAULT '',
    agent_id      TEXT,                      -- agent keys: bound on first use
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER,                   -- NULL = never
    revoked_at    INTEGER,                   -- NULL = active
    last_used_at  INTEGER
);

-- The request log: one row per client request (job).
CREATE TABLE jobs (
    id                 TEXT PRIMARY KEY,
    api                TEXT NOT NULL,        -- openai|anthropic|native
    kind               TEXT,                 -- completion|chat|count_tokens
    model              TEXT NOT NULL,
    key_id             TEXT,
    agent_id           TEXT,
    status             TEXT NOT NULL,        -- queued|assigned|running|done|failed|cancelled
    priority           INTEGER NOT NULL DEFAULT 0,  -- 0 interactive, 1 batch
    attempts           INTEGER NOT NULL DEFAULT 0,
    prompt_tokens      INTEGER,
    completion_tokens  INTEGER,
    queue_ms           INTEGER,
    ttft_ms            INTEGER,
    total_ms           INTEGER,
    finish_reason      TEXT,
    error_code         TEXT,
    correlation_id     TEXT,
    seed               INTEGER,
    request            TEXT,                 -- JSON input: only with log_prompts, or native tasks
    created_at         INTEGER NOT NULL,
    finished_at        INTEGER               -- NULL while unfinished
);
CREATE INDEX jobs_finished_at ON jobs(finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_unfinished ON jobs(created_at) WHERE finished_at IS NULL;

-- Generated text so far of a running job (failover / resume across restarts).
CREATE TABLE job_checkpoints (
    job_id      TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    text        TEXT NOT NULL,
    last_seq    INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
