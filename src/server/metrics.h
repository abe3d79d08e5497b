/*
 * metrics: a small Prometheus registry and its text exposition (format
 * 0.0.4: "# HELP", "# TYPE", one sample a line).
 *
 * Families are defined once (name without the gpupool_ prefix, type, help,
 * histogram buckets); series are addressed by a preformatted label string
 * such as `api="openai",outcome="ok"` (build it with gps_metrics_label so
 * values are escaped). Labels must stay bounded (model, api, outcome,
 * state, priority, reason, mode, agent): never a job id, a key or free
 * text. A model label only ever names a model some agent announced (the
 * families that carry it are observed after an agent took the job), and
 * an agent label only names a live agent (its series vanish with it).
 * docs/operations.md lists every family.
 *
 * Gauges that mirror live state (queue depth, agents per state) are filled
 * by a collector callback right before each render; it usually calls
 * gps_metrics_reset first so that series of vanished models disappear.
 * Loop thread only: no locking.
 */
#ifndef GPS_METRICS_H
#define GPS_METRICS_H

#include <stddef.h>

#include "common/gp_util.h"

typedef enum { GPS_METRIC_COUNTER, GPS_METRIC_GAUGE, GPS_METRIC_HISTOGRAM } gps_metric_type;

typedef struct gps_metrics gps_metrics;
typedef void (*gps_metrics_collect_fn)(gps_metrics *m, void *arg);

gps_metrics *gps_metrics_new(void);
void gps_metrics_free(gps_metrics *m);
/* Define a family. buckets (upper bounds, ascending) only for histograms;
 * copied. 0 or -1. */
int gps_metrics_define(gps_metrics *m, const char *name, gps_metric_type type,
                       const char *help, const double *buckets, size_t nbuckets);
/* Counter += v. Unknown family: ignored. labels may be NULL or "". */
void gps_metrics_add(gps_metrics *m, const char *name, const char *labels, double v);
/* Gauge = v. */
void gps_metrics_set(gps_metrics *m, const char *name, const char *labels, double v);
/* Histogram observation. */
void gps_metrics_observe(gps_metrics *m, const char *name, const char *labels, double v);
/* Drop every series of a family (gauges refilled by a collector). */
void gps_metrics_reset(gps_metrics *m, const char *name);
/* Current value of a counter/gauge series (0 when absent); for tests. */
double gps_metrics_get(gps_metrics *m, const char *name, const char *labels);
void gps_metrics_set_collector(gps_metrics *m, gps_metrics_collect_fn fn, void *arg);
/* Render every family (runs the collector first). 0 or -1. */
int gps_metrics_render(gps_metrics *m, gp_buf *out);

/* Write `k1="v1",k2="v2"` into out from NULL-terminated key/value pairs,
 * escaping backslash, quote and newline. Returns out. */
char *gps_metrics_label(char *out, size_t outlen, ...);

/* Define the server's standard families (requests_total, ...). Counters
 * with a closed set of label values (failovers_total{mode},
 * rate_limited_total{reason}) start at 0 for each value. */
int gps_metrics_define_server(gps_metrics *m);

/* Server families with their label sets in one place (all no-ops on a
 * family that is not defined). */
/* A client request answered: requests_total{api,outcome} += 1 and
 * request_duration_seconds{api,outcome} observes seconds. outcome is "ok",
 * "cancelled", "accepted" or an error code in any case; it goes through
 * gps_metrics_outcome, so the label set stays closed whatever an agent
 * reported. */
void gps_metrics_request(gps_metrics *m, const char *api, const char *outcome, double seconds);
/* The closed table of outcome label values: "ok", "cancelled",
 * "accepted" and each error code the server itself defines, lower-cased;
 * any other code (one an agent chose) is "agent_error". Static string. */
const char *gps_metrics_outcome(const char *code);
/* First token sent: time_to_first_token_seconds{api,model}; model is the
 * model that served (announced by an agent). */
void gps_metrics_ttft(gps_metrics *m, const char *api, const char *model, double seconds);
/* A job attempt ended because its agent was lost:
 * attempts_lost_total{reason} += 1. why is the server's reason
 * (agent_dead, agent_offline, agent_disconnected, agent_restarted,
 * agent_removed, agent_dropped_job, stalled) or the error code an agent
 * ended the attempt with (AGENT_SHUTDOWN -> agent_shutdown, UPSTREAM_* ->
 * upstream_error, any other -> agent_error), so the label set stays closed. */
void gps_metrics_attempt_lost(gps_metrics *m, const char *why);
/* A job handed to an agent: scheduling_latency_seconds{model,priority},
 * seconds from submit (or requeue) to assignment. */
void gps_metrics_sched_latency(gps_metrics *m, const char *model, const char *priority,
                               double seconds);
/* A request refused by a limit: rate_limited_total{reason} += 1, reason
 * one of "rpm", "tokens_per_day", "queue_full". */
void gps_metrics_rate_limited(gps_metrics *m, const char *reason);

/* Sum of every series of a counter/gauge family (histograms: of their
 * counts); 0 for an unknown family. For totals over labels (admin status). */
double gps_metrics_sum(gps_metrics *m, const char *name);
/* The same over the series whose labels do not contain `except` (e.g.
 * "outcome=\"ok\"": the requests that failed). */
double gps_metrics_sum_except(gps_metrics *m, const char *name, const char *except);

#endif
