-- gpupool schema, version 14: the message of a failed or cancelled job,
-- beside its error_code. A native task read back from its row (after a
-- restart, an eviction from memory, on another server of the pool) says
-- it in GET /v2/tasks/{id} and in an error event rebuilt from the row,
-- instead of repeating the code. Written with error_code, at most 1 KiB
-- (cut at a UTF-8 character boundary). NULL: a row written before this
-- migration, or by a write that had no message (readers show the code).
ALTER TABLE jobs ADD COLUMN error_message TEXT;
