/*
 * embeddings: the shapes of OpenAI's POST /v1/embeddings, without I/O
 * (api_embeddings.c is the handler). Pure functions, unit-tested.
 *
 * Request: model; input a string, an array of strings, an array of token
 * ids, or an array of arrays of token ids (1 to GPS_EMBED_MAX_INPUTS inputs,
 * none empty); encoding_format "float" (default) or "base64"; dimensions
 * (checked against the vectors: only the model's own length is accepted);
 * user. Response: {object:"list", data:[{object:"embedding", index,
 * embedding}], model, usage:{prompt_tokens, total_tokens}}, where embedding
 * is an array of numbers or the base64 of little-endian float32.
 */
#ifndef GPS_EMBEDDINGS_H
#define GPS_EMBEDDINGS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#define GPS_EMBED_MAX_INPUTS 2048

typedef struct gps_embed_req {
    char *model;             /* owned */
    json_t *input;           /* owned: array of strings / arrays of token ids, one per input */
    bool base64;             /* encoding_format "base64" */
    long long dimensions;    /* 0 = not given */
    char *user;              /* owned, or NULL */
} gps_embed_req;

void gps_embed_req_clear(gps_embed_req *r);
/* Parse body (borrowed). ctx_len > 0: token-id inputs longer than it are
 * refused. 0, or -1 with msg and *param (static: the field to name), or
 * GPS_PARSE_OOM (reqcheck.h) with msg and no param. */
int gps_embed_parse(const json_t *body, long long ctx_len, gps_embed_req *out, char *msg,
                    size_t msglen, const char **param);
/* The response body into *out (new reference) from vecs (borrowed: one
 * base64 string of little-endian float32 per input, in order). 0, or -1
 * with msg and *param when a vector is missing or malformed (param NULL)
 * or does not have req->dimensions entries (param "dimensions"), or
 * GPS_PARSE_OOM with msg and no param. */
int gps_embed_response(const gps_embed_req *req, const char *model, const json_t *vecs,
                       long long prompt_tokens, json_t **out, char *msg, size_t msglen,
                       const char **param);

#endif
