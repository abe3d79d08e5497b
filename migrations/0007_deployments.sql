-- gpupool schema, version 7: models deployed from the server (issue 27,
-- docs/admin.md "Deployments"). A deployment is the operator's desired
-- state ("run this file under this name on R agents matching these
-- labels"); deployment_replicas is where the server placed each replica and
-- what its agent last reported. Both survive a restart: agents that poll
-- again converge to them.
CREATE TABLE deployments (
    name       TEXT PRIMARY KEY,
    source     TEXT NOT NULL,          -- http(s) URL or hf:OWNER/REPO/FILE.gguf[@REV]
    sha256     TEXT,                   -- 64 hex, or NULL: not checked
    replicas   INTEGER NOT NULL CHECK (replicas >= 0),
    labels     TEXT NOT NULL DEFAULT '{}', -- JSON object: an agent must carry each label
    bytes      INTEGER NOT NULL DEFAULT 0, -- file size when known (0: not yet)
    created_at INTEGER NOT NULL,
    created_by TEXT
);
CREATE TABLE deployment_replicas (
    deployment TEXT NOT NULL REFERENCES deployments(name) ON DELETE CASCADE,
    agent_id   TEXT NOT NULL,
    state      TEXT NOT NULL,          -- assigned, downloading, loading, ready, failed
    reason     TEXT,                   -- failed: why
    bytes      INTEGER NOT NULL DEFAULT 0, -- downloaded so far (as of the last state change;
    total      INTEGER NOT NULL DEFAULT 0, --  the live figures are in memory)
    rate       INTEGER NOT NULL DEFAULT 0, -- bytes/s
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (deployment, agent_id)
);
