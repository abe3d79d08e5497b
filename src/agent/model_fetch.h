/*
 * model_fetch: put a model file on the box. `gpupool-agent --model URL`
 * (http://, https://, or hf:OWNER/REPO/PATH.gguf[@REVISION]) downloads the
 * file into a cache directory before the agent registers, so an agent only
 * ever announces a model that is complete, verified and loadable.
 *
 *   cache_dir/<16 hex of sha256(url)>/<file name>        the model
 *   cache_dir/<16 hex of sha256(url)>/<file name>.part   a download in progress
 *
 * A download resumes from the .part file (HTTP Range; a server that ignores
 * ranges restarts it), retries dropped connections with backoff (bounded),
 * checks the sha256 when one is given, and renames the file into place only
 * when complete, so a crash never leaves a truncated model under the final
 * name. A file already in the cache is used without a request (after its
 * sha256 check when one is given; a mismatch downloads it again).
 *
 * Bounds (issue 25): a file larger than max_bytes (by its Content-Length,
 * or as its bytes arrive) is refused and its .part removed; a download
 * that starts on https:// follows redirects to https:// only.
 */
#ifndef GPUPOOL_AGENT_MODEL_FETCH_H
#define GPUPOOL_AGENT_MODEL_FETCH_H

#include <stdbool.h>
#include <stddef.h>

#define MODEL_FETCH_DEFAULT_MAX_BYTES (1LL << 40) /* 1 TiB */

typedef struct model_fetch_opts {
    const char *spec;        /* what --model said: URL or hf:... */
    const char *sha256;      /* expected digest (64 hex), or NULL */
    const char *cache_dir;   /* where downloads go (created 0750) */
    const char *state_dir;   /* for the digest cache (agent_facts.h); may be NULL */
    const char *hf_endpoint; /* base URL for hf: specs, e.g. https://huggingface.co */
    const char *token;       /* Bearer token sent with the download, or NULL */
    const char *ca_file;     /* PEM bundle for https, or NULL (system CAs) */
    int max_attempts;        /* connection attempts without progress before giving up */
    long long max_bytes;     /* largest file accepted (0: MODEL_FETCH_DEFAULT_MAX_BYTES) */
    bool progress_bar;       /* a terminal: draw a bar on stderr; else log lines */
    /* (optional, may be NULL) every time bytes arrive: have of total (-1
     * unknown) and this attempt's rate in bytes/s. Called on the fetching
     * thread; must be quick (a deployed model's progress for the server). */
    void (*on_progress)(void *ud, long long have, long long total, double rate);
    void *progress_ud;
} model_fetch_opts;

/* True when spec names a remote model (http://, https://, hf:). */
bool model_fetch_is_remote(const char *spec);

/* The download URL of spec: an http(s) URL as it is; hf:OWNER/REPO/PATH
 * [@REV] (or hf:OWNER/REPO:PATH[@REV]) -> ENDPOINT/OWNER/REPO/resolve/REV/
 * PATH (REV defaults to main).
 * Returns 0, or -1 with err (a malformed hf: spec, an overlong URL). */
int model_fetch_url(const char *spec, const char *hf_endpoint, char *out, size_t outlen,
                    char *err, size_t errlen);

/* The cache path of url's file (see the layout above), from the URL's last
 * path segment (query and fragment dropped; a name that is empty, "." or
 * ".." or has characters outside [A-Za-z0-9._+-] is refused). Returns 0 or
 * -1 with err. */
int model_fetch_cache_path(const char *url, const char *cache_dir, char *out, size_t outlen,
                           char *err, size_t errlen);

#define MODEL_FETCH_TRANSIENT (-2)

/* Fetch o->spec into the cache (or find it there) and write the local path
 * to path_out. Blocks; returns 0, or, with err saying what failed:
 * MODEL_FETCH_TRANSIENT (-2) when a later try may succeed (too many
 * attempts without progress: the network, the server's 5xx; or stopped),
 * -1 when it will not without a change (HTTP 4xx, sha256 mismatch, a bad
 * spec, disk). should_stop (may be NULL), polled during the transfer and
 * between attempts, aborts it when it returns true (the .part file is kept
 * for a resume). A download that got no byte leaves no .part file. */
int model_fetch(const model_fetch_opts *o, bool (*should_stop)(void), char *path_out,
                size_t path_len, char *err, size_t errlen);

#endif
