/*
 * reqcheck: the validation helpers every dialect's request parser uses
 * (OpenAI, Anthropic, native tasks), so that a limit or a range means the
 * same thing whichever API a request came through.
 *
 * Parsers follow one pattern: they fill a gps_job_spec, and on the first
 * bad field write a message for people into msg (msglen bytes), point
 * *param at the field's name (static string) and `goto fail`. GPS_FAIL
 * does those three steps; it expects msg, msglen, param and a fail label
 * in scope. Pure functions (unit-tested in tests/unit/server/test_reqcheck.c).
 *
 * A failed parse returns -1 when the request is wrong (400, the client's
 * to fix) and GPS_PARSE_OOM when the server ran out of memory (500, the
 * request may be retried; no param: no field is at fault). The code, not
 * the message, tells them apart: a helper's failure is passed up as it
 * came (GPS_TRY), never flattened to -1.
 */
#ifndef GPS_REQCHECK_H
#define GPS_REQCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#include "server/jobs/jobs.h"

/* Largest max_tokens any dialect accepts (Anthropic clamps to it). */
#define GPS_MAX_TOKENS_LIMIT 1000000
/* Longest model name (the model field, fallback_models entries). */
#define GPS_MAX_MODEL_NAME 256

#define GPS_FAIL(p, ...)                                                                       \
    do {                                                                                       \
        snprintf(msg, msglen, __VA_ARGS__);                                                    \
        *param = (p);                                                                          \
        goto fail;                                                                             \
    } while (0)

/* A parse that ran out of memory (see above); -1 stays "invalid request". */
#define GPS_PARSE_OOM (-2)

/* Writes the out-of-memory message into msg; returns GPS_PARSE_OOM. */
int gps_parse_oom(char *msg, size_t msglen);

/* The two steps below expect `int rc = -1;` and a fail label that returns
 * rc (after its cleanup). rc is only ever set to a failure, so a GPS_FAIL
 * after them still returns -1. */

/* Out of memory: msg, no param, rc = GPS_PARSE_OOM, goto fail. */
#define GPS_FAIL_OOM()                                                                         \
    do {                                                                                       \
        *param = NULL;                                                                         \
        rc = gps_parse_oom(msg, msglen);                                                       \
        goto fail;                                                                             \
    } while (0)

/* A helper's failure (-1 or GPS_PARSE_OOM, msg written) passed up as is. */
#define GPS_TRY(call)                                                                          \
    do {                                                                                       \
        int gps_try_rc_ = (call);                                                              \
        if (gps_try_rc_ < 0) {                                                                 \
            rc = gps_try_rc_;                                                                  \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

/* A field that is missing or JSON null: both mean "use the default". */
bool gps_absent(const json_t *v);

/* A copy of s into *out (caller frees): 0, or GPS_PARSE_OOM with msg (for
 * the parsers, whose every failure carries a message). */
int gps_strdup_msg(const char *s, char **out, char *msg, size_t msglen);

/* How a handler refuses a body its parser failed with rc: 400
 * INVALID_REQUEST, but 500 INTERNAL for GPS_PARSE_OOM: the request was
 * fine and may be retried. Returns the status and sets *code. */
int gps_parse_refusal(int rc, const char **code);

/* A message's content as one new string (*out): a string, or an array of
 * text parts {"type": t, "text": string} concatenated, t one of types (a
 * NULL-ended list; its first is the type a refusal names). field names the
 * message in a refusal ("messages[3]", "input[0]"). 0, -1 with msg, or
 * GPS_PARSE_OOM (a part left out would change the prompt). */
int gps_content_text(const json_t *c, const char *field, const char *const *types, char **out,
                     char *msg, size_t msglen);

/* body[key] when present must be a finite number in [lo, hi]; it is then
 * stored in *out (untouched when absent). name is how the message names
 * the field ("'top_p'" in OpenAI's and the native style, "top_p:" in
 * Anthropic's). 0, or -1 with msg (it allocates nothing). */
int gps_check_number(const json_t *body, const char *key, const char *name, double lo,
                     double hi, double *out, char *msg, size_t msglen);

/* A stop field (absent/null: nothing; a string; an array of at most max
 * strings), each sequence 1 to GPS_MAX_STOP_LEN bytes: an empty one would
 * match at once and make every reply empty, so it is refused, not dropped.
 * On success *out is a new array (NULL when absent). 0, or -1 or
 * GPS_PARSE_OOM with msg. */
#define GPS_MAX_STOP_LEN 1024
int gps_stop_parse(const json_t *stop, size_t max, json_t **out, char *msg, size_t msglen);

/* What every dialect's spec starts from before its body is read: api
 * (static: "openai", "anthropic", "native"), temperature 1 and top_p 1 (the
 * default every API documents), interactive priority. */
void gps_spec_defaults(gps_job_spec *s, const char *api);

/* The sampling fields OpenAI and native requests share: temperature
 * [0, temp_max], top_p [0, 1], top_k (integer 0 to 1000000, an extension),
 * stop (at most max_stop sequences). Into s; 0, or -1 with msg and *param,
 * or GPS_PARSE_OOM with msg (param NULL). */
int gps_sampling_parse(const json_t *body, gps_job_spec *s, double temp_max, size_t max_stop,
                       char *msg, size_t msglen, const char **param);

/* seed: an integer sets s->seed and s->has_seed (absent: nothing). 0, or
 * -1 when present and not an integer. */
int gps_seed_parse(const json_t *v, gps_job_spec *s);

/* "interactive" | "batch" (absent: *out untouched). 0, or -1 when v is
 * present and neither. */
int gps_priority_parse(const json_t *v, gps_job_priority *out);

/* The pool extension object `x_pool_options` (priority, prefer_agent,
 * session, labels, failover, fallback_models) into s; the same in every
 * dialect. xo may be NULL or null (nothing to do). Returns 0, or -1 with
 * msg and *param set, or GPS_PARSE_OOM with msg (param NULL); what was
 * filled so far stays in s: the caller clears s. */
int gps_pool_options_parse(const json_t *xo, gps_job_spec *s, char *msg, size_t msglen,
                           const char **param);

/* The X-Pool-Options request header: the same object as x_pool_options,
 * for clients that can add a header but not a body field (Claude Code's
 * ANTHROPIC_CUSTOM_HEADERS, Codex's http_headers, an agent whose upstream
 * is another pool). Its keys join body's x_pool_options; a key in the body
 * wins. header NULL: nothing to do. 0, or -1 with msg when the header is
 * not a JSON object (or the body's x_pool_options is not one), or
 * GPS_PARSE_OOM with msg. */
int gps_pool_options_merge_header(json_t *body, const char *header, char *msg, size_t msglen);

struct gps_req;
/* gps_req_json plus the X-Pool-Options merge: the body of a job request
 * (new reference), or NULL after replying 400 in r's dialect (500 when
 * the merge ran out of memory). */
json_t *gps_req_job_json(struct gps_req *r);

#endif
