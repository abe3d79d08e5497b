/*
 * ctl_http: one HTTP request from gpupoolctl to the server (libcurl), with
 * the admin key as a Bearer token and a JSON body.
 */
#ifndef CTL_HTTP_H
#define CTL_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

typedef struct ctl_conn {
    const char *server;    /* base URL, e.g. "http://127.0.0.1:8080" (no trailing slash needed) */
    const char *key;       /* admin key, NULL = send none */
    const char *ca_file;   /* NULL = system CAs */
    bool insecure;         /* skip TLS verification */
} ctl_conn;

/* method + path (with query) on c->server; body (borrowed, may be NULL) is
 * sent as JSON. Returns the HTTP status with *resp the parsed JSON body
 * (new reference; NULL when empty or not JSON), or -1 when the request did
 * not complete, with a message in err (connection refused, timeout, TLS;
 * or out of memory reading the reply). */
int ctl_http_call(const ctl_conn *c, const char *method, const char *path, const json_t *body,
                  json_t **resp, char *err, size_t errlen);

/* The size of the file at an http(s) URL (a HEAD request, redirects
 * followed, 15 s at most; the model source of `models deploy`, so that
 * the server checks the fit before the first download). The size, or -1
 * when it cannot be had (err says why). */
long long ctl_http_content_length(const char *url, const char *ca_file, char *err,
                                  size_t errlen);

#endif
