-- gpupool schema, version 5: model attestation (docs/admin.md "Model pins").
-- An operator pins a model name (id or alias) to the sha256 of the file that
-- must serve it (`gpupoolctl models pin NAME SHA256`); an agent whose file
-- for that name has another digest (or none) is refused for that model.
CREATE TABLE model_pins (
    name       TEXT PRIMARY KEY,
    sha256     TEXT NOT NULL CHECK (length(sha256) = 64),
    created_at INTEGER NOT NULL,
    created_by TEXT
);
