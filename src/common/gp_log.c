/* gp_log: see gp_log.h. */
#include "common/gp_log.h"
#include "common/gp_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *log_component = "gpupool";
static gp_log_level log_min = GP_LOG_INFO;
static FILE *log_out;        /* NULL means stderr */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *level_names[] = {"debug", "info", "warn", "error"};

void gp_log_init(const char *component, gp_log_level min_level)
{
    log_component = component;
    log_min = min_level;
}

void gp_log_set_level(gp_log_level min_level)
{
    log_min = min_level;
}

bool gp_log_enabled(gp_log_level lvl)
{
    return lvl >= log_min;
}

int gp_log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

int gp_log_open(const char *path)
{
    FILE *f = NULL;
    if (path) {
        f = fopen(path, "a");
        if (!f)
            return -1;
        setvbuf(f, NULL, _IOLBF, 0);
    }
    pthread_mutex_lock(&log_lock);
    if (log_out)
        fclose(log_out);
    log_out = f;
    pthread_mutex_unlock(&log_lock);
    return 0;
}

/* ,"key":value (a JSON value, or the string text) onto a log line. */
static int append_pair(gp_buf *line, const char *sep, const char *key, size_t klen,
                       const json_t *v, const char *text)
{
    /* A plain key (nearly all) with its separator, quotes and colon in one
     * append: four appends a pair were a third of a line's cost. */
    char head[72];
    size_t sl = strlen(sep);
    if (sl + klen + 3 <= sizeof head && gp_json_escaped_len(key, klen) == klen) {
        memcpy(head, sep, sl);
        head[sl] = '"';
        memcpy(head + sl + 1, key, klen);
        memcpy(head + sl + 1 + klen, "\":", 2);
        if (gp_buf_append(line, head, sl + klen + 3) < 0)
            return -1;
    } else if (gp_buf_append(line, sep, sl) < 0 || gp_buf_append(line, "\"", 1) < 0 ||
               gp_json_escape_append(line, key, klen) < 0 || gp_buf_append(line, "\":", 2) < 0)
        return -1;
    if (v)
        return gp_json_dump_append(line, v);
    size_t tl = strlen(text);
    char q[160];
    if (tl + 2 <= sizeof q && gp_json_escaped_len(text, tl) == tl) {
        q[0] = '"';
        memcpy(q + 1, text, tl);
        q[tl + 1] = '"';
        return gp_buf_append(line, q, tl + 2);
    }
    if (gp_buf_append(line, "\"", 1) < 0 || gp_json_escape_append(line, text, tl) < 0)
        return -1;
    return gp_buf_append(line, "\"", 1);
}

static void copy_msg(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static char *put_digits(char *p, int v, int width)
{
    for (int i = width - 1; i >= 0; i--, v /= 10)
        p[i] = (char)('0' + v % 10);
    return p + width;
}

/* "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ" without snprintf (~3,300
 * instructions a line, three lines a request: issue 24); snprintf for a
 * year it would write otherwise. */
static void format_ts(char *b, size_t cap, const struct tm *tm, long ms)
{
    int year = tm->tm_year + 1900;
    if (year < 0 || year > 9999 || ms < 0 || ms > 999 || cap < 25) {
        snprintf(b, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", year, tm->tm_mon + 1,
                 tm->tm_mday, tm->tm_hour, tm->tm_min, tm->tm_sec, ms);
        return;
    }
    char *p = put_digits(b, year, 4);
    *p++ = '-';
    p = put_digits(p, tm->tm_mon + 1, 2);
    *p++ = '-';
    p = put_digits(p, tm->tm_mday, 2);
    *p++ = 'T';
    p = put_digits(p, tm->tm_hour, 2);
    *p++ = ':';
    p = put_digits(p, tm->tm_min, 2);
    *p++ = ':';
    p = put_digits(p, tm->tm_sec, 2);
    *p++ = '.';
    p = put_digits(p, (int)ms, 3);
    *p++ = 'Z';
    *p = '\0';
}

void gp_log_vwrite(gp_log_level lvl, const char *event, const char *correlation_id,
                   json_t *fields, const char *fmt, va_list ap)
{
    if (lvl < log_min) {
        json_decref(fields);
        return;
    }
    char msg[1024];
    if (strchr(fmt, '%'))
        vsnprintf(msg, sizeof msg, fmt, ap);
    else /* a message without arguments, as vsnprintf would copy it */
        copy_msg(msg, sizeof msg, fmt);

    struct timespec ts;
    struct tm tm;
    char tbuf[96];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    format_ts(tbuf, sizeof tbuf, &tm, ts.tv_nsec / 1000000);

    /* The line as json_dumps wrote the object these keys made, the fields'
     * other keys after them in their order, rendered without building it
     * (a jansson object per line was ~25,000 instructions, three lines per
     * request: issue 24). */
    const char *base[] = {"ts", "level", "component", "event", "msg", "correlation_id"};
    const char *val[] = {tbuf, level_names[lvl], log_component, event ? event : "log", msg,
                         correlation_id};
    /* json_stringn_nocheck would keep invalid UTF-8; messages may quote
     * client input, so they are checked, with a marker instead. */
    if (!gp_utf8_valid(msg, strlen(msg)))
        val[4] = "(message not valid UTF-8)";
    /* Which keys the object had: a value json_string refused (not UTF-8)
     * left its key out; the message has its marker instead. */
    bool has[6];
    for (size_t i = 0; i < 6; i++)
        has[i] = i == 4 || (val[i] && (i < 5 || *val[i]) && gp_utf8_valid(val[i], strlen(val[i])));
    gp_buf line;
    gp_buf_init(&line);
    int rc = gp_buf_append(&line, "{", 1);
    bool first = true;
    for (size_t i = 0; i < 6 && rc == 0; i++) {
        if (!has[i])
            continue;
        rc = append_pair(&line, first ? "" : ",", base[i], strlen(base[i]), NULL, val[i]);
        first = false;
    }
    if (fields && json_is_object(fields)) {
        const char *key;
        size_t klen;
        json_t *v;
        json_object_keylen_foreach(fields, key, klen, v) {
            bool dup = false;
            for (size_t i = 0; i < 6 && !dup; i++)
                dup = has[i] && strlen(base[i]) == klen && memcmp(base[i], key, klen) == 0;
            if (dup || rc < 0)
                continue;
            rc = gp_utf8_valid(key, klen) ? append_pair(&line, first ? "" : ",", key, klen, v, NULL)
                                          : -1; /* the dump refused it */
            first = false;
        }
    }
    json_decref(fields);
    if (rc < 0 || gp_buf_append(&line, "}\n", 2) < 0) {
        gp_buf_free(&line);
        return;
    }
    pthread_mutex_lock(&log_lock);
    FILE *out = log_out ? log_out : stderr;
    fwrite(line.data, 1, line.len, out);
    fflush(out);
    pthread_mutex_unlock(&log_lock);
    gp_buf_free(&line);
}

void gp_log_write(gp_log_level lvl, const char *event, const char *correlation_id,
                  json_t *fields, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gp_log_vwrite(lvl, event, correlation_id, fields, fmt, ap);
    va_end(ap);
}
