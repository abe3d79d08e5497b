-- gpupool schema, version 11: the hand-off of a job to another server
-- (issue 28 item 3, docs/scaling.md "3e. Hand-off of a job to another
-- server"). A server whose agents cannot take a request offers it here
-- while another live server lists the model in servers.models; a server
-- with a free agent for it claims the row (attempt + 1: the fencing token),
-- runs the job and relays its events back through job_events, in batches
-- whose seqs carry the attempt (attempt * 1000000000 + index). A SQLite
-- store (one server) never writes these rows.
CREATE TABLE handoffs (
    job_id      TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    model       TEXT NOT NULL,     -- the model asked for
    spec        TEXT NOT NULL,     -- the job's wire object as an agent gets it (JSON)
    from_server TEXT NOT NULL,     -- servers.id holding the client (= jobs.owner_server)
    state       TEXT NOT NULL,     -- waiting | claimed | cancelled
    claimed_by  TEXT,              -- servers.id running it
    attempt     INTEGER NOT NULL DEFAULT 0,  -- + 1 at each claim: the fencing token
    created_at  INTEGER NOT NULL,  -- wall ms
    deadline    INTEGER NOT NULL   -- wall ms: the client's queue timeout
);
CREATE INDEX handoffs_waiting ON handoffs (model, created_at) WHERE state = 'waiting';
CREATE INDEX handoffs_claimed ON handoffs (claimed_by) WHERE state = 'claimed';
-- What a server's healthy agents serve (a JSON array of names), written
-- with its heartbeat: where a hand-off may go.
ALTER TABLE servers ADD COLUMN models TEXT;
