/* The chat renderers (src/engine/chat.c, chat_model.c, engine.c) when
 * memory runs out: a _status render gives the prompt it gives with memory
 * to spare (GPE_OK), or no prompt with GPE_ERR_NOMEM and "chat: out of
 * memory rendering the prompt"; never GPE_ERR_ARG (the agent's
 * INVALID_REQUEST: the client blamed for the pool's memory), never another
 * prompt (tools' JSON as given where memory ran out re-spacing it).
 * Refusals of the caller's input are GPE_ERR_ARG.
 *
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: the renderers' malloc, calloc and realloc
 * (tests/unit/server/fixture_oom.h arm_libc, through the linker's --wrap:
 * part-48-chat-oom.cmake). Each family with a tools format (chatml,
 * llama-3, mistral) and one without, and the model-level entry points on
 * stories260K. */
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

#define GPS_FIXTURE_OOM_LIBC
#include "../server/fixture_oom.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"
#define OOM_TEXT "chat: out of memory rendering the prompt"

/* Tools with parameters to re-space, a call with arguments to re-space,
 * its result, a system prompt. */
static const gpe_chat_tool TOOLS[] = {
    {"get_weather", "Weather of a city",
     "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
     "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}"},
    {"no_params", NULL, NULL},
};
static const gpe_chat_tool_call CALLS[] = {
    {"call_12345", "get_weather", "{\"city\":\"Paris\",\"days\":[1,2,{\"x\":null}]}"},
};
static const gpe_chat_msg MSGS[] = {
    {"system", "You are terse."},
    {"user", "Weather in Paris?"},
    {"assistant", NULL},
    {"tool", "{\"temp\": 21}"},
    {"user", "Thanks, and tomorrow?"},
};
static const gpe_chat_msg_tools EXTRA[] = {
    {NULL, 0, NULL}, {NULL, 0, NULL}, {CALLS, 1, NULL}, {NULL, 0, "call_12345"}, {NULL, 0, NULL},
};
#define N_MSGS (sizeof MSGS / sizeof MSGS[0])
#define N_TOOLS (sizeof TOOLS / sizeof TOOLS[0])

typedef char *(*render_fn)(const void *arg, char *err, size_t errlen, gpe_status *st);

/* One sweep: the number of runs that broke the rule (each printed). */
static int sweep(const char *what, render_fn render, const void *arg)
{
    char err[256] = "";
    gpe_status st = GPE_ERR_ARG;
    char *ref = render(arg, err, sizeof err, &st);
    if (!ref || st != GPE_OK)
        fail_msg("%s: the unhurt render failed: %d %s", what, (int)st, err);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        err[0] = '\0';
        st = GPE_OK;
        arm_libc(n);
        char *p = render(arg, err, sizeof err, &st);
        bool hit = disarm();
        if (p ? st != GPE_OK || strcmp(p, ref) != 0
              : !hit || st != GPE_ERR_NOMEM || strcmp(err, OOM_TEXT) != 0) {
            print_message("%s: allocation %zu %s: status %d, %s\n", what, n,
                          hit ? "failed" : "did not fail", (int)st,
                          p ? "another prompt" : err);
            bad++;
        }
        free(p);
        if (!hit)
            break;
    }
    print_message("%s: %zu allocations swept, %d broke the rule\n", what, n - 1, bad);
    free(ref);
    return bad;
}

typedef struct fmt_arg {
    const char *family;
    bool tool_format;
} fmt_arg;

static char *by_format(const void *arg, char *err, size_t errlen, gpe_status *st)
{
    const fmt_arg *a = arg;
    return gpe_chat_apply_format_tools_status(a->family, NULL, NULL, a->tool_format, TOOLS,
                                              N_TOOLS, MSGS, EXTRA, N_MSGS, true, err, errlen,
                                              st);
}

static char *by_format_plain(const void *arg, char *err, size_t errlen, gpe_status *st)
{
    return gpe_chat_apply_format_status(arg, NULL, NULL, MSGS, 2, true, err, errlen, st);
}

static char *by_model_tools(const void *arg, char *err, size_t errlen, gpe_status *st)
{
    return gpe_chat_apply_tools_status(arg, TOOLS, N_TOOLS, MSGS, EXTRA, N_MSGS, true, err,
                                       errlen, st);
}

static char *by_model(const void *arg, char *err, size_t errlen, gpe_status *st)
{
    return gpe_chat_apply_status(arg, MSGS, 2, true, err, errlen, st);
}

static void test_formats(void **state)
{
    (void)state;
    static const fmt_arg args[] = {
        {"chatml", true}, {"llama-3", true}, {"mistral", true}, {"chatml", false},
        {"gemma", true},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s%s", args[i].family,
                 args[i].tool_format ? " (tool format)" : " (plain text)");
        bad += sweep(what, by_format, &args[i]);
    }
    bad += sweep("phi-3 without tools", by_format_plain, "phi-3");
    assert_int_equal(bad, 0);
}

/* What the agent calls: the model's family and BOS/EOS. */
static void test_model(void **state)
{
    (void)state;
    gpe_model_params mp = gpe_model_default_params();
    mp.vocab_only = true;
    gpe_model *m = NULL;
    char err[256];
    assert_int_equal(gpe_model_load(STORIES, &mp, &m, err, sizeof err), GPE_OK);
    int bad = sweep("gpe_chat_apply_tools_status", by_model_tools, m);
    bad += sweep("gpe_chat_apply_status", by_model, m);
    gpe_model_free(m);
    assert_int_equal(bad, 0);
}

/* The caller's input refused: GPE_ERR_ARG, and the old entry points the
 * same prompt as their _status forms. */
static void test_refusals(void **state)
{
    (void)state;
    char err[256];
    gpe_status st = GPE_OK;
    const gpe_chat_msg norole[] = {{NULL, "x"}};
    const gpe_chat_tool noname[] = {{"", NULL, NULL}};
    assert_null(gpe_chat_apply_format_status("chatml", NULL, NULL, norole, 1, true, err,
                                             sizeof err, &st));
    assert_int_equal(st, GPE_ERR_ARG);
    st = GPE_OK;
    assert_null(gpe_chat_apply_format_status("vicuna", NULL, NULL, MSGS, 1, true, err,
                                             sizeof err, &st));
    assert_int_equal(st, GPE_ERR_ARG);
    st = GPE_OK;
    assert_null(gpe_chat_apply_format_tools_status("chatml", NULL, NULL, true, noname, 1, MSGS,
                                                   NULL, 1, true, err, sizeof err, &st));
    assert_int_equal(st, GPE_ERR_ARG);
    st = GPE_OK;
    assert_null(gpe_chat_apply_format_tools_status("nope", NULL, NULL, true, NULL, 0, MSGS,
                                                   NULL, 1, true, err, sizeof err, &st));
    assert_int_equal(st, GPE_ERR_ARG);
    st = GPE_OK;
    assert_null(gpe_chat_apply_tools_status(NULL, NULL, 0, MSGS, NULL, 1, true, err, sizeof err,
                                            &st));
    assert_int_equal(st, GPE_ERR_ARG);
    st = GPE_OK;
    assert_null(gpe_chat_apply_status(NULL, MSGS, 1, true, err, sizeof err, &st));
    assert_int_equal(st, GPE_ERR_ARG);
    /* st may be NULL */
    assert_null(gpe_chat_apply_format_status("vicuna", NULL, NULL, MSGS, 1, true, err,
                                             sizeof err, NULL));

    char *a = gpe_chat_apply_format_tools("mistral", NULL, NULL, true, TOOLS, N_TOOLS, MSGS,
                                          EXTRA, N_MSGS, true, err, sizeof err);
    char *b = gpe_chat_apply_format_tools_status("mistral", NULL, NULL, true, TOOLS, N_TOOLS,
                                                 MSGS, EXTRA, N_MSGS, true, err, sizeof err,
                                                 &st);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(st, GPE_OK);
    assert_string_equal(a, b);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
