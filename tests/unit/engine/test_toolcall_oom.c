/* Tool calls read out of generated text (src/engine/toolcall.c) when memory
 * runs out: a parse gives the content and the calls it gives with memory
 * to spare, or says GPE_ERR_NOMEM (gpe_toolparse_new NULL, a feed, or the
 * finish: the agent then ends the job as its own out of memory); never a
 * call with other arguments. jansson 2.14's dump of an arguments object
 * leaves a key out and succeeds when its buffer cannot grow for the key,
 * and its load of a call's body drops a byte of a long string and
 * succeeds: the engine's checked load and dump (src/engine/jcheck.h).
 *
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: jansson's and the parser's malloc, calloc, realloc and
 * strdup (tests/unit/server/fixture_oom.h, through the linker's --wrap:
 * part-48-toolcall-oom.cmake). Each family's format (chatml's closed calls
 * are read by a feed, llama-3's and mistral's by the finish), fed whole
 * and in pieces, with the engine alone (arm_libc) and with gp_json's
 * counter registered as the agent does (engine.h
 * gpe_set_json_alloc_failures; arm_beneath).
 *
 * test_careless_sweep: a caller that goes on feeding after GPE_ERR_NOMEM
 * gets nothing more: the failing feed and every later one say
 * GPE_ERR_NOMEM with *emit "" and *emit_len 0 (set, whatever failed: the
 * piece's own buffer included), and the finish says GPE_ERR_NOMEM too
 * (engine.h), never GPE_OK over a text with a piece left out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include <gpupool/engine.h>

#include "common/gp_json.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

/* Arguments with keys past the dump's first buffers and strings past the
 * lexer's (16 bytes), an arguments string taken as given, nesting. */
static const struct {
    const char *family;
    const char *text;
    size_t n_calls;
} CASES[] = {
    {"chatml",
     "Let me look that up.\n<tool_call>\n{\"name\": \"get_the_weather_forecast\", "
     "\"arguments\": {\"home_address_for_mail\": \"12 Long Street Name, Springfield\", "
     "\"zip_code_of_the_street\": 12345}}\n</tool_call>\n<tool_call>\n{\"name\": \"f2\", "
     "\"arguments\": \"{\\\"raw\\\": 1}\"}\n</tool_call>",
     2},
    {"llama-3",
     "{\"name\": \"lookup_the_address\", \"parameters\": {\"home_address_for_mail\": \"x\", "
     "\"nested_object_key_here\": {\"zip_code_of_the_street\": [1, 2, 3]}}}",
     1},
    {"mistral",
     "[TOOL_CALLS] [{\"name\": \"a_function_name\", \"arguments\": {\"home_address_for_mail\": "
     "\"a string longer than the lexer's buffer\"}}, {\"name\": \"b\", \"arguments\": "
     "{\"zip_code_of_the_street\": 1}, \"id\": \"abc123xyz\"}]",
     2},
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

typedef struct result {
    gpe_status st;
    char content[1024];
    size_t n_calls;
    char names[4][64];
    char args[4][256];
} result;

static void append(result *r, const char *s, size_t n)
{
    size_t have = strlen(r->content);
    assert_true(have + n < sizeof r->content);
    memcpy(r->content + have, s, n);
    r->content[have + n] = '\0';
}

/* text through a parser in pieces of step bytes (0: whole); r->st the
 * first failure's status (the agent stops there), else the finish's. */
static void parse(const char *family, const char *text, size_t step, result *r)
{
    memset(r, 0, sizeof *r);
    gpe_toolparse *p = gpe_toolparse_new(family);
    if (!p) {
        r->st = GPE_ERR_NOMEM;
        return;
    }
    size_t len = strlen(text);
    const char *emit;
    size_t elen;
    for (size_t at = 0; at < len && r->st == GPE_OK;) {
        size_t n = step && len - at > step ? step : len - at;
        r->st = gpe_toolparse_feed(p, text + at, n, &emit, &elen);
        append(r, emit, elen);
        at += n;
    }
    if (r->st == GPE_OK) {
        r->st = gpe_toolparse_finish(p, &emit, &elen);
        append(r, emit, elen);
    }
    r->n_calls = gpe_toolparse_n_calls(p);
    for (size_t i = 0; i < r->n_calls && i < 4; i++) {
        const char *nm, *a;
        assert_true(gpe_toolparse_call(p, i, &nm, &a));
        snprintf(r->names[i], sizeof r->names[i], "%s", nm);
        snprintf(r->args[i], sizeof r->args[i], "%s", a);
    }
    gpe_toolparse_free(p);
}

static bool same(const result *a, const result *b)
{
    if (a->st != b->st || strcmp(a->content, b->content) || a->n_calls != b->n_calls)
        return false;
    for (size_t i = 0; i < a->n_calls && i < 4; i++)
        if (strcmp(a->names[i], b->names[i]) || strcmp(a->args[i], b->args[i]))
            return false;
    return true;
}

static void use_counter(bool on)
{
    gp_json_init();
    gpe_set_json_alloc_failures(on ? gp_json_alloc_failures : NULL);
}

/* One case, one step, one mode: the number of runs that broke the rule
 * (each printed). */
static int sweep(size_t c, size_t step, bool counted)
{
    result ref, got;
    parse(CASES[c].family, CASES[c].text, step, &ref);
    assert_int_equal(ref.st, GPE_OK);
    assert_int_equal(ref.n_calls, CASES[c].n_calls);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        if (counted)
            arm_beneath(n);
        else
            arm_libc(n);
        parse(CASES[c].family, CASES[c].text, step, &got);
        bool hit = disarm();
        bool ok = got.st == GPE_OK ? same(&got, &ref) : hit && got.st == GPE_ERR_NOMEM;
        if (!ok) {
            print_message("%s, step %zu%s: allocation %zu %s: status %d, %zu calls",
                          CASES[c].family, step, counted ? ", counter" : "", n,
                          hit ? "failed" : "did not fail", (int)got.st, got.n_calls);
            for (size_t i = 0; i < got.n_calls && i < 4; i++)
                print_message(" %s(%s)", got.names[i], got.args[i]);
            print_message("\n");
            bad++;
        }
        if (!hit)
            break;
    }
    print_message("%s, step %zu%s: %zu allocations swept, %d broke the rule\n",
                  CASES[c].family, step, counted ? ", counter" : "", n - 1, bad);
    return bad;
}

/* text fed in pieces of step bytes by a caller that does not stop at a
 * failure; the number of rules broken (each printed). */
static int careless(const char *family, const char *text, size_t step, size_t n, bool *hit)
{
    int bad = 0;
    arm_libc(n);
    gpe_toolparse *p = gpe_toolparse_new(family);
    size_t len = strlen(text);
    bool failed = false;
    for (size_t at = 0; p && at < len;) {
        size_t k = step && len - at > step ? step : len - at;
        const char *emit = NULL;
        size_t elen = 12345;
        gpe_status st = gpe_toolparse_feed(p, text + at, k, &emit, &elen);
        if (st == GPE_ERR_NOMEM) {
            failed = true;
            if (!emit || *emit || elen != 0) {
                print_message("%s, step %zu: allocation %zu: a feed said GPE_ERR_NOMEM with "
                              "%s, %zu bytes\n", family, step, n, emit ? "text" : "no *emit set",
                              elen);
                bad++;
            }
        } else if (failed) {
            print_message("%s, step %zu: allocation %zu: a feed after GPE_ERR_NOMEM said %d\n",
                          family, step, n, (int)st);
            bad++;
        }
        at += k;
    }
    if (p) {
        const char *emit;
        size_t elen;
        gpe_status st = gpe_toolparse_finish(p, &emit, &elen);
        if (failed && st != GPE_ERR_NOMEM) {
            print_message("%s, step %zu: allocation %zu: the finish after a feed's "
                          "GPE_ERR_NOMEM said %d\n", family, step, n, (int)st);
            bad++;
        }
    }
    gpe_toolparse_free(p);
    *hit = disarm();
    return bad;
}

static void test_careless_sweep(void **state)
{
    (void)state;
    static const size_t steps[] = {0, 7};
    int bad = 0;
    use_counter(false);
    for (size_t c = 0; c < N_CASES; c++)
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            bool hit;
            size_t n;
            for (n = 1;; n++) {
                bad += careless(CASES[c].family, CASES[c].text, steps[s], n, &hit);
                if (!hit)
                    break;
            }
            print_message("%s, step %zu, careless: %zu allocations swept\n", CASES[c].family,
                          steps[s], n - 1);
        }
    assert_int_equal(bad, 0);
}

static void test_sweep(void **state)
{
    (void)state;
    static const size_t steps[] = {0, 7};
    int bad = 0;
    for (int on = 0; on <= 1; on++) {
        use_counter(on);
        for (size_t c = 0; c < N_CASES; c++)
            for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++)
                bad += sweep(c, steps[s], on);
    }
    use_counter(false);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_careless_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
