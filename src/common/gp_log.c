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

void gp_log_vwrite(gp_log_level lvl, const char *event, const char *correlation_id,
                   json_t *fields, const char *fmt, va_list ap)
{
    if (lvl < log_min) {
        json_decref(fields);
        return;
    }
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);

    struct timespec ts;
    struct tm tm;
    char tbuf[96];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(tbuf, sizeof tbuf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);

    json_t *o = json_object();
    if (!o) {
        json_decref(fields);
        return;
    }
    json_object_set_new(o, "ts", json_string(tbuf));
    json_object_set_new(o, "level", json_string(level_names[lvl]));
    json_object_set_new(o, "component", json_string(log_component));
    json_object_set_new(o, "event", json_string(event ? event : "log"));
    /* json_stringn_nocheck would keep invalid UTF-8; messages may quote
     * client input, so let jansson validate and fall back to a marker. */
    json_t *m = json_string(msg);
    json_object_set_new(o, "msg", m ? m : json_string("(message not valid UTF-8)"));
    if (correlation_id && *correlation_id)
        json_object_set_new(o, "correlation_id", json_string(correlation_id));
    if (fields && json_is_object(fields))
        json_object_update_missing(o, fields);
    json_decref(fields);

    /* One write per line: stderr is unbuffered, and fputs then fputc were
     * two system calls per line (issue 24). */
    gp_buf line;
    gp_buf_init(&line);
    int rc = gp_json_dump_append(&line, o);
    json_decref(o);
    if (rc < 0 || gp_buf_append(&line, "\n", 1) < 0) {
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
