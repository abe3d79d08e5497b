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
