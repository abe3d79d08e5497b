-- gpupool schema, version 12: a DELETE of a native task that another
-- server runs (issue 28, docs/scaling.md "Native tasks across servers").
-- The server that answers the DELETE marks the row (wall ms of the
-- request); the task's owner reads the requests for the tasks it holds
-- (store.c K_TASK_CANCELS, every half second while it holds any) and
-- cancels the job as a DELETE sent to it would: the terminal event goes to
-- the log, the row ends `cancelled`. A server that claims an expired lease
-- finds the mark the same way. NULL: no cancel asked. (0011 is the
-- hand-off's.)
ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER;
