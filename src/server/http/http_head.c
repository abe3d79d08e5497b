/*
 * http_head.c: a request head parsed and checked, without a socket
 * (gps_http_head_parse), and the small helpers the gate and dispatch share.
 */
#include "server/http/http_priv.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/gp_util.h"

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

bool http_corr_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.:", s[i]))
            return false;
    return true;
}

const char *http_method_name(unsigned m)
{
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_PATCH: return "PATCH";
    default: return "OTHER";
    }
}

/* The methods routes of path take (HEAD with GET), for Allow. */
void http_allow_methods(gps_http *h, const char *path, char *allow, size_t cap)
{
    unsigned m = 0;
    for (size_t i = 0; i < h->nroutes; i++)
        if (http_pattern_match(h->routes[i].pattern, path, NULL, NULL))
            m |= h->routes[i].methods;
    if (m & EVHTTP_REQ_GET)
        m |= EVHTTP_REQ_HEAD;
    allow[0] = '\0';
    static const unsigned all[] = {EVHTTP_REQ_GET,    EVHTTP_REQ_HEAD,  EVHTTP_REQ_POST,
                                   EVHTTP_REQ_PUT,    EVHTTP_REQ_DELETE, EVHTTP_REQ_PATCH,
                                   EVHTTP_REQ_OPTIONS};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!(m & all[i]))
            continue;
        if (allow[0])
            strncat(allow, ", ", cap - strlen(allow) - 1);
        strncat(allow, http_method_name(all[i]), cap - strlen(allow) - 1);
    }
}

/* ------------------------------------------------------------------ */
/* Head parsing (pure)                                                 */
/* ------------------------------------------------------------------ */

static bool is_tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

bool gps_http_target_ok(const char *t)
{
    if (t[0] != '/')
        return false;
    for (const char *p = t; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return false;
    size_t plen = strcspn(t, "?#");
    /* Segment by segment: "" (from "//"), "." and ".." are refused; so is a
     * percent-encoded dot segment, which a proxy might decode. */
    const char *seg = t + 1, *end = t + plen;
    while (seg <= end) {
        const char *s = memchr(seg, '/', (size_t)(end - seg));
        size_t sl = s ? (size_t)(s - seg) : (size_t)(end - seg);
        bool last = !s;
        if (sl == 0 && !last)
            return false; /* "//" */
        char dec[8];
        size_t dl = 0;
        for (size_t i = 0; i < sl && dl < sizeof dec - 1; i++) {
            if (seg[i] == '%' && i + 2 < sl + 1 && strncasecmp(seg + i, "%2e", 3) == 0) {
                dec[dl++] = '.';
                i += 2;
            } else {
                dec[dl++] = seg[i];
            }
        }
        dec[dl] = '\0';
        if (sl <= 9 && (strcmp(dec, ".") == 0 || strcmp(dec, "..") == 0))
            return false;
        if (last)
            break;
        seg = s + 1;
    }
    return true;
}

static const struct {
    const char *name;
    unsigned m;
} methods[] = {
    {"GET", EVHTTP_REQ_GET},       {"HEAD", EVHTTP_REQ_HEAD},   {"POST", EVHTTP_REQ_POST},
    {"PUT", EVHTTP_REQ_PUT},       {"DELETE", EVHTTP_REQ_DELETE},
    {"OPTIONS", EVHTTP_REQ_OPTIONS}, {"PATCH", EVHTTP_REQ_PATCH},
};

/* Append to out->canon; false when it does not fit. */
static bool canon_add(gps_head *out, size_t cap, const char *s, size_t n)
{
    if (out->canon_len + n + 1 > cap)
        return false;
    memcpy(out->canon + out->canon_len, s, n);
    out->canon_len += n;
    out->canon[out->canon_len] = '\0';
    return true;
}

#define HEAD_FAIL(st, ...)                                                                         \
    do {                                                                                           \
        snprintf(msg, msglen, __VA_ARGS__);                                                        \
        return (st);                                                                               \
    } while (0)

/* The fields home mode and pool loops look at (issue 25): Host, Origin,
 * Content-Type, X-Pool-Via. 0, or the status to refuse with. */
static int head_site_field(gps_head *out, const char *name, size_t nl, const char *v,
                           size_t vlen, char *msg, size_t msglen)
{
#define IS(n) (nl == sizeof(n) - 1 && strncasecmp(name, n, nl) == 0)
    if (IS("Host")) {
        if (out->has_host)
            HEAD_FAIL(400, "more than one Host header");
        out->has_host = true;
        if (vlen < sizeof out->host)
            gp_copy_cut(out->host, sizeof out->host, v, vlen);
    } else if (IS("Origin")) {
        if (out->has_origin)
            HEAD_FAIL(400, "more than one Origin header");
        out->has_origin = true;
        if (vlen < sizeof out->origin)
            gp_copy_cut(out->origin, sizeof out->origin, v, vlen);
    } else if (IS("X-Pool-Via")) {
        if (out->has_via)
            HEAD_FAIL(400, "more than one X-Pool-Via header");
        out->has_via = true;
        if (vlen >= sizeof out->via)
            HEAD_FAIL(400, "X-Pool-Via longer than %zu bytes: a loop of pools?",
                      sizeof out->via - 1);
        gp_copy_cut(out->via, sizeof out->via, v, vlen);
    } else if (IS("Content-Type")) {
        /* A second one makes the type unknown ("" never matches). */
        if (!out->has_ctype && vlen < sizeof out->ctype)
            gp_copy_cut(out->ctype, sizeof out->ctype, v, vlen);
        else
            out->ctype[0] = '\0';
        out->has_ctype = true;
    }
#undef IS
    return 0;
}

/* The request line (p .. eol, eol at its LF): METHOD SP target SP
 * HTTP/1.x CRLF, copied canonical into out->canon. 0, or the HTTP status
 * to refuse with (msg says why). */
static int head_request_line(const char *p, const char *eol, gps_head *out, size_t canon_cap,
                             char *msg, size_t msglen)
{
    if (eol == p || eol[-1] != '\r')
        HEAD_FAIL(400, "malformed request line (lines end with CRLF)");
    const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp1 == p || sp2 == sp1 + 1)
        HEAD_FAIL(400, "malformed request line");
    size_t ml = (size_t)(sp1 - p);
    for (size_t i = 0; i < ml; i++)
        if (!is_tchar((unsigned char)p[i]))
            HEAD_FAIL(400, "malformed request method");
    gp_copy_cut(out->method_name, sizeof out->method_name, p, ml);
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strlen(methods[i].name) == ml && memcmp(methods[i].name, p, ml) == 0)
            out->method = methods[i].m;
    size_t tl = (size_t)(sp2 - sp1 - 1);
    const char *ver = sp2 + 1;
    size_t vl = (size_t)(eol - 1 - ver);
    if (vl != 8 || memcmp(ver, "HTTP/1.", 7) != 0 || (ver[7] != '0' && ver[7] != '1'))
        HEAD_FAIL(400, "unsupported HTTP version (HTTP/1.0 and HTTP/1.1 only)");
    out->minor = ver[7] - '0';
    if (tl >= sizeof out->target)
        HEAD_FAIL(414, "request target longer than %zu bytes", sizeof out->target - 1);
    memcpy(out->target, sp1 + 1, tl);
    out->target[tl] = '\0';
    if (!out->method)
        HEAD_FAIL(501, "method %s is not implemented", out->method_name);
    /* A NUL would end the target gps_http_target_ok reads (and routes see)
     * while the bytes after it still went to evhttp. */
    if (memchr(out->target, '\0', tl) || !gps_http_target_ok(out->target))
        HEAD_FAIL(400, "request target must be a normalised path (origin-form: no scheme or "
                       "host, no empty, '.' or '..' segment)");
    const char *vers = out->minor ? " HTTP/1.1\r\n" : " HTTP/1.0\r\n";
    if (!canon_add(out, canon_cap, out->method_name, strlen(out->method_name)) ||
        !canon_add(out, canon_cap, " ", 1) || !canon_add(out, canon_cap, out->target, tl) ||
        !canon_add(out, canon_cap, vers, strlen(vers)))
        HEAD_FAIL(431, "request head too large");
    return 0;
}

/* A header field the server reads itself (name p of nl bytes, value v of
 * vlen, trimmed); any other goes to head_site_field. *te: a
 * Transfer-Encoding was seen. 0, or the status to refuse with. */
static int head_field(gps_head *out, const char *p, size_t nl, const char *v, size_t vlen,
                      bool *te, char *msg, size_t msglen)
{
#define IS(name) (nl == sizeof(name) - 1 && strncasecmp(p, name, nl) == 0)
    if (IS("Content-Length")) {
        if (out->content_length >= 0)
            HEAD_FAIL(400, "more than one Content-Length header");
        if (vlen == 0 || vlen > 18)
            HEAD_FAIL(400, "invalid Content-Length");
        long long cl = 0;
        for (size_t i = 0; i < vlen; i++) {
            if (v[i] < '0' || v[i] > '9')
                HEAD_FAIL(400, "invalid Content-Length (digits only)");
            cl = cl * 10 + (v[i] - '0');
        }
        out->content_length = cl;
    } else if (IS("Transfer-Encoding")) {
        if (*te)
            HEAD_FAIL(400, "more than one Transfer-Encoding header");
        *te = true;
        if (vlen != 7 || strncasecmp(v, "chunked", 7) != 0)
            HEAD_FAIL(400, "unsupported Transfer-Encoding (only chunked)");
        out->chunked = true;
    } else if (IS("Authorization")) {
        if (out->has_auth)
            HEAD_FAIL(400, "more than one Authorization header");
        out->has_auth = true;
        gp_copy_cut(out->auth, sizeof out->auth, v, vlen);
    } else if (IS("x-api-key")) {
        if (out->has_api_key)
            HEAD_FAIL(400, "more than one x-api-key header");
        out->has_api_key = true;
        gp_copy_cut(out->api_key, sizeof out->api_key, v, vlen);
    } else if (IS("X-Forwarded-For")) {
        gp_copy_cut(out->xff, sizeof out->xff, v, vlen);
    } else if (IS("X-Correlation-Id")) {
        if (vlen < sizeof out->corr)
            gp_copy_cut(out->corr, sizeof out->corr, v, vlen);
    } else {
        return head_site_field(out, p, nl, v, vlen, msg, msglen);
    }
#undef IS
    return 0;
}

/* One header line (p .. eol, eol at its LF): checked, read (head_field)
 * and copied canonical. 0, or the status to refuse with. */
static int head_line(const char *p, const char *eol, gps_head *out, size_t canon_cap, bool *te,
                     char *msg, size_t msglen)
{
    if (eol == p || eol[-1] != '\r')
        HEAD_FAIL(400, "malformed header line (lines end with CRLF)");
    const char *le = eol - 1; /* the CR */
    if (*p == ' ' || *p == '\t')
        HEAD_FAIL(400, "obsolete header line folding is not accepted");
    const char *colon = memchr(p, ':', (size_t)(le - p));
    if (!colon || colon == p)
        HEAD_FAIL(400, "malformed header line");
    for (const char *q = p; q < colon; q++)
        if (!is_tchar((unsigned char)*q))
            HEAD_FAIL(400, "malformed header name");
    const char *v = colon + 1, *ve = le;
    while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
    for (const char *q = v; q < ve; q++)
        if (((unsigned char)*q < 0x20 && *q != '\t') || *q == 0x7f)
            HEAD_FAIL(400, "control character in a header value");
    size_t nl = (size_t)(colon - p), vlen = (size_t)(ve - v);
    int st = head_field(out, p, nl, v, vlen, te, msg, msglen);
    if (st)
        return st;
    if (!canon_add(out, canon_cap, p, nl) || !canon_add(out, canon_cap, ": ", 2) ||
        !canon_add(out, canon_cap, v, vlen) || !canon_add(out, canon_cap, "\r\n", 2))
        HEAD_FAIL(431, "request head too large");
    return 0;
}

int gps_http_head_parse(const char *head, size_t len, gps_head *out, char *canon,
                        size_t canon_cap, char *msg, size_t msglen)
{
    memset(out, 0, sizeof *out);
    out->canon = canon;
    if (canon_cap)
        canon[0] = '\0';
    out->content_length = -1;
    const char *p = head, *end = head + len;
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol)
        HEAD_FAIL(400, "malformed request line (lines end with CRLF)");
    int st = head_request_line(p, eol, out, canon_cap, msg, msglen);
    if (st)
        return st;
    bool te = false;
    for (p = eol + 1; p < end; p = eol + 1) {
        eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            HEAD_FAIL(400, "malformed header line (lines end with CRLF)");
        if ((st = head_line(p, eol, out, canon_cap, &te, msg, msglen)) != 0)
            return st;
    }
    if (out->chunked && out->content_length >= 0)
        HEAD_FAIL(400, "both Content-Length and Transfer-Encoding");
    /* evhttp never reads a body after HEAD: one sent anyway would be taken
     * for the next request. A GET body means nothing to any route, and
     * would only be bytes a peer makes the server hold (issue 25). */
    if (out->method == EVHTTP_REQ_HEAD && (out->chunked || out->content_length > 0))
        HEAD_FAIL(400, "a HEAD request has no body");
    if (out->method == EVHTTP_REQ_GET && (out->chunked || out->content_length > 0))
        HEAD_FAIL(400, "a GET request has no body");
    if (!canon_add(out, canon_cap, "\r\n", 2))
        HEAD_FAIL(431, "request head too large");
    return 0;
}
#undef HEAD_FAIL
