/*
 * http_admit.c: the gate's decision on a complete head: the route, the
 * credentials, home mode, pool loops, the client's address behind trusted
 * proxies, and the body a request may send.
 */
#include "server/http/http_priv.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include "common/gp_util.h"

/* ip (trimmed span [p, e)) is one of h's trusted proxies (exact match). */
static bool proxy_trusted(const gps_http *h, const char *p, const char *e)
{
    const char *l = h->opts.trusted_proxies;
    while (p < e && (*p == ' ' || *p == '\t'))
        p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    size_t n = (size_t)(e - p);
    while (l && *l && n) {
        l += strspn(l, " ,\t");
        size_t k = strcspn(l, " ,\t");
        if (k == n && strncmp(l, p, n) == 0)
            return true;
        l += k;
    }
    return false;
}

/* The client address for logs (gps_auth_fn): peer, or behind trusted
 * proxies the rightmost X-Forwarded-For entry that is not one of them
 * (entries left of it are the client's say, so not believed); when every
 * entry is a trusted proxy, the leftmost. */
void http_client_addr(const gps_http *h, const char *peer, const char *xff, char *out,
                      size_t outlen)
{
    gp_copy_str(out, outlen, peer && *peer ? peer : "?");
    if (!peer || !xff || !*xff || !proxy_trusted(h, peer, peer + strlen(peer)))
        return;
    const char *end = xff + strlen(xff);
    while (end > xff) {
        const char *start = end;
        while (start > xff && start[-1] != ',')
            start--;
        const char *s = start, *e = end;
        while (s < e && (*s == ' ' || *s == '\t'))
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (e > s) {
            gp_copy_cut(out, outlen, s, (size_t)(e - s));
            if (!proxy_trusted(h, s, e))
                return;
        }
        end = start > xff ? start - 1 : xff;
    }
}

/* The numeric address of the connection's peer ("" when unknown): from
 * the address conn_attach took (peer_from_evhttp), not a getpeername. */
static void peer_text(const gps_conn *c, char *out, size_t outlen)
{
    out[0] = '\0';
    if (!c->has_peer)
        return;
    if (c->peer_v4)
        inet_ntop(AF_INET, c->peer + 12, out, (socklen_t)outlen);
    else
        inet_ntop(AF_INET6, c->peer, out, (socklen_t)outlen);
}

static const char *blank_to_null(const char *s, bool present)
{
    return present && s[0] ? s : NULL;
}

/* The largest body the current request may have. */
size_t http_body_cap(const gps_conn *c)
{
    size_t unauth = http_unauth_cap(c->h);
    size_t max = c->h->opts.max_body_bytes;
    return c->unauth && unauth < max ? unauth : max;
}

/* Host is a loopback name or address, with or without a port. */
static bool host_is_loopback(const char *host)
{
    char name[256];
    snprintf(name, sizeof name, "%s", host);
    if (name[0] == '[') {
        char *e = strchr(name, ']');
        if (!e || (e[1] && (e[1] != ':' || !e[2] || strspn(e + 2, "0123456789") != strlen(e + 2))))
            return false;
        *e = '\0';
        return strcmp(name + 1, "::1") == 0;
    }
    char *colon = strchr(name, ':');
    if (colon) {
        if (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))
            return false;
        *colon = '\0';
    }
    if (strcasecmp(name, "localhost") == 0 || strcasecmp(name, "localhost.") == 0)
        return true;
    struct in_addr a;
    return inet_pton(AF_INET, name, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* Home mode (auth off): refuse what a web page elsewhere could make a
 * browser send (issue 25, finding 2). Returns true when refused. */
static bool home_refuse(gps_conn *c, const gps_head *hd, gps_dialect d)
{
    gps_http *h = c->h;
    if (!h->home || !h->home(h->home_arg))
        return false;
    c->no_retry = true;
    /* A browser always sends Host; a rebound DNS name arrives as its own. */
    if (hd->has_host && !host_is_loopback(hd->host)) {
        http_refuse(c, 403, "HOST_NOT_ALLOWED", d,
                    "with auth off this server answers only requests addressed to a loopback name "
                    "(Host: localhost, 127.0.0.1 or [::1]), not '%.100s'; create a key to serve "
                    "other names",
                    hd->host);
        return true;
    }
    if (hd->has_origin) {
        char http_o[300], https_o[300];
        snprintf(http_o, sizeof http_o, "http://%s", hd->host);
        snprintf(https_o, sizeof https_o, "https://%s", hd->host);
        if (!hd->has_host || !hd->origin[0] ||
            (strcasecmp(hd->origin, http_o) != 0 && strcasecmp(hd->origin, https_o) != 0)) {
            http_refuse(c, 403, "ORIGIN_NOT_ALLOWED", d,
                        "cross-origin request refused: with auth off only pages of this server "
                        "(Origin %.100s) may call it, not '%.100s'",
                        http_o, hd->origin);
            return true;
        }
    }
    bool body = hd->chunked || hd->content_length > 0;
    if (body) {
        size_t tl = strcspn(hd->ctype, "; \t");
        if (tl != 16 || strncasecmp(hd->ctype, "application/json", 16) != 0) {
            http_refuse(c, 415, "UNSUPPORTED_MEDIA_TYPE", d,
                        "request bodies must be sent as Content-Type: application/json%s%.100s%s",
                        hd->has_ctype ? " (not '" : "", hd->ctype, hd->has_ctype ? "')" : "");
            return true;
        }
    }
    return false;
}

/* X-Pool-Via: ids separated by commas (and blanks). Returns true when
 * refused: this pool is in it, or it holds GPS_POOL_MAX_HOPS ids already
 * (this pool would add one more). */
static bool pool_loop_refuse(gps_conn *c, const gps_head *hd, gps_dialect d)
{
    if (!hd->has_via)
        return false;
    int hops = 0;
    bool self = false;
    for (const char *p = hd->via; *p;) {
        p += strspn(p, ", \t");
        size_t n = strcspn(p, ", \t");
        if (n == 0)
            break;
        hops++;
        if (n == strlen(c->h->pool_id) && strncmp(p, c->h->pool_id, n) == 0)
            self = true;
        p += n;
    }
    /* This pool's id must fit behind the chain it passes on. */
    bool fits = strlen(hd->via) + 2 + strlen(c->h->pool_id) < GPS_POOL_VIA_MAX;
    if (!self && hops < GPS_POOL_MAX_HOPS && fits)
        return false;
    c->no_retry = true;
    if (self)
        http_refuse(c, 508, "POOL_LOOP", d,
                    "pool loop: this request already passed through this pool "
                    "(X-Pool-Via: %.100s); an agent's upstream leads back into a pool the "
                    "request came through",
                    hd->via);
    else
        http_refuse(c, 508, "POOL_LOOP", d,
                    "this request passed through %d pools (X-Pool-Via: %.100s), the most a request "
                    "may: a loop of pools?",
                    hops, hd->via);
    return true;
}

/* The decision on a complete head. Returns true when accepted. */
bool http_decide(gps_conn *c, const gps_head *hd)
{
    gps_http *h = c->h;
    const char *q = strchr(hd->target, '?');
    char path[sizeof hd->target];
    gp_copy_cut(path, sizeof path, hd->target, q ? (size_t)(q - hd->target) : strlen(hd->target));
    gps_dialect pd = gps_dialect_for_path(path);
    bool body = hd->chunked || hd->content_length > 0;
    const gps_route *route = NULL;
    unsigned m = hd->method == EVHTTP_REQ_HEAD ? EVHTTP_REQ_GET : hd->method;
    int rc = gps_route_lookup(h->routes, h->nroutes, hd->method, path, &route, NULL, NULL);
    if (rc != 0 && hd->method == EVHTTP_REQ_HEAD)
        rc = gps_route_lookup(h->routes, h->nroutes, m, path, &route, NULL, NULL);
    /* HEAD is answered as GET would be, down to the (unsent) message, so
     * that Content-Length is the same. */
    const char *mn = hd->method == EVHTTP_REQ_HEAD ? "GET" : hd->method_name;
    if (rc == 404) {
        http_refuse(c, 404, "NOT_FOUND", pd, "no route for %s %.120s", mn, path);
        return false;
    }
    if (rc == 405) {
        http_refuse(c, 405, "METHOD_NOT_ALLOWED", route->dialect,
                    "method %s is not allowed on %.120s", mn, path);
        http_allow_methods(h, path, c->allow, sizeof c->allow);
        return false;
    }
    c->dialect = route->dialect;
    if (home_refuse(c, hd, route->dialect))
        return false;
    if (route->role != GPS_ROLE_NONE && h->auth) {
        const char *cred = blank_to_null(hd->auth, hd->has_auth);
        if (!cred && route->dialect == GPS_DIALECT_ANTHROPIC)
            cred = blank_to_null(hd->api_key, hd->has_api_key);
        char peer[INET6_ADDRSTRLEN], client[256];
        peer_text(c, peer, sizeof peer);
        http_client_addr(h, peer, hd->xff, client, sizeof client);
        int st = h->auth(h->auth_arg, cred, route->role, c->key_id, client);
        if (st != 0) {
            c->no_retry = true;
            if (st == 403) {
                http_refuse(c, 403, "FORBIDDEN", route->dialect,
                            "this key's role may not use this endpoint");
            } else {
                c->www_auth = route->dialect != GPS_DIALECT_NATIVE;
                if (cred)
                    http_refuse(c, 401, "INVALID_API_KEY", route->dialect, "invalid API key");
                else
                    http_refuse(c, 401, "UNAUTHORIZED", route->dialect,
                                "missing API key (Authorization: Bearer <key>%s)",
                                route->dialect == GPS_DIALECT_ANTHROPIC ? " or x-api-key" : "");
            }
            return false;
        }
        c->authed = true;
    }
    if (pool_loop_refuse(c, hd, route->dialect))
        return false;
    c->unauth = route->role == GPS_ROLE_NONE;
    size_t cap = http_body_cap(c);
    if (hd->content_length > 0 && (uint64_t)hd->content_length > cap) {
        http_refuse(c, 413, "BODY_TOO_LARGE", route->dialect, "request body exceeds %zu bytes%s",
                    cap, c->unauth ? " (a request without credentials)" : "");
        return false;
    }
    /* Nothing is reserved on the declared length (bytes are charged as
     * they arrive), but a body that could not fit now is refused at once. */
    if (hd->content_length > 0 && !http_inflight_fits(c, (uint64_t)hd->content_length)) {
        c->retry_after = true;
        http_refuse(c, 503, "SERVER_BUSY", route->dialect,
                    "too many request bodies are being received; retry shortly");
        return false;
    }
    (void)body;
    return true;
}
