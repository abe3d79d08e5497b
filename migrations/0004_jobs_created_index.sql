-- gpupool schema, version 4: an index for the admin API's request-log
-- listing (GET /admin/jobs, gpupoolctl jobs list: newest first, optional
-- filters, a page of up to 1000). Without it every listing scanned and
-- sorted the whole jobs table on the DB thread, which also commits every
-- write: 63 ms per listing at 300,000 rows, 0.1 ms with the index.
CREATE INDEX jobs_created ON jobs(created_at, id);
