/* ctl_fmt: see ctl_fmt.h. */
#include "ctl/ctl_fmt.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gp_util.h"

#define MAX_DURATION_SEC (100LL * 365 * 86400)

int64_t ctl_duration_parse(const char *s)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || v < 0)
        return -1;
    long long mult = 1;
    if (*end) {
        switch (*end) {
        case 's': mult = 1; break;
        case 'm': mult = 60; break;
        case 'h': mult = 3600; break;
        case 'd': mult = 86400; break;
        case 'w': mult = 7 * 86400; break;
        default: return -1;
        }
        if (end[1])
            return -1;
    }
    if (v > MAX_DURATION_SEC / mult)
        return -1;
    return (int64_t)(v * mult);
}

char *ctl_fmt_ago(int64_t then_ms, int64_t now_ms, char *out, size_t outlen)
{
    if (then_ms <= 0) {
        snprintf(out, outlen, "never");
        return out;
    }
    bool future = then_ms > now_ms;
    int64_t d = (future ? then_ms - now_ms : now_ms - then_ms) / 1000;
    long long n;
    char unit;
    if (d < 60) {
        n = d;
        unit = 's';
    } else if (d < 3600) {
        n = d / 60;
        unit = 'm';
    } else if (d < 86400) {
        n = d / 3600;
        unit = 'h';
    } else {
        n = d / 86400;
        unit = 'd';
    }
    if (future)
        snprintf(out, outlen, "in %lld%c", n, unit);
    else
        snprintf(out, outlen, "%lld%c ago", n, unit);
    return out;
}

char *ctl_fmt_iso(int64_t ms, char *out, size_t outlen)
{
    if (ms <= 0) {
        snprintf(out, outlen, "-");
        return out;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(out, outlen, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(out, outlen, "%lld", (long long)ms);
    return out;
}

/* ------------------------------------------------------------------ */
/* Tables                                                              */
/* ------------------------------------------------------------------ */

struct ctl_table {
    size_t ncols;
    size_t nrows;      /* including the header row */
    size_t cap;
    char **cells;      /* nrows * ncols, row-major */
};

static int add_row(ctl_table *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        char **grown = realloc(t->cells, cap * t->ncols * sizeof *grown);
        if (!grown)
            return -1;
        t->cells = grown;
        t->cap = cap;
    }
    char **row = &t->cells[t->nrows * t->ncols];
    for (size_t c = 0; c < t->ncols; c++) {
        row[c] = strdup(cells[c] ? cells[c] : "-");
        if (!row[c]) {
            while (c > 0)
                free(row[--c]);
            return -1;
        }
    }
    t->nrows++;
    return 0;
}

ctl_table *ctl_table_new(size_t ncols, const char *const *headers)
{
    if (ncols == 0)
        return NULL;
    ctl_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->ncols = ncols;
    if (add_row(t, headers) < 0) {
        ctl_table_free(t);
        return NULL;
    }
    return t;
}

int ctl_table_add(ctl_table *t, const char *const *cells)
{
    return add_row(t, cells);
}

size_t ctl_table_rows(const ctl_table *t)
{
    return t->nrows - 1;
}

/* Display width: UTF-8 continuation bytes do not count. */
static size_t width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80)
            w++;
    return w;
}

char *ctl_table_render(const ctl_table *t)
{
    size_t *w = calloc(t->ncols, sizeof *w);
    gp_buf b;
    gp_buf_init(&b);
    if (!w)
        return NULL;
    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < t->ncols; c++) {
            size_t cw = width(t->cells[r * t->ncols + c]);
            if (cw > w[c])
                w[c] = cw;
        }
    int rc = 0;
    for (size_t r = 0; r < t->nrows && rc == 0; r++) {
        for (size_t c = 0; c < t->ncols && rc == 0; c++) {
            const char *cell = t->cells[r * t->ncols + c];
            rc = gp_buf_append(&b, cell, strlen(cell));
            /* Pad all but the last column (no trailing spaces). */
            if (c + 1 < t->ncols)
                rc = rc ? rc : gp_buf_appendf(&b, "%*s", (int)(w[c] - width(cell) + 2), "");
        }
        rc = rc ? rc : gp_buf_append(&b, "\n", 1);
    }
    free(w);
    if (rc) {
        gp_buf_free(&b);
        return NULL;
    }
    return gp_buf_steal(&b);
}

void ctl_table_free(ctl_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}

/* Length of the printable UTF-8 character at p (n bytes left), 0 when it
 * is a control character or not valid UTF-8. */
static size_t printable_char(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80)
        return c < 0x20 || c == 0x7f ? 0 : 1;
    size_t len;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0)
        len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f))
        return 0;
    return len;
}

char *ctl_fmt_escape(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    char *out = malloc(n * 4 + 1); /* worst case: every byte as \xNN */
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = printable_char(p + i, n - i);
        if (l == 0) {
            snprintf(out + o, 5, "\\x%02X", p[i]);
            o += 4;
            i++;
        } else {
            memcpy(out + o, p + i, l);
            o += l;
            i += l;
        }
    }
    out[o] = '\0';
    return out;
}

int ctl_fmt_sanitize_json(json_t *v)
{
    if (json_is_string(v)) {
        char *e = ctl_fmt_escape(json_string_value(v), json_string_length(v));
        int rc = e ? json_string_set(v, e) : -1;
        free(e);
        return rc;
    }
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (ctl_fmt_sanitize_json(json_array_get(v, i)) < 0)
                return -1;
        return 0;
    }
    if (!json_is_object(v))
        return 0;
    /* Keys: rebuild the object when one needs escaping (in order). */
    json_t *copy = json_object();
    if (!copy)
        return -1;
    const char *k;
    json_t *val;
    int rc = 0;
    json_object_foreach(v, k, val)
    {
        char *ek = ctl_fmt_escape(k, strlen(k));
        if (!ek || ctl_fmt_sanitize_json(val) < 0 || json_object_set(copy, ek, val) < 0)
            rc = -1;
        free(ek);
        if (rc < 0)
            break;
    }
    if (rc == 0) {
        json_object_clear(v);
        rc = json_object_update(v, copy);
    }
    json_decref(copy);
    return rc;
}
