/*
 * model_fetch.c: download a model into the agent's cache (model_fetch.h).
 *
 * One blocking libcurl easy transfer per attempt, before the agent's loop
 * starts: nothing else runs yet, and an agent must not register a model it
 * does not have. The sha256 is computed while the bytes arrive (the part
 * already on disk is hashed first when a download resumes), so a verified
 * multi-GB file is read once.
 */
#include "agent/model_fetch.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent_facts.h"
#include "common/gp_log.h"
#include "common/gp_util.h"

#define FETCH_URL_MAX 4096
#define BACKOFF_MAX_MS 30000

bool model_fetch_is_remote(const char *spec)
{
    return spec && (strncmp(spec, "http://", 7) == 0 || strncmp(spec, "https://", 8) == 0 ||
                    strncmp(spec, "hf:", 3) == 0);
}

/* A path segment of an hf: spec: no empty, "." or ".." segment, nothing
 * that would change the URL's meaning (query, fragment, percent escapes,
 * spaces, controls). */
static bool hf_segment_ok(const char *s, size_t n)
{
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c >= 0x7f || c == '?' || c == '#' || c == '%' || c == '\\' || c == '@')
            return false;
    }
    return true;
}

int model_fetch_url(const char *spec, const char *hf_endpoint, char *out, size_t outlen,
                    char *err, size_t errlen)
{
    if (strncmp(spec, "hf:", 3) != 0) {
        if (snprintf(out, outlen, "%s", spec) >= (int)outlen) {
            snprintf(err, errlen, "model: URL longer than %zu bytes", outlen - 1);
            return -1;
        }
        return 0;
    }
    /* hf:OWNER/REPO/PATH[@REV]: the revision is what follows the last '@'.
     * hf:OWNER/REPO:PATH (the form issue 27 and other tools write) is the
     * same: a repository name has no ':', so the first one after OWNER/
     * and before any other '/' ends REPO. */
    char norm[4096];
    if (snprintf(norm, sizeof norm, "%s", spec + 3) >= (int)sizeof norm) {
        snprintf(err, errlen, "model: URL longer than %zu bytes", sizeof norm - 1);
        return -1;
    }
    char *slash = strchr(norm, '/');
    char *colon = slash ? strchr(slash + 1, ':') : NULL;
    char *slash2 = slash ? strchr(slash + 1, '/') : NULL;
    if (colon && (!slash2 || colon < slash2))
        *colon = '/';
    const char *p = norm;
    const char *at = strrchr(p, '@');
    size_t plen = at ? (size_t)(at - p) : strlen(p);
    const char *rev = at ? at + 1 : "main";
    const char *s1 = memchr(p, '/', plen);
    const char *s2 = s1 ? memchr(s1 + 1, '/', plen - (size_t)(s1 + 1 - p)) : NULL;
    bool ok = s1 && s2 && s2 + 1 < p + plen && hf_segment_ok(p, (size_t)(s1 - p)) &&
              hf_segment_ok(s1 + 1, (size_t)(s2 - s1 - 1)) && hf_segment_ok(rev, strlen(rev)) &&
              !strchr(rev, '/');
    for (const char *q = s2 ? s2 + 1 : NULL; ok && q < p + plen;) {
        const char *e = memchr(q, '/', (size_t)(p + plen - q));
        size_t n = e ? (size_t)(e - q) : (size_t)(p + plen - q);
        ok = hf_segment_ok(q, n);
        q += n + 1;
    }
    if (!ok) {
        snprintf(err, errlen, "model: '%s' is not hf:OWNER/REPO/PATH/FILE.gguf[@REVISION]",
                 spec);
        return -1;
    }
    size_t el = strlen(hf_endpoint);
    while (el > 0 && hf_endpoint[el - 1] == '/')
        el--;
    int w = snprintf(out, outlen, "%.*s/%.*s/resolve/%s/%.*s", (int)el, hf_endpoint,
                     (int)(s2 - p), p, rev, (int)(p + plen - s2 - 1), s2 + 1);
    if (w < 0 || (size_t)w >= outlen) {
        snprintf(err, errlen, "model: URL longer than %zu bytes", outlen - 1);
        return -1;
    }
    return 0;
}

int model_fetch_cache_path(const char *url, const char *cache_dir, char *out, size_t outlen,
                           char *err, size_t errlen)
{
    size_t n = strcspn(url, "?#");
    const char *name = url + n;
    while (name > url && name[-1] != '/')
        name--;
    size_t nl = (size_t)(url + n - name);
    bool ok = nl > 0 && nl <= 200 && !(nl == 1 && name[0] == '.') &&
              !(nl == 2 && name[0] == '.' && name[1] == '.');
    for (size_t i = 0; ok && i < nl; i++) {
        char c = name[i];
        ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '+' || c == '-';
    }
    if (!ok) {
        snprintf(err, errlen, "model: cannot take a file name from '%s' (its last path "
                              "segment must be a plain file name such as model.gguf)", url);
        return -1;
    }
    char h[65];
    gp_sha256_hex(url, strlen(url), h);
    int w = snprintf(out, outlen, "%s/%.16s/%.*s", cache_dir, h, (int)nl, name);
    if (w < 0 || (size_t)w >= outlen) {
        snprintf(err, errlen, "model-cache: path too long");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */

typedef struct fetch {
    const model_fetch_opts *o;
    bool (*should_stop)(void);
    int fd;                /* the .part file */
    EVP_MD_CTX *md;        /* sha256 of every byte in the .part file so far */
    long long have;        /* bytes in the .part file */
    long long total;       /* expected size, -1 unknown */
    long status;           /* HTTP status of this attempt */
    bool body_ok;          /* status checked: this attempt's body is the file */
    bool restart;          /* a 200 to a range request: the file starts over */
    bool write_failed;
    int write_errno;
    bool too_big;          /* over max_bytes: refused, the .part goes */
    char location[256];    /* Location of the last response ("" none) */
    uint64_t last_report_ms;
    int last_decile;
    long long attempt_start; /* have at the start of this attempt */
    uint64_t attempt_t0;
} fetch;

static int md_reset(fetch *f)
{
    return EVP_DigestInit_ex(f->md, EVP_sha256(), NULL) == 1 ? 0 : -1;
}

/* Hash the first `have` bytes already in the .part file (a resume). */
static int hash_existing(fetch *f)
{
    unsigned char *buf = malloc(1u << 20);
    if (!buf)
        return -1;
    long long left = f->have;
    off_t off = 0;
    while (left > 0) {
        ssize_t r = pread(f->fd, buf, left < (1 << 20) ? (size_t)left : (1u << 20), off);
        if (r <= 0) {
            free(buf);
            return -1;
        }
        EVP_DigestUpdate(f->md, buf, (size_t)r);
        off += r;
        left -= r;
    }
    free(buf);
    return 0;
}

static void human(double bytes, char *out, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
}

/* A bar on a terminal (redrawn at most 10 times a second), else a log line
 * every 10 % (or every 30 s when the size is unknown). */
static void report(fetch *f, bool final)
{
    uint64_t now = gp_now_mono_ms();
    double secs = (double)(now - f->attempt_t0) / 1000.0;
    double rate = secs > 0 ? (double)(f->have - f->attempt_start) / secs : 0;
    char got[32], tot[32], rt[32];
    human((double)f->have, got, sizeof got);
    human(f->total > 0 ? (double)f->total : 0, tot, sizeof tot);
    human(rate, rt, sizeof rt);
    if (f->o->on_progress)
        f->o->on_progress(f->o->progress_ud, f->have, f->total, rate);
    if (f->o->progress_bar) {
        if (!final && now - f->last_report_ms < 100)
            return;
        f->last_report_ms = now;
        if (f->total > 0) {
            int pct = (int)(f->have * 100 / f->total);
            int fill = pct * 30 / 100;
            long eta = rate > 0 ? (long)((double)(f->total - f->have) / rate) : -1;
            fprintf(stderr, "\r[%.*s%.*s] %3d%% %s / %s  %s/s  ETA %lds ", fill,
                    "##############################", 30 - fill,
                    "..............................", pct, got, tot, rt, eta < 0 ? 0 : eta);
        } else {
            fprintf(stderr, "\r%s  %s/s ", got, rt);
        }
        if (final)
            fputc('\n', stderr);
        return;
    }
    if (f->total > 0) {
        int decile = (int)(f->have * 10 / f->total);
        if (!final && decile == f->last_decile)
            return;
        f->last_decile = decile;
        gp_log_info("model_download_progress", "%d%% (%s of %s, %s/s)",
                    (int)(f->have * 100 / f->total), got, tot, rt);
    } else if (final || now - f->last_report_ms >= 30000) {
        f->last_report_ms = now;
        gp_log_info("model_download_progress", "%s (%s/s)", got, rt);
    }
}

static size_t on_header(char *buf, size_t size, size_t n, void *ud)
{
    fetch *f = ud;
    size_t len = size * n;
    /* The status line of each response (redirects included): the last one
     * is the file's. */
    if (len > 5 && strncmp(buf, "HTTP/", 5) == 0) {
        const char *sp = memchr(buf, ' ', len);
        f->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        f->body_ok = false;
        f->location[0] = '\0';
    } else if (len > 9 && strncasecmp(buf, "location:", 9) == 0) {
        size_t s = 9;
        while (s < len && (buf[s] == ' ' || buf[s] == '\t'))
            s++;
        size_t e = len;
        while (e > s && (buf[e - 1] == '\r' || buf[e - 1] == '\n' || buf[e - 1] == ' '))
            e--;
        snprintf(f->location, sizeof f->location, "%.*s", (int)(e - s), buf + s);
    }
    return len;
}

static long long max_bytes(const fetch *f)
{
    return f->o->max_bytes > 0 ? f->o->max_bytes : MODEL_FETCH_DEFAULT_MAX_BYTES;
}

/* Decide, at the first byte of the final response's body, what it is. */
static bool start_body(fetch *f, CURL *easy)
{
    if (f->status == 206) {
        curl_off_t cl = -1;
        curl_easy_getinfo(easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
        f->total = cl >= 0 ? f->have + (long long)cl : -1;
    } else if (f->status == 200) {
        /* A full body: either a fresh download or a server that ignores
         * ranges; either way the file starts over. */
        if (f->have > 0) {
            gp_log_info("model_download_restart", "the server ignored the range request: "
                        "downloading from the start");
            f->restart = true;
            if (ftruncate(f->fd, 0) < 0 || md_reset(f) < 0)
                return false;
            f->have = 0;
            f->attempt_start = 0;
        }
        curl_off_t cl = -1;
        curl_easy_getinfo(easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
        f->total = cl >= 0 ? (long long)cl : -1;
    } else {
        return false;
    }
    if (f->total > max_bytes(f)) {
        f->too_big = true;
        return false;
    }
    f->body_ok = true;
    return true;
}

typedef struct write_ctx {
    fetch *f;
    CURL *easy;
} write_ctx;

static size_t on_body(char *buf, size_t size, size_t n, void *ud)
{
    write_ctx *w = ud;
    fetch *f = w->f;
    size_t len = size * n;
    if (f->status != 200 && f->status != 206)
        return len; /* an error page: read and drop it (the status says it all) */
    if (!f->body_ok && !start_body(f, w->easy)) {
        f->write_failed = !f->too_big;
        f->write_errno = errno;
        return 0;
    }
    if (f->have + (long long)len > max_bytes(f)) {
        f->too_big = true; /* an endless body, or a Content-Length that lied */
        return 0;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t r = pwrite(f->fd, buf + done, len - done, (off_t)f->have + (off_t)done);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            f->write_failed = true;
            f->write_errno = errno;
            return 0;
        }
        done += (size_t)r;
    }
    EVP_DigestUpdate(f->md, buf, len);
    f->have += (long long)len;
    report(f, false);
    return len;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    fetch *f = ud;
    return f->should_stop && f->should_stop() ? 1 : 0;
}

typedef enum { ATTEMPT_DONE, ATTEMPT_RETRY, ATTEMPT_FATAL } attempt_rc;

static attempt_rc attempt(fetch *f, const char *url, char *err, size_t errlen)
{
    attempt_rc rc = ATTEMPT_FATAL;
    CURL *easy = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    char range[64], auth[4200];
    write_ctx w = {f, easy};
    if (!easy) {
        snprintf(err, errlen, "cannot create a libcurl handle");
        return ATTEMPT_FATAL;
    }
    f->status = 0;
    f->body_ok = false;
    f->restart = false;
    f->attempt_start = f->have;
    f->attempt_t0 = gp_now_mono_ms();
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L); /* hf resolve URLs redirect to a CDN */
    curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    /* Never from https down to http (a redirect could hand the download
     * to anyone on the path). */
    curl_easy_setopt(easy, CURLOPT_REDIR_PROTOCOLS_STR,
                     strncmp(url, "https://", 8) == 0 ? "https" : "http,https");
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT, 30L);
    /* No overall timeout (models are GBs): a stalled transfer is one that
     * moves under 1 KiB/s for 60 s. */
    curl_easy_setopt(easy, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(easy, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, f);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &w);
    curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(easy, CURLOPT_XFERINFODATA, f);
    curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "gpupool-agent/" AGENT_VERSION);
    if (f->o->ca_file)
        curl_easy_setopt(easy, CURLOPT_CAINFO, f->o->ca_file);
    if (f->have > 0) {
        snprintf(range, sizeof range, "%lld-", f->have);
        curl_easy_setopt(easy, CURLOPT_RANGE, range);
    }
    if (f->o->token && *f->o->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", f->o->token);
        hdrs = curl_slist_append(hdrs, auth);
        curl_easy_setopt(easy, CURLOPT_HTTPHEADER, hdrs);
        /* The token is for the host named in the URL, not for wherever it
         * redirects (libcurl's default: custom headers are not sent on to
         * another host unless CURLOPT_UNRESTRICTED_AUTH). */
    }
    CURLcode cc = curl_easy_perform(easy);
    if (f->body_ok || f->have > f->attempt_start)
        report(f, true);
    if (f->should_stop && f->should_stop()) {
        snprintf(err, errlen, "stopped; %lld bytes kept for a resume", f->have);
        goto done;
    }
    if (f->too_big) {
        snprintf(err, errlen, "%s is larger than %lld bytes (model-max-bytes): refused", url,
                 max_bytes(f));
        goto done;
    }
    if (f->write_failed) {
        snprintf(err, errlen, "cannot write the model file: %s", strerror(f->write_errno));
        goto done;
    }
    if (f->status == 416 && f->have > 0) {
        /* The range starts at or past the end: the .part file is as long
         * as the file, or longer (the file changed). Start over; the sha256
         * check (when given) decides on the result. */
        gp_log_info("model_download_restart", "range not satisfiable at %lld: starting over",
                    f->have);
        if (ftruncate(f->fd, 0) < 0 || md_reset(f) < 0) {
            snprintf(err, errlen, "cannot truncate the partial file: %s", strerror(errno));
            goto done;
        }
        f->have = 0;
        rc = ATTEMPT_RETRY;
        goto done;
    }
    if (f->status >= 300 && f->status < 400 && strncmp(url, "https://", 8) == 0 &&
        strncasecmp(f->location, "http://", 7) == 0) {
        /* libcurl did not follow it (REDIR_PROTOCOLS): say why. */
        snprintf(err, errlen, "%s redirected to %.200s: refused (from https only to https)", url,
                 f->location);
        goto done;
    }
    if (f->status != 0 && f->status != 200 && f->status != 206) {
        snprintf(err, errlen, "%s answered HTTP %ld", url, f->status);
        /* Server-side trouble and rate limits may pass; anything else (404,
         * 401, 403) will not. */
        rc = f->status >= 500 || f->status == 429 || f->status == 408 ? ATTEMPT_RETRY
                                                                       : ATTEMPT_FATAL;
        goto done;
    }
    if (cc == CURLE_UNSUPPORTED_PROTOCOL) {
        snprintf(err, errlen, "%s redirected to a protocol that is refused (from https only to "
                 "https): %s", url, curl_easy_strerror(cc));
        goto done;
    }
    if (cc != CURLE_OK) {
        snprintf(err, errlen, "download interrupted at %lld bytes: %s", f->have,
                 curl_easy_strerror(cc));
        rc = ATTEMPT_RETRY;
        goto done;
    }
    if (f->total >= 0 && f->have != f->total) {
        snprintf(err, errlen, "download ended at %lld of %lld bytes", f->have, f->total);
        rc = ATTEMPT_RETRY;
        goto done;
    }
    rc = ATTEMPT_DONE;
done:
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(easy);
    return rc;
}

static void md_hex(EVP_MD_CTX *md, char out[65])
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    out[0] = '\0';
    if (EVP_DigestFinal_ex(md, d, &dl) != 1 || dl != 32)
        return;
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* A file already in the cache: usable as it is unless a given sha256
 * disagrees (then it is removed and downloaded again). */
static bool cached_ok(const model_fetch_opts *o, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return false;
    if (!o->sha256) {
        gp_log_info("model_cached", "%s (no --model-sha256 given: not verified)", path);
        return true;
    }
    char got[65], e[256];
    bool from_cache = false;
    if (agent_model_digest(path, o->state_dir, got, &from_cache, e, sizeof e) == 0 &&
        strcmp(got, o->sha256) == 0) {
        gp_log_info("model_cached", "%s (sha256 verified)", path);
        return true;
    }
    gp_log_warn("model_cache_mismatch", "%s does not have sha256 %s: downloading it again",
                path, o->sha256);
    unlink(path);
    return false;
}

int model_fetch(const model_fetch_opts *o, bool (*should_stop)(void), char *path_out,
                size_t path_len, char *err, size_t errlen)
{
    int rc = -1;
    char url[FETCH_URL_MAX], part[4096 + 8], dir[4096];
    fetch f = {.o = o, .should_stop = should_stop, .fd = -1, .total = -1, .last_decile = -1};
    if (o->sha256 && !gp_hex64_ok(o->sha256)) {
        snprintf(err, errlen, "model-sha256: must be 64 lower-case hex digits");
        return -1;
    }
    if (model_fetch_url(o->spec, o->hf_endpoint, url, sizeof url, err, errlen) < 0 ||
        model_fetch_cache_path(url, o->cache_dir, path_out, path_len, err, errlen) < 0)
        return -1;
    if (cached_ok(o, path_out))
        return 0;
    snprintf(dir, sizeof dir, "%s", path_out);
    *strrchr(dir, '/') = '\0';
    if (gp_mkdirs(dir, 0750) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    snprintf(part, sizeof part, "%s.part", path_out);
    f.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    f.md = EVP_MD_CTX_new();
    if (f.fd < 0 || !f.md || md_reset(&f) < 0) {
        snprintf(err, errlen, "cannot open %s: %s", part, strerror(errno));
        goto done;
    }
    struct stat st;
    if (fstat(f.fd, &st) == 0 && st.st_size > 0) {
        f.have = (long long)st.st_size;
        if (hash_existing(&f) < 0) {
            snprintf(err, errlen, "cannot read %s: %s", part, strerror(errno));
            goto done;
        }
        gp_log_info("model_download_resume", "%s: resuming at %lld bytes", url, f.have);
    } else {
        gp_log_info("model_download", "%s -> %s", url, path_out);
    }
    int failures = 0; /* attempts in a row that added no byte */
    uint64_t backoff = 1000;
    for (;;) {
        long long before = f.have;
        attempt_rc ar = attempt(&f, url, err, errlen);
        if (ar == ATTEMPT_DONE)
            break;
        if (ar == ATTEMPT_FATAL) {
            if (f.too_big)
                unlink(part); /* nothing of it will ever be used */
            goto done;
        }
        if (f.have > before || f.restart) {
            failures = 0;
            backoff = 1000;
        }
        if (++failures >= o->max_attempts) {
            size_t l = strlen(err);
            snprintf(err + l, errlen - l, " (%d attempts in a row without progress; %lld "
                     "bytes kept in %s for the next start)", failures, f.have, part);
            rc = MODEL_FETCH_TRANSIENT;
            goto done;
        }
        gp_log_warn("model_download_retry", "%s; retrying in %.1f s", err,
                    (double)backoff / 1000.0);
        /* Sleep in small steps so that a stop request is seen. */
        for (uint64_t slept = 0; slept < backoff; slept += 100) {
            if (should_stop && should_stop()) {
                snprintf(err, errlen, "stopped; %lld bytes kept for a resume", f.have);
                rc = MODEL_FETCH_TRANSIENT;
                goto done;
            }
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
        }
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    }
    char got[65];
    md_hex(f.md, got);
    if (o->sha256 && strcmp(got, o->sha256) != 0) {
        snprintf(err, errlen, "sha256 mismatch for %s: expected %s, got %s (the file was "
                 "removed)", url, o->sha256, got);
        unlink(part);
        goto done;
    }
    if (fsync(f.fd) < 0 || rename(part, path_out) < 0) {
        snprintf(err, errlen, "cannot move %s into place: %s", part, strerror(errno));
        goto done;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* the rename itself survives a crash */
        close(dfd);
    }
    agent_model_digest_remember(path_out, o->state_dir, got);
    gp_log_info("model_downloaded", "%s: %lld bytes, sha256 %s%s", path_out, f.have, got,
                o->sha256 ? " (verified)" : "");
    rc = 0;
done:
    if (f.fd >= 0)
        close(f.fd);
    /* Nothing arrived (a 404, a refused token): leave no empty .part. */
    if (rc != 0 && f.fd >= 0 && f.have == 0)
        unlink(part);
    EVP_MD_CTX_free(f.md);
    return rc;
}
