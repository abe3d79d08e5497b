/* ctl_http: see ctl_http.h. */
#include "ctl/ctl_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/gp_json.h"
#include "common/gp_util.h"

/* A reply bigger than this is not something the admin API sends. */
#define MAX_REPLY (64u << 20)

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    gp_buf *b = arg;
    size_t len = size * n;
    if (b->len + len > MAX_REPLY || gp_buf_append(b, p, len) < 0)
        return 0; /* curl reports CURLE_WRITE_ERROR */
    return len;
}

int ctl_http_call(const ctl_conn *c, const char *method, const char *path, const json_t *body,
                  json_t **resp, char *err, size_t errlen)
{
    int status = -1;
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    char *url = NULL, *auth = NULL, *payload = NULL;
    char cerr[CURL_ERROR_SIZE] = "";
    gp_buf b;
    gp_buf_init(&b);
    *resp = NULL;
    if (!h) {
        snprintf(err, errlen, "cannot initialise libcurl");
        goto done;
    }
    size_t sl = strlen(c->server);
    while (sl > 0 && c->server[sl - 1] == '/')
        sl--;
    if (asprintf(&url, "%.*s%s", (int)sl, c->server, path) < 0) {
        url = NULL;
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    hdrs = curl_slist_append(hdrs, "Accept: application/json");
    if (c->key && *c->key) {
        if (asprintf(&auth, "Authorization: Bearer %s", c->key) < 0) {
            auth = NULL;
            snprintf(err, errlen, "out of memory");
            goto done;
        }
        hdrs = curl_slist_append(hdrs, auth);
    }
    if (body) {
        payload = json_dumps(body, JSON_COMPACT);
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload ? payload : "");
    } else if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "gpupoolctl");
    /* Only the server's own URL: never follow a redirect with the key. */
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    if (c->ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
    if (c->insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) {
        snprintf(err, errlen, "%s", cerr[0] ? cerr : curl_easy_strerror(rc));
        goto done;
    }
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    status = (int)code;
    if (b.len > 0) {
        /* gp_json's reader, not json_loadb: jansson 2.14's loader can
         * corrupt the heap when an allocation fails inside it. */
        json_error_t je;
        *resp = gp_json_load_checked(b.data, b.len, 0, &je);
        if (!*resp && json_error_code(&je) == json_error_out_of_memory) {
            snprintf(err, errlen, "out of memory reading the server's reply");
            status = -1;
        }
    }
done:
    if (auth) {
        explicit_bzero(auth, strlen(auth));
        free(auth);
    }
    free(url);
    free(payload);
    curl_slist_free_all(hdrs);
    if (h)
        curl_easy_cleanup(h);
    gp_buf_free(&b);
    return status;
}

long long ctl_http_content_length(const char *url, const char *ca_file, char *err,
                                  size_t errlen)
{
    CURL *h = curl_easy_init();
    long long size = -1;
    if (!h) {
        snprintf(err, errlen, "cannot initialise libcurl");
        return -1;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 15L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (ca_file && *ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, ca_file);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_off_t len = -1;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
    if (rc != CURLE_OK)
        snprintf(err, errlen, "%s", curl_easy_strerror(rc));
    else if (status != 200)
        snprintf(err, errlen, "HTTP %ld", status);
    else if (len < 0)
        snprintf(err, errlen, "no Content-Length");
    else
        size = (long long)len;
    curl_easy_cleanup(h);
    return size;
}
