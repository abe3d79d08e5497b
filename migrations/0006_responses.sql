-- gpupool schema, version 6: stored Responses (docs/api.md "Stored responses").
-- POST /v1/responses with store true (the default) keeps the response object
-- and the conversation through it, per key, until expires_at, so that a later
-- request can say previous_response_id or refer to an output item with
-- {"type":"item_reference","id":...}; GET and DELETE /v1/responses/{id} read
-- and remove it. key_id is '' for requests made with auth off.
CREATE TABLE responses (
    id         TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    object     TEXT NOT NULL,   -- the response object as the client got it
    context    TEXT NOT NULL    -- chat messages through this response (instructions excluded)
);
CREATE INDEX responses_key_created ON responses (key_id, created_at);
CREATE INDEX responses_expires ON responses (expires_at);

-- Each output item of a stored response (message or function call) as the
-- chat message fragment it stands for in a later conversation.
CREATE TABLE response_items (
    item_id     TEXT PRIMARY KEY,
    response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE,
    key_id      TEXT NOT NULL,
    message     TEXT NOT NULL
);
CREATE INDEX response_items_response ON response_items (response_id);
