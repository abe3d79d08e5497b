-- gpupool schema, version 2: the event log of native tasks (/v2/tasks), so
-- that Last-Event-ID replays exactly the events a client missed once the
-- task left the server's memory or the server restarted, and a task that
-- was running at a restart continues with its numbering. See
-- docs/persistence.md.
--
-- One row per checkpoint batch: the events first_seq..last_seq (contiguous,
-- ascending) as a compact JSON array of {"seq","type","data"} objects, the
-- exact objects the server sent as SSE `id:`/`event:`/`data:`. A batch is
-- written in one statement, so a batch is in the DB whole or not at all.
CREATE TABLE job_events (
    job_id     TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    first_seq  INTEGER NOT NULL,
    last_seq   INTEGER NOT NULL,
    events     TEXT NOT NULL,              -- JSON array of {seq, type, data}
    created_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, first_seq)
);
