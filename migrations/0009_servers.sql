-- gpupool schema, version 9: the servers that share this database (issue
-- 28 item 2, docs/scaling.md section 3). Each gpupool-server announces
-- itself at start (one row per process: a fresh id each start), renews its
-- lease with a heartbeat every few seconds and marks itself stopped on a
-- clean shutdown. A row whose lease_until has passed without stopped_at is
-- a server that died or lost the database (kill -9, partition). With SQLite
-- there is only ever the one server: one row, rewritten at each heartbeat.
CREATE TABLE servers (
    id           TEXT PRIMARY KEY,     -- "srv_" + 24 hex, new at each start
    name         TEXT NOT NULL,        -- server_name, else host:port of the listener
    url          TEXT,                 -- advertise_url: how agents and peers reach it
    pid          INTEGER NOT NULL,
    version      TEXT NOT NULL,
    started_at   INTEGER NOT NULL,     -- wall ms
    heartbeat_at INTEGER NOT NULL,     -- wall ms of the last renewal
    lease_until  INTEGER NOT NULL,     -- heartbeat_at + lease_sec: alive until then
    stopped_at   INTEGER               -- clean shutdown (NULL while running)
);
CREATE INDEX servers_lease ON servers (lease_until);
