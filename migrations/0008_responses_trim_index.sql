-- gpupool schema, version 8: an index that matches the per-key trim of
-- stored Responses (store.c K_RESP_TRIM: a key keeps its newest
-- responses_per_key, newest by created_at, then id). The index of version 6
-- has no id, so SQLite sorted every run of equal created_at in a temporary
-- b-tree, reset once per row: each Responses request cleared one such tree
-- per response the key had stored (1,000 at the default), which made
-- about a sixth of the server's instructions in bench/relay_cpu.py. With id
-- in the index the trim walks it backwards and sorts nothing; the old index
-- is its prefix, so it goes.
CREATE INDEX responses_key_created_id ON responses (key_id, created_at, id);
DROP INDEX responses_key_created;
