/* metrics: see metrics.h. */
#include "server/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "gpupool_"

typedef struct series {
    char *labels;
    double value;          /* counter / gauge */
    double sum;            /* histogram */
    unsigned long long count;
    unsigned long long *bucket_counts; /* histogram: per bucket (non-cumulative) */
    struct series *next;
} series;

typedef struct family {
    char *name;
    char *help;
    gps_metric_type type;
    double *buckets;
    size_t nbuckets;
    series *head, *tail;
    struct family *next;
} family;

struct gps_metrics {
    family *head, *tail;
    gps_metrics_collect_fn collect;
    void *collect_arg;
};

gps_metrics *gps_metrics_new(void)
{
    return calloc(1, sizeof(gps_metrics));
}

static void series_free_all(family *f)
{
    series *s = f->head;
    while (s) {
        series *n = s->next;
        free(s->labels);
        free(s->bucket_counts);
        free(s);
        s = n;
    }
    f->head = f->tail = NULL;
}

void gps_metrics_free(gps_metrics *m)
{
    if (!m)
        return;
    family *f = m->head;
    while (f) {
        family *n = f->next;
        series_free_all(f);
        free(f->name);
        free(f->help);
        free(f->buckets);
        free(f);
        f = n;
    }
    free(m);
}

static family *find_family(gps_metrics *m, const char *name)
{
    for (family *f = m->head; f; f = f->next)
        if (strcmp(f->name, name) == 0)
            return f;
    return NULL;
}

int gps_metrics_define(gps_metrics *m, const char *name, gps_metric_type type,
                       const char *help, const double *buckets, size_t nbuckets)
{
    if (find_family(m, name))
        return 0;
    family *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    f->type = type;
    if (type == GPS_METRIC_HISTOGRAM && nbuckets) {
        f->buckets = malloc(nbuckets * sizeof(double));
        if (f->buckets)
            memcpy(f->buckets, buckets, nbuckets * sizeof(double));
        f->nbuckets = nbuckets;
    }
    if (!f->name || !f->help || (type == GPS_METRIC_HISTOGRAM && nbuckets && !f->buckets)) {
        free(f->name);
        free(f->help);
        free(f->buckets);
        free(f);
        return -1;
    }
    if (m->tail)
        m->tail->next = f;
    else
        m->head = f;
    m->tail = f;
    return 0;
}

static series *find_series(family *f, const char *labels, bool create)
{
    if (!labels)
        labels = "";
    for (series *s = f->head; s; s = s->next)
        if (strcmp(s->labels, labels) == 0)
            return s;
    if (!create)
        return NULL;
    series *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->labels = strdup(labels);
    if (f->type == GPS_METRIC_HISTOGRAM)
        s->bucket_counts = calloc(f->nbuckets ? f->nbuckets : 1, sizeof(unsigned long long));
    if (!s->labels || (f->type == GPS_METRIC_HISTOGRAM && !s->bucket_counts)) {
        free(s->labels);
        free(s->bucket_counts);
        free(s);
        return NULL;
    }
    if (f->tail)
        f->tail->next = s;
    else
        f->head = s;
    f->tail = s;
    return s;
}

void gps_metrics_add(gps_metrics *m, const char *name, const char *labels, double v)
{
    family *f = find_family(m, name);
    series *s = f && f->type != GPS_METRIC_HISTOGRAM ? find_series(f, labels, true) : NULL;
    if (s)
        s->value += v;
}

void gps_metrics_set(gps_metrics *m, const char *name, const char *labels, double v)
{
    family *f = find_family(m, name);
    series *s = f && f->type != GPS_METRIC_HISTOGRAM ? find_series(f, labels, true) : NULL;
    if (s)
        s->value = v;
}

void gps_metrics_observe(gps_metrics *m, const char *name, const char *labels, double v)
{
    family *f = find_family(m, name);
    series *s = f && f->type == GPS_METRIC_HISTOGRAM ? find_series(f, labels, true) : NULL;
    if (!s || isnan(v))
        return;
    s->sum += v;
    s->count++;
    for (size_t i = 0; i < f->nbuckets; i++) {
        if (v <= f->buckets[i]) {
            s->bucket_counts[i]++;
            break;
        }
    }
}

void gps_metrics_reset(gps_metrics *m, const char *name)
{
    family *f = find_family(m, name);
    if (f)
        series_free_all(f);
}

double gps_metrics_get(gps_metrics *m, const char *name, const char *labels)
{
    family *f = find_family(m, name);
    series *s = f ? find_series(f, labels, false) : NULL;
    if (!s)
        return 0;
    return f->type == GPS_METRIC_HISTOGRAM ? (double)s->count : s->value;
}

void gps_metrics_set_collector(gps_metrics *m, gps_metrics_collect_fn fn, void *arg)
{
    m->collect = fn;
    m->collect_arg = arg;
}

/* %g is not enough for counters above 1e6: print integers exactly. */
static int fmt_value(gp_buf *out, double v)
{
    if (isinf(v))
        return gp_buf_appendf(out, v > 0 ? "+Inf" : "-Inf");
    if (v == floor(v) && fabs(v) < 9e15)
        return gp_buf_appendf(out, "%.0f", v);
    return gp_buf_appendf(out, "%.6g", v);
}

static int sample(gp_buf *out, const char *name, const char *suffix, const char *labels,
                  const char *extra, double v)
{
    bool hl = labels && *labels, he = extra && *extra;
    int rc = gp_buf_appendf(out, PREFIX "%s%s", name, suffix);
    if (hl || he)
        rc |= gp_buf_appendf(out, "{%s%s%s}", hl ? labels : "", hl && he ? "," : "",
                             he ? extra : "");
    rc |= gp_buf_append(out, " ", 1);
    rc |= fmt_value(out, v);
    rc |= gp_buf_append(out, "\n", 1);
    return rc ? -1 : 0;
}

int gps_metrics_render(gps_metrics *m, gp_buf *out)
{
    if (m->collect)
        m->collect(m, m->collect_arg);
    static const char *tn[] = {"counter", "gauge", "histogram"};
    for (family *f = m->head; f; f = f->next) {
        if (gp_buf_appendf(out, "# HELP " PREFIX "%s %s\n# TYPE " PREFIX "%s %s\n", f->name,
                           f->help, f->name, tn[f->type]) < 0)
            return -1;
        for (series *s = f->head; s; s = s->next) {
            if (f->type != GPS_METRIC_HISTOGRAM) {
                if (sample(out, f->name, "", s->labels, NULL, s->value) < 0)
                    return -1;
                continue;
            }
            unsigned long long cum = 0;
            for (size_t i = 0; i < f->nbuckets; i++) {
                cum += s->bucket_counts[i];
                char le[48];
                snprintf(le, sizeof le, "le=\"%g\"", f->buckets[i]);
                if (sample(out, f->name, "_bucket", s->labels, le, (double)cum) < 0)
                    return -1;
            }
            if (sample(out, f->name, "_bucket", s->labels, "le=\"+Inf\"", (double)s->count) < 0 ||
                sample(out, f->name, "_sum", s->labels, NULL, s->sum) < 0 ||
                sample(out, f->name, "_count", s->labels, NULL, (double)s->count) < 0)
                return -1;
        }
    }
    return 0;
}

char *gps_metrics_label(char *out, size_t outlen, ...)
{
    va_list ap;
    va_start(ap, outlen);
    size_t o = 0;
    out[0] = '\0';
    const char *k;
    while ((k = va_arg(ap, const char *)) != NULL) {
        const char *v = va_arg(ap, const char *);
        if (!v)
            v = "";
        int w = snprintf(out + o, outlen - o, "%s%s=\"", o ? "," : "", k);
        if (w < 0 || (size_t)w >= outlen - o)
            break;
        o += (size_t)w;
        for (; *v && o + 3 < outlen; v++) {
            if (*v == '\\' || *v == '"') {
                out[o++] = '\\';
                out[o++] = *v;
            } else if (*v == '\n') {
                out[o++] = '\\';
                out[o++] = 'n';
            } else {
                out[o++] = *v;
            }
        }
        if (o + 2 > outlen)
            break;
        out[o++] = '"';
        out[o] = '\0';
    }
    va_end(ap);
    return out;
}

int gps_metrics_define_server(gps_metrics *m)
{
    static const double dur[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
    static const double ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30};
    int rc = 0;
    rc |= gps_metrics_define(m, "requests_total", GPS_METRIC_COUNTER,
                             "Client requests by API and outcome.", NULL, 0);
    rc |= gps_metrics_define(m, "request_duration_seconds", GPS_METRIC_HISTOGRAM,
                             "Client request duration, arrival to last byte.", dur,
                             sizeof dur / sizeof dur[0]);
    rc |= gps_metrics_define(m, "time_to_first_token_seconds", GPS_METRIC_HISTOGRAM,
                             "Arrival to first generated token sent to the client.", ttft,
                             sizeof ttft / sizeof ttft[0]);
    rc |= gps_metrics_define(m, "tokens_generated_total", GPS_METRIC_COUNTER,
                             "Tokens relayed to clients.", NULL, 0);
    rc |= gps_metrics_define(m, "queue_depth", GPS_METRIC_GAUGE,
                             "Jobs waiting per model and priority.", NULL, 0);
    rc |= gps_metrics_define(m, "agents", GPS_METRIC_GAUGE, "Agents per health state.", NULL,
                             0);
    rc |= gps_metrics_define(m, "agents_parked", GPS_METRIC_GAUGE,
                             "Agents holding a long-poll for work (ready to take a job).", NULL,
                             0);
    rc |= gps_metrics_define(m, "slots_busy", GPS_METRIC_GAUGE,
                             "Agent slots running a job.", NULL, 0);
    rc |= gps_metrics_define(m, "slots_total", GPS_METRIC_GAUGE,
                             "Agent slots of live agents.", NULL, 0);
    rc |= gps_metrics_define(m, "failovers_total", GPS_METRIC_COUNTER,
                             "Jobs moved to another agent after losing theirs.", NULL, 0);
    rc |= gps_metrics_define(m, "auth_failures_total", GPS_METRIC_COUNTER,
                             "Requests refused for a missing or bad key.", NULL, 0);
    rc |= gps_metrics_define(m, "jobs_running", GPS_METRIC_GAUGE,
                             "Jobs assigned to agents and not finished.", NULL, 0);
    rc |= gps_metrics_define(m, "db_writes_total", GPS_METRIC_COUNTER,
                             "Rows handed to the DB thread.", NULL, 0);
    rc |= gps_metrics_define(m, "db_errors_total", GPS_METRIC_COUNTER,
                             "DB operations that failed.", NULL, 0);
    /* Unlabelled counters start at 0 so they show up before their first event. */
    gps_metrics_add(m, "tokens_generated_total", NULL, 0);
    gps_metrics_add(m, "db_writes_total", NULL, 0);
    gps_metrics_add(m, "db_errors_total", NULL, 0);
    /* Unlabelled counters start at 0 so they show up before their first event. */
    gps_metrics_add(m, "tokens_generated_total", NULL, 0);
    gps_metrics_add(m, "db_writes_total", NULL, 0);
    gps_metrics_add(m, "db_errors_total", NULL, 0);
    return rc ? -1 : 0;
}
