-- gpupool schema, version 3: per-key limits, enrollment token use counts
-- and per-key usage accounting (src/server/limits.h, docs/operations.md).
-- 0 in a limit column means unlimited.
ALTER TABLE api_keys ADD COLUMN rpm INTEGER NOT NULL DEFAULT 0;             -- requests per minute
ALTER TABLE api_keys ADD COLUMN tokens_per_day INTEGER NOT NULL DEFAULT 0;  -- per UTC day
ALTER TABLE api_keys ADD COLUMN max_concurrent INTEGER NOT NULL DEFAULT 0;  -- jobs at once
ALTER TABLE api_keys ADD COLUMN max_uses INTEGER NOT NULL DEFAULT 0;        -- enrollment tokens
ALTER TABLE api_keys ADD COLUMN uses INTEGER NOT NULL DEFAULT 0;            -- enrollments so far

-- Usage per key and UTC day, added to as requests are admitted or refused
-- and as jobs finish. Read back at start-up so a daily budget survives a
-- restart; kept for accounting (no foreign key: keys are only revoked,
-- never deleted, and usage outlives nothing it refers to).
CREATE TABLE key_usage (
    key_id             TEXT NOT NULL,
    day                INTEGER NOT NULL,            -- days since 1970-01-01 (UTC)
    requests           INTEGER NOT NULL DEFAULT 0,  -- admitted requests
    prompt_tokens      INTEGER NOT NULL DEFAULT 0,
    completion_tokens  INTEGER NOT NULL DEFAULT 0,
    rate_limited       INTEGER NOT NULL DEFAULT 0,  -- refused by rpm or tokens_per_day
    PRIMARY KEY (key_id, day)
) WITHOUT ROWID;
