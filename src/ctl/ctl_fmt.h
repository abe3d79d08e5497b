/*
 * ctl_fmt: the pure pieces of gpupoolctl: duration parsing, time formatting
 * and aligned text tables. No I/O (render returns a string), so unit tests
 * cover them directly.
 */
#ifndef CTL_FMT_H
#define CTL_FMT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* "30d", "12h", "15m", "3600s" or a bare number of seconds -> seconds.
 * -1 when malformed, negative, or above 100 years. */
int64_t ctl_duration_parse(const char *s);

/* "never" for 0, else "5s ago", "3m ago", "2h ago", "4d ago" (or "in 3m"
 * for a time after now). Returns out. */
char *ctl_fmt_ago(int64_t then_ms, int64_t now_ms, char *out, size_t outlen);
/* "2026-11-23T00:52:16Z" (UTC), "-" for 0. Returns out. */
char *ctl_fmt_iso(int64_t ms, char *out, size_t outlen);

/* A table: a header row, then rows of the same width. Cells are copied. */
typedef struct ctl_table ctl_table;
/* ncols >= 1 header names. NULL on ENOMEM. */
ctl_table *ctl_table_new(size_t ncols, const char *const *headers);
/* Append a row of ncols cells (NULL cells print as "-"). 0 or -1 (ENOMEM). */
int ctl_table_add(ctl_table *t, const char *const *cells);
size_t ctl_table_rows(const ctl_table *t);
/* The table as text (new string, caller frees; NULL on ENOMEM): columns
 * left-aligned and separated by two spaces, no trailing spaces, one line
 * per row ending in '\n'. Width counts UTF-8 characters, not bytes. */
char *ctl_table_render(const ctl_table *t);
void ctl_table_free(ctl_table *t);

/* Text from the server made safe for a terminal (new string, caller frees;
 * NULL on ENOMEM): printable UTF-8 is kept; every byte of a control
 * character (C0, DEL, C1) or of invalid UTF-8 becomes "\xNN". Agent names,
 * model ids and key names come from outside: printed raw, an ESC sequence
 * in one would drive the operator's terminal. */
char *ctl_fmt_escape(const char *s, size_t n);
/* Apply ctl_fmt_escape to every string and object key in v, in place
 * (recursively). 0, or -1 on ENOMEM. */
int ctl_fmt_sanitize_json(json_t *v);

#endif
