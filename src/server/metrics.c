/* metrics: see metrics.h. */
#include "server/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/fleet/gps_strmap.h"

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

/* Families by name (the server's string map): a counter is bumped per
 * agent upload and per request, and walking the family list with a strcmp
 * each (~70 families) cost ~1,500 instructions a bump, the largest strcmp
 * caller of a relayed token (issue 24). The list keeps the order of
 * definition for the exposition; families are never removed. */
struct gps_metrics {
    family *head, *tail;
    smap index; /* name -> family (borrowed: the list owns them) */
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
    smap_free(&m->index, NULL);
    free(m);
}

static family *find_family(gps_metrics *m, const char *name)
{
    return smap_get(&m->index, name);
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
    if (!f->name || !f->help || (type == GPS_METRIC_HISTOGRAM && nbuckets && !f->buckets) ||
        !smap_put(&m->index, name, f)) {
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
        /* "%s%s=\"" written by hand (a label per metric update, several
         * updates a request); snprintf only for the cut that ends them. */
        size_t klen = strlen(k), w = (o ? 1 : 0) + klen + 2;
        if (w >= outlen - o) {
            snprintf(out + o, outlen - o, "%s%s=\"", o ? "," : "", k);
            break;
        }
        if (o)
            out[o++] = ',';
        memcpy(out + o, k, klen);
        o += klen;
        out[o++] = '=';
        out[o++] = '"';
        out[o] = '\0';
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

/* attempts_lost_total's closed label set: the server's own reasons for
 * ending an attempt, AGENT_SHUTDOWN lower-cased, upstream_error for an
 * agent's UPSTREAM_* codes and agent_error for any other code an agent
 * ended it with (an agent cannot add label values). */
static const char *const lost_reasons[] = {
    "agent_dead",      "agent_offline",     "agent_disconnected", "agent_restarted",
    "agent_removed",   "agent_dropped_job", "stalled",            "agent_shutdown",
    "upstream_error",  "agent_error",
};

/* Histogram buckets (seconds) of the server's families below. */
static const double buckets_duration[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                          2.5,   5,    10,    30,   60,  120,  300};
static const double buckets_ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30};
static const double buckets_latency[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                         1,     2.5,   5,    10,    30,   60,  120};
#define BUCKETS(b) b, sizeof b / sizeof b[0]

/* The server's metric families: name, type, help, histogram buckets. */
typedef struct {
    const char *name;
    gps_metric_type type;
    const char *help;
    const double *buckets;
    size_t nbuckets;
} server_family;

static const server_family server_families[] = {
    {"requests_total", GPS_METRIC_COUNTER,
     "Client requests answered, by API and outcome (ok or the lower-cased error code).",
     NULL, 0},
    {"request_duration_seconds", GPS_METRIC_HISTOGRAM,
     "Client request duration, arrival to last byte, by API and outcome.",
     BUCKETS(buckets_duration)},
    {"time_to_first_token_seconds", GPS_METRIC_HISTOGRAM,
     "Arrival to the first generated token sent to the client, by API and serving model.",
     BUCKETS(buckets_ttft)},
    {"scheduling_latency_seconds", GPS_METRIC_HISTOGRAM,
     "Submit to the first assignment to an agent, by model and priority.",
     BUCKETS(buckets_latency)},
    {"tokens_generated_total", GPS_METRIC_COUNTER, "Tokens relayed to clients.", NULL, 0},
    {"agent_uploads_total", GPS_METRIC_COUNTER,
     "Agents' event uploads by route: job (one job per request) or batch "
     "(POST /agents/events).", NULL, 0},
    {"agent_upload_entries_total", GPS_METRIC_COUNTER,
     "Jobs' event batches those uploads carried (batch: one per job entry).", NULL, 0},
    {"prefix_routed_total", GPS_METRIC_COUNTER,
     "Assignments of jobs while agents advertise prompt prefixes: hit = sent to the slot "
     "holding the job's longest prefix, miss = by policy.", NULL, 0},
    {"tasks_accepted_total", GPS_METRIC_COUNTER,
     "Native tasks accepted (202); each counts in requests_total once it ends.", NULL, 0},
    {"queue_depth", GPS_METRIC_GAUGE, "Jobs waiting per model and priority.", NULL, 0},
    {"jobs_running", GPS_METRIC_GAUGE, "Jobs assigned to agents and not finished.", NULL, 0},
    {"jobs_in_memory", GPS_METRIC_GAUGE,
     "Jobs the server holds in memory: live ones and finished ones still read.", NULL, 0},
    {"job_records", GPS_METRIC_GAUGE,
     "Records (~150 bytes) of jobs finished in the last 60 s and no longer held, kept "
     "for late agent uploads.", NULL, 0},
    {"agents", GPS_METRIC_GAUGE, "Agents per health state.", NULL, 0},
    {"model_agents", GPS_METRIC_GAUGE,
     "Live agents serving each model name known since start (0: its requests get 503).",
     NULL, 0},
    {"deployment_replicas_wanted", GPS_METRIC_GAUGE,
     "Replicas an operator asked for, per deployed model.", NULL, 0},
    {"deployment_replicas", GPS_METRIC_GAUGE,
     "Replicas of a deployed model per state (assigned, downloading, loading, ready, "
     "failed).", NULL, 0},
    {"deployment_replicas_unplaced", GPS_METRIC_GAUGE,
     "Replicas of a deployed model that fit no agent now (gpupoolctl models show says "
     "why).", NULL, 0},
    {"agents_parked", GPS_METRIC_GAUGE,
     "Agents holding a long-poll for work (ready to take a job).", NULL, 0},
    {"agents_liveness_parked", GPS_METRIC_GAUGE,
     "Busy agents holding a free_slots 0 long-poll (its close ends their jobs' attempts).",
     NULL, 0},
    {"slots_busy", GPS_METRIC_GAUGE, "Agent slots running a job (live agents).", NULL, 0},
    {"slots_capacity", GPS_METRIC_GAUGE,
     "Agent slots of live agents (capacity).", NULL, 0},
    {"agent_queue_depth", GPS_METRIC_GAUGE,
     "Jobs waiting inside a live agent, as it reported on its last poll.", NULL, 0},
    {"agent_kv_cache_utilization", GPS_METRIC_GAUGE,
     "KV-cache positions in use (0 to 1) of a live agent, as it reported on its last poll "
     "(agents that report it only).",
     NULL, 0},
    /* Prompt-prefix cache of gguf agents, as each reported on its last
     * poll (counters since the agent started: a restart resets them). */
    {"agent_prefix_cache_lookups_total", GPS_METRIC_COUNTER,
     "Prompts a live agent looked up in its prompt-prefix cache.", NULL, 0},
    {"agent_prefix_cache_hits_total", GPS_METRIC_COUNTER,
     "Prompts that reused a cached prefix of a live agent's slot.", NULL, 0},
    {"agent_prefix_cache_tokens_saved_total", GPS_METRIC_COUNTER,
     "Prompt tokens a live agent took from its prefix cache instead of computing them.",
     NULL, 0},
    {"agent_prefix_cache_tokens_computed_total", GPS_METRIC_COUNTER,
     "Prompt tokens a live agent computed (prefill).", NULL, 0},
    {"agent_prefix_cache_tokens_held", GPS_METRIC_GAUGE,
     "KV positions a live agent's slots hold for reuse, summed over its slots.", NULL, 0},
    /* Backend and GPUs of live agents, as each reported on its last
     * poll (hw_facts.h); GPU series are labelled agent (id), name and
     * gpu (the agent's device index). */
    {"agent_backend", GPS_METRIC_GAUGE,
     "1 for the backend a live agent runs its model on (cuda, cpu, openai).", NULL, 0},
    {"agent_error", GPS_METRIC_GAUGE,
     "1 while a live agent reports an error (e.g. a model that does not fit its GPUs: "
     "it serves no model).",
     NULL, 0},
    {"agent_backend_faults_total", GPS_METRIC_COUNTER,
     "Device faults (CUDA errors, out of VRAM while running) a live agent's engine had "
     "since it started.",
     NULL, 0},
    {"gpu_vram_total_bytes", GPS_METRIC_GAUGE, "VRAM of a live agent's GPU.", NULL, 0},
    {"gpu_vram_used_bytes", GPS_METRIC_GAUGE,
     "VRAM in use on a live agent's GPU (every process).", NULL, 0},
    {"gpu_vram_model_bytes", GPS_METRIC_GAUGE,
     "VRAM the agent's model (weights, KV cache, scratch) holds on its GPU.", NULL, 0},
    {"gpu_vram_free_bytes", GPS_METRIC_GAUGE, "Free VRAM on a live agent's GPU.", NULL, 0},
    {"gpu_utilization_ratio", GPS_METRIC_GAUGE,
     "GPU busy fraction (0 to 1) over the driver's last sample period.", NULL, 0},
    {"gpu_temperature_celsius", GPS_METRIC_GAUGE, "GPU core temperature.", NULL, 0},
    {"gpu_power_watts", GPS_METRIC_GAUGE, "GPU power draw.", NULL, 0},
    {"gpu_fault", GPS_METRIC_GAUGE,
     "1 while the agent keeps a GPU out of service after a device error (it re-initialises "
     "it with backoff).",
     NULL, 0},
    {"failovers_total", GPS_METRIC_COUNTER,
     "Jobs whose agent was lost, by what followed (requeue, continue, error, exhausted).",
     NULL, 0},
    {"attempts_lost_total", GPS_METRIC_COUNTER,
     "Job attempts ended by losing their agent, by reason (stalled: no event for "
     "stall_timeout_sec).",
     NULL, 0},
    {"auth_failures_total", GPS_METRIC_COUNTER,
     "Requests refused for a missing, bad or unfit key, by reason.", NULL, 0},
    {"rate_limited_total", GPS_METRIC_COUNTER,
     "Requests refused by a limit, by reason (rpm, tokens_per_day, queue_full).", NULL, 0},
    /* Process memory (memstat.h): RSS next to glibc's own figures, so
     * that a leak (heap in use grows) can be told from allocator
     * behaviour (free heap grows, in use flat). */
    {"process_resident_bytes", GPS_METRIC_GAUGE, "Resident set size of the server.", NULL,
     0},
    {"heap_inuse_bytes", GPS_METRIC_GAUGE,
     "Bytes in live malloc allocations, all arenas (glibc mallinfo2).", NULL, 0},
    {"heap_free_bytes", GPS_METRIC_GAUGE,
     "Bytes malloc holds free (free lists and arena tops, all arenas), trimmed pages "
     "included (those are no longer resident).", NULL, 0},
    {"heap_trims_total", GPS_METRIC_COUNTER,
     "Times free heap was given back to the kernel (heap_trim_bytes).", NULL, 0},
    {"tasks_in_memory", GPS_METRIC_GAUGE,
     "Native tasks held in memory (running, and finished ones still hot).", NULL, 0},
    {"task_events_in_memory", GPS_METRIC_GAUGE,
     "Events those tasks hold for replay (task_hot_max_events bounds the finished "
     "ones').", NULL, 0},
    {"db_memory_bytes", GPS_METRIC_GAUGE,
     "Bytes SQLite has allocated (page caches, statements), both connections.", NULL, 0},
    {"db_writes_total", GPS_METRIC_COUNTER, "Rows handed to the DB thread.", NULL, 0},
    {"db_errors_total", GPS_METRIC_COUNTER, "DB operations that failed.", NULL, 0},
    {"agent_events_dropped_total", GPS_METRIC_COUNTER,
     "Agent events not relayed, by reason (unknown_type, metrics beyond the per-job "
     "number, too_large: the job failed).",
     NULL, 0},
};

int gps_metrics_define_server(gps_metrics *m)
{
    static const char *modes[] = {"requeue", "continue", "error", "exhausted"};
    static const char *limits[] = {"rpm", "tokens_per_day", "queue_full"};
    int rc = 0;
    for (size_t i = 0; i < sizeof server_families / sizeof server_families[0]; i++) {
        const server_family *f = &server_families[i];
        rc |= gps_metrics_define(m, f->name, f->type, f->help, f->buckets, f->nbuckets);
    }
    /* Counters start at 0 so that they show up (and rate() works) before
     * their first event. */
    gps_metrics_add(m, "tokens_generated_total", NULL, 0);
    gps_metrics_add(m, "prefix_routed_total", "result=\"hit\"", 0);
    gps_metrics_add(m, "agent_uploads_total", "route=\"job\"", 0);
    gps_metrics_add(m, "agent_uploads_total", "route=\"batch\"", 0);
    gps_metrics_add(m, "agent_upload_entries_total", "route=\"job\"", 0);
    gps_metrics_add(m, "agent_upload_entries_total", "route=\"batch\"", 0);
    gps_metrics_add(m, "prefix_routed_total", "result=\"miss\"", 0);
    gps_metrics_add(m, "db_writes_total", NULL, 0);
    gps_metrics_add(m, "db_errors_total", NULL, 0);
    char l[64];
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        gps_metrics_add(m, "failovers_total",
                        gps_metrics_label(l, sizeof l, "mode", modes[i], (char *)NULL), 0);
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
        gps_metrics_add(m, "rate_limited_total",
                        gps_metrics_label(l, sizeof l, "reason", limits[i], (char *)NULL), 0);
    for (size_t i = 0; i < sizeof lost_reasons / sizeof lost_reasons[0]; i++)
        gps_metrics_add(m, "attempts_lost_total",
                        gps_metrics_label(l, sizeof l, "reason", lost_reasons[i], (char *)NULL),
                        0);
    return rc ? -1 : 0;
}

void gps_metrics_attempt_lost(gps_metrics *m, const char *why)
{
    const char *reason = "agent_error";
    char low[32];
    size_t i = 0;
    for (; why && why[i] && i + 1 < sizeof low; i++)
        low[i] = (char)(why[i] >= 'A' && why[i] <= 'Z' ? why[i] + 32 : why[i]);
    low[i] = '\0';
    if (why && !why[i]) {
        for (size_t k = 0; k < sizeof lost_reasons / sizeof lost_reasons[0]; k++)
            if (strcmp(low, lost_reasons[k]) == 0)
                reason = lost_reasons[k];
        if (strncmp(low, "upstream_", 9) == 0)
            reason = "upstream_error"; /* the agent's upstream failed or stalled */
    }
    char l[64];
    gps_metrics_add(m, "attempts_lost_total",
                    gps_metrics_label(l, sizeof l, "reason", reason, (char *)NULL), 1);
}

const char *gps_metrics_outcome(const char *code)
{
    /* Codes the server defines (docs/api.md); an agent's own codes
     * (UPSTREAM_*, anything it invents) are not label values: an agent
     * must not be able to grow /metrics. */
    static const char *const table[] = {
        "ok", "cancelled", "invalid_request", "internal", "unauthorized",
        "forbidden", "not_found", "job_not_found", "model_not_found", "queue_full",
        "rate_limited", "token_limit", "no_agent", "no_capacity", "queue_timeout", "timeout",
        "agent_lost", "agent_error", "agent_output_too_large", "context_overflow",
        "server_restart", "shutting_down", "body_too_large", "client_too_slow",
    };
    char low[32];
    size_t i = 0;
    for (; code && code[i] && i + 1 < sizeof low; i++)
        low[i] = (char)(code[i] >= 'A' && code[i] <= 'Z' ? code[i] + 32 : code[i]);
    if (code && code[i])
        return "agent_error"; /* longer than any name in the table */
    low[i] = '\0';
    for (size_t k = 0; k < sizeof table / sizeof table[0]; k++)
        if (strcmp(low, table[k]) == 0)
            return table[k];
    return "agent_error";
}

void gps_metrics_request(gps_metrics *m, const char *api, const char *outcome, double seconds)
{
    char l[160];
    gps_metrics_label(l, sizeof l, "api", api, "outcome", gps_metrics_outcome(outcome),
                      (char *)NULL);
    gps_metrics_add(m, "requests_total", l, 1);
    gps_metrics_observe(m, "request_duration_seconds", l, seconds);
}

void gps_metrics_ttft(gps_metrics *m, const char *api, const char *model, double seconds)
{
    char l[600];
    gps_metrics_label(l, sizeof l, "api", api, "model", model, (char *)NULL);
    gps_metrics_observe(m, "time_to_first_token_seconds", l, seconds);
}

void gps_metrics_sched_latency(gps_metrics *m, const char *model, const char *priority,
                               double seconds)
{
    char l[600];
    gps_metrics_label(l, sizeof l, "model", model, "priority", priority, (char *)NULL);
    gps_metrics_observe(m, "scheduling_latency_seconds", l, seconds);
}

void gps_metrics_rate_limited(gps_metrics *m, const char *reason)
{
    char l[64];
    gps_metrics_label(l, sizeof l, "reason", reason, (char *)NULL);
    gps_metrics_add(m, "rate_limited_total", l, 1);
}

double gps_metrics_sum_except(gps_metrics *m, const char *name, const char *except)
{
    family *f = find_family(m, name);
    double total = 0;
    for (series *s = f ? f->head : NULL; s; s = s->next)
        if (!except || !s->labels || !strstr(s->labels, except))
            total += f->type == GPS_METRIC_HISTOGRAM ? (double)s->count : s->value;
    return total;
}

double gps_metrics_sum(gps_metrics *m, const char *name)
{
    family *f = find_family(m, name);
    double total = 0;
    for (series *s = f ? f->head : NULL; s; s = s->next)
        total += f->type == GPS_METRIC_HISTOGRAM ? (double)s->count : s->value;
    return total;
}
