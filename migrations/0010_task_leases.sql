-- gpupool schema, version 10: native tasks shared by several servers on one
-- PostgreSQL (issue 28, docs/scaling.md "Native tasks across servers").
-- The server that runs a native task holds it: owner_server (its random id
-- for this process), lease_until (wall ms; the owner renews it while it
-- runs) and lease_attempt, the fencing token: a server claims a task whose
-- lease expired with one UPDATE that bumps the attempt, and the event-log
-- writes of an older attempt are refused (store.c K_EVENTS_ADD_FENCED).
-- A SQLite store (one server) leaves these columns NULL / 0.
ALTER TABLE jobs ADD COLUMN owner_server TEXT;
ALTER TABLE jobs ADD COLUMN lease_until INTEGER;
ALTER TABLE jobs ADD COLUMN lease_attempt INTEGER NOT NULL DEFAULT 0;
