/*
 * gp_log: JSON log lines on stderr (journald-friendly), one object a line:
 *
 *   {"ts":"2026-11-22T04:50:01.123Z","level":"info","component":"server",
 *    "event":"agent_registered","msg":"...","correlation_id":"...", ...fields}
 *
 * `event` is a stable snake_case code that operators can alert on; `msg` is
 * for people and may change. Thread-safe: a line is written with one call.
 * Prompts and outputs must never be passed in here unless log_prompts is on.
 */
#ifndef GP_LOG_H
#define GP_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <jansson.h>

typedef enum { GP_LOG_DEBUG = 0, GP_LOG_INFO, GP_LOG_WARN, GP_LOG_ERROR } gp_log_level;

/* Set the component name ("server", "agent", "run") and the minimum level.
 * Not thread-safe: call once at start-up. */
void gp_log_init(const char *component, gp_log_level min_level);
/* Parse "debug|info|warn|error"; -1 when unknown. */
int gp_log_level_parse(const char *s);
void gp_log_set_level(gp_log_level min_level);
/* Whether a line of level lvl is written: callers that build fields for a
 * line (a json_pack per job) skip that work when it is not. */
bool gp_log_enabled(gp_log_level lvl);
/* Redirect output (default stderr); path NULL = stderr. Used by SIGHUP to
 * reopen a log file. Returns 0 or -1 with errno. */
int gp_log_open(const char *path);

/* Write one line. fields: extra key/values merged into the line; the
 * reference is stolen (may be NULL). correlation_id may be NULL. */
void gp_log_write(gp_log_level lvl, const char *event, const char *correlation_id,
                  json_t *fields, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void gp_log_vwrite(gp_log_level lvl, const char *event, const char *correlation_id,
                   json_t *fields, const char *fmt, va_list ap);

#define gp_log_debug(event, ...) gp_log_write(GP_LOG_DEBUG, event, NULL, NULL, __VA_ARGS__)
#define gp_log_info(event, ...) gp_log_write(GP_LOG_INFO, event, NULL, NULL, __VA_ARGS__)
#define gp_log_warn(event, ...) gp_log_write(GP_LOG_WARN, event, NULL, NULL, __VA_ARGS__)
#define gp_log_error(event, ...) gp_log_write(GP_LOG_ERROR, event, NULL, NULL, __VA_ARGS__)

#endif
