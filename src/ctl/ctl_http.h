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
 * not complete, with a message in err (connection refused, timeout, TLS). */
int ctl_http_call(const ctl_conn *c, const char *method, const char *path, const json_t *body,
                  json_t **resp, char *err, size_t errlen);

#endif
