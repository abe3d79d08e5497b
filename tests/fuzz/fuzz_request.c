/*
 * libFuzzer targets: the request parsers of every client dialect, over
 * arbitrary bytes decoded the way the HTTP layer decodes a body
 * (json_loadb with JSON_REJECT_DUPLICATES). One source, one binary per
 * parser (FUZZ_PARSER picks it, see part-*.cmake), so that each corpus
 * holds plain request bodies:
 *
 *   1 gps_openai_parse chat          4 gps_anthropic_parse count_tokens
 *   2 gps_openai_parse completions   5 gps_tasks_parse (/v2/tasks)
 *   3 gps_anthropic_parse messages   6 gps_pool_options_parse (x_pool_options)
 *   7 gps_resp_parse (/v1/responses)
 *
 * Properties checked beyond "no crash, no leak": a refusal always carries a
 * message for people, and the parsed spec is released by its own clear
 * function (LeakSanitizer reports anything a path forgot).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/dialects/api_anthropic.h"
#include "server/dialects/api_openai.h"
#include "server/dialects/api_tasks.h"
#include "server/dialects/responses.h"

#ifndef FUZZ_PARSER
#error "FUZZ_PARSER must be 1..7"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A refusal with no explanation is a bug: the client is told nothing. And
 * nothing here runs out of memory, so a refusal is -1 (400), never
 * GPS_PARSE_OOM (a 500 for a body that is merely wrong). */
static void need_msg(int rc, const char *msg)
{
    if (rc < 0 && msg[0] == '\0')
        abort();
    if (rc != 0 && rc != -1)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!body)
        return 0;
    char msg[512] = "";
    const char *param = NULL;
    int rc;
#if FUZZ_PARSER == 1 || FUZZ_PARSER == 2
    gps_openai_req r;
    rc = gps_openai_parse(body, FUZZ_PARSER == 1, &r, msg, sizeof msg, &param);
    need_msg(rc, msg);
    if (rc == 0)
        gps_job_spec_clear(&r.spec);
#elif FUZZ_PARSER == 3 || FUZZ_PARSER == 4
    gps_anthropic_req r;
    rc = gps_anthropic_parse(body, FUZZ_PARSER == 4, &r, msg, sizeof msg);
    need_msg(rc, msg);
    if (rc == 0) {
        /* What the handler does next: fold system and tools into the
         * messages, with and without a known context length and tools. */
        long long ctx = (size & 1) ? 0 : 256;
        msg[0] = '\0';
        rc = gps_anthropic_assemble(&r, ctx, (size & 2) != 0, msg, sizeof msg);
        need_msg(rc, msg);
        gps_anthropic_req_clear(&r);
    }
#elif FUZZ_PARSER == 5
    gps_job_spec s;
    rc = gps_tasks_parse(body, &s, msg, sizeof msg, &param);
    need_msg(rc, msg);
    if (rc == 0)
        gps_job_spec_clear(&s);
#elif FUZZ_PARSER == 6
    /* The body is the x_pool_options object itself. The caller clears the
     * spec whatever the outcome (what was filled so far stays in it). */
    gps_job_spec s;
    memset(&s, 0, sizeof s);
    rc = gps_pool_options_parse(body, &s, msg, sizeof msg, &param);
    need_msg(rc, msg);
    gps_job_spec_clear(&s);
#elif FUZZ_PARSER == 7
    gps_resp_req r;
    rc = gps_resp_parse(body, &r, msg, sizeof msg, &param);
    need_msg(rc, msg);
    if (rc == 0)
        gps_resp_req_clear(&r);
#else
#error "FUZZ_PARSER must be 1..7"
#endif
    (void)param;
    json_decref(body);
    return 0;
}
