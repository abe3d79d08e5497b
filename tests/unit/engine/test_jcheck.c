/* The host's counter of jansson's failed allocations in the engine
 * (gpe_set_json_alloc_failures, engine.h; src/engine/jcheck.c), with the
 * counter the agent and gpupool-run register: gp_json's
 * (src/common/gp_json.c, gp_json_alloc_failures).
 *
 * jansson 2.14's loader, when its token buffer cannot grow, drops that
 * byte and returns a tree ("home_address_for_mail" read as
 * "home_address_fr_mail"). Without a counter the engine loads twice and
 * believes agreeing trees; memory that is short for the same growth in
 * both loads makes both drop the same byte, and they agree. Here the same
 * allocation fails in both loads (the N-th of the first, the N-th of the
 * second, counted by this file's malloc wrapper: ld --wrap=malloc,
 * part-48-jcheck.cmake, beneath gp_json's counting allocator), the engine
 * alone believes the wrong tree (the premise: the failure is one only a
 * counter sees), and with gp_json's counter registered the load is
 * refused: out of memory, from gpe_js_load and from its callers (the
 * schema compiler, the validator). The dump's counter too: a dump that
 * lost a key is refused.
 *
 * Not fixture_oom.h: it fails one allocation, and one failure is seen by
 * two loads disagreeing (test_jschema_oom.c and test_jvalidate_oom.c
 * sweep that way).
 *
 * The host's loader (gpe_set_json_loader, engine.h), gp_json's
 * (gp_json_load_checked) as the agent, gpupool-run and the server register
 * it: jansson's loader can crash short of memory, which no counter
 * undoes (test_jansson_crashes_the_engine shows it in a child process on
 * the text that kills it); with the loader every load the engine makes,
 * and every caller's, gives the exact value or out of memory, for every
 * N-th malloc failing, jansson's loader never run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include <gpupool/engine.h>

#include "common/gp_json.h"
#include "engine/jcheck.h"
#include "engine/jschema.h"
#include "engine/jvalidate.h"

/* ------------------------------------------------ the failing malloc */

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);

static bool armed;       /* mallocs are counted (and may fail) */
static size_t calls;     /* mallocs since arm */
static size_t fail_a, fail_b; /* the calls that fail (0: none) */

void *__wrap_malloc(size_t n)
{
    if (armed) {
        calls++;
        if (calls == fail_a || calls == fail_b)
            return NULL;
    }
    return __real_malloc(n);
}

static void arm(size_t a, size_t b)
{
    calls = 0;
    fail_a = a;
    fail_b = b;
    armed = true;
}

/* Mallocs made since arm. */
static size_t disarm(void)
{
    armed = false;
    return calls;
}

static void counter(bool on)
{
    gp_json_init();
    gpe_set_json_alloc_failures(on ? gp_json_alloc_failures : NULL);
}

/* ------------------------------------------- a failure in both loads */

/* The same failure in two loads of text: the N-th malloc of a load
 * where jansson returns a tree other than the text's, and the hurt
 * load's length in mallocs (P), so that failing N and P + N fails the
 * same growth in a second load. */
typedef struct twice {
    size_t n, p;
} twice;

static twice find_twice(const char *text)
{
    gp_json_init(); /* jansson's mallocs through the executable's: wrapped */
    json_t *ref = json_loads(text, 0, NULL);
    assert_non_null(ref);
    twice t = {0, 0};
    for (size_t n = 1; n < 200 && !t.n; n++) {
        arm(n, 0);
        json_t *v = json_loads(text, 0, NULL);
        size_t made = disarm();
        if (v && !json_equal(v, ref))
            t = (twice){n, made};
        json_decref(v);
        if (made < n)
            break;
    }
    json_decref(ref);
    if (!t.n)
        fail_msg("no allocation makes jansson drop a byte of %s", text);
    return t;
}

static const char VALUE[] = "{\"home_address_for_mail\":\"x\"}";

/* The premise: two loads failed alike agree on the wrong tree. */
static void test_premise(void **state)
{
    (void)state;
    counter(false);
    twice t = find_twice(VALUE);
    arm(t.n, t.p + t.n);
    json_t *a = json_loads(VALUE, 0, NULL);
    json_t *b = json_loads(VALUE, 0, NULL);
    disarm();
    assert_non_null(a);
    assert_non_null(b);
    assert_true(json_equal(a, b));
    assert_null(json_object_get(a, "home_address_for_mail"));
    json_decref(a);
    json_decref(b);
}

/* gpe_js_load: alone, the engine takes the wrong tree; with the counter,
 * out of memory. */
static void test_load(void **state)
{
    (void)state;
    twice t = find_twice(VALUE);
    json_error_t je;
    json_t *v = NULL;

    counter(false);
    arm(t.n, t.p + t.n);
    gpe_status st = gpe_js_load(VALUE, strlen(VALUE), 0, &v, &je);
    disarm();
    assert_int_equal(st, GPE_OK);
    assert_null(json_object_get(v, "home_address_for_mail"));
    json_decref(v);

    counter(true);
    arm(t.n, t.p + t.n);
    st = gpe_js_load(VALUE, strlen(VALUE), 0, &v, &je);
    disarm();
    counter(false);
    assert_int_equal(st, GPE_ERR_NOMEM);
    assert_null(v);
    assert_string_equal(je.text, "out of memory");
    assert_int_equal(json_error_code(&je), json_error_out_of_memory);

    /* and with memory to spare, the counter changes nothing */
    counter(true);
    st = gpe_js_load(VALUE, strlen(VALUE), 0, &v, &je);
    assert_int_equal(st, GPE_OK);
    assert_non_null(json_object_get(v, "home_address_for_mail"));
    json_decref(v);
    st = gpe_js_load("{\"a\":", 5, 0, &v, &je);
    counter(false);
    assert_int_equal(st, GPE_ERR_ARG);
    assert_null(v);
}

/* The schema compiler's load (gpe_jschema_compile_text): alone it
 * compiles a property the schema does not have; with the counter, out of
 * memory (the server's 500, not a schema silently changed). */
static void test_compile_text(void **state)
{
    (void)state;
    static const char schema[] = "{\"type\":\"object\",\"properties\":{"
                                 "\"home_address_for_mail\":{\"type\":\"string\"}}}";
    twice t = find_twice(schema);
    char err[256] = "";
    gpe_status st = GPE_OK;

    counter(false);
    arm(t.n, t.p + t.n);
    gpe_jschema *p = gpe_jschema_compile_text(schema, err, sizeof err, &st);
    disarm();
    assert_non_null(p);
    const gpe_js_node *root = gpe_jschema_node(p, p->root);
    assert_int_equal(root->n_props, 1);
    assert_string_not_equal(root->props[0].key, "\"home_address_for_mail\":");
    gpe_jschema_free(p);

    counter(true);
    arm(t.n, t.p + t.n);
    p = gpe_jschema_compile_text(schema, err, sizeof err, &st);
    disarm();
    counter(false);
    assert_null(p);
    assert_int_equal(st, GPE_ERR_NOMEM);
    assert_string_equal(err, "out of memory");
}

/* The validator's load of a value (gpe_jv_check_text): alone, a verdict
 * on another value (the required property "missing"); with the counter,
 * GPE_JV_NOMEM. */
static void test_check_text(void **state)
{
    (void)state;
    json_t *schema = json_loads("{\"type\":\"object\",\"required\":[\"home_address_for_mail\"]}",
                                0, NULL);
    assert_non_null(schema);
    char err[256], msg[256];
    gpe_jv *v = gpe_jv_new(schema, err, sizeof err);
    json_decref(schema);
    assert_non_null(v);
    assert_int_equal(gpe_jv_check_text(v, VALUE, strlen(VALUE), msg, sizeof msg), GPE_JV_VALID);
    twice t = find_twice(VALUE);

    counter(false);
    arm(t.n, t.p + t.n);
    gpe_jv_result r = gpe_jv_check_text(v, VALUE, strlen(VALUE), msg, sizeof msg);
    disarm();
    assert_int_equal(r, GPE_JV_INVALID);

    counter(true);
    arm(t.n, t.p + t.n);
    r = gpe_jv_check_text(v, VALUE, strlen(VALUE), msg, sizeof msg);
    disarm();
    counter(false);
    assert_int_equal(r, GPE_JV_NOMEM);
    assert_string_equal(msg, "out of memory");
    gpe_jv_free(v);
}

/* gpe_js_dumps: where json_dumps leaves a key out and succeeds, NULL,
 * with the counter and without (the text read back). Every other N: the
 * exact text or NULL. */
static void test_dump(void **state)
{
    (void)state;
    json_t *v = json_loads("{\"home_address_for_mail\":{\"zip_code_of_the_street\":1}}", 0,
                           NULL);
    assert_non_null(v);
    char *want = json_dumps(v, JSON_COMPACT);
    assert_non_null(want);
    int lost = 0;
    for (int on = 0; on <= 1; on++) {
        counter(on);
        size_t n;
        for (n = 1;; n++) {
            arm(n, 0);
            char *plain = json_dumps(v, JSON_COMPACT);
            disarm();
            arm(n, 0);
            char *s = gpe_js_dumps(v, JSON_COMPACT);
            size_t made = disarm();
            if (plain && strcmp(plain, want) != 0) {
                lost++;   /* jansson lost a key: the engine must not */
                if (s)
                    print_message("counter %d, malloc %zu: \"%s\" believed\n", on, n, s);
                assert_null(s);
            }
            if (s)
                assert_string_equal(s, want);
            free(plain);
            free(s);
            if (made < n)
                break;
        }
    }
    counter(false);
    assert_true(lost > 0);   /* the sweep met jansson's lost key */
    free(want);
    json_decref(v);
}

/* ---------------------------------------------- the host's loader */

/* The text that kills jansson 2.14's json_loadb where its 13th allocation
 * fails (a string token's closing quote lost: reads and writes past its
 * buffer). */
static const char CRASH[] =
    "{\"input_tokens\":1234,\"x_pool_meta\":{\"estimated\":false,\"model\":\"an-inner-model\"}}";

static void loader(bool on)
{
    gp_json_init();
    gpe_set_json_loader(on ? gp_json_load_checked : NULL);
}

/* gpe_js_load of text with flags for N = 1, 2, ...: the exact value of the
 * unhurt load or out of memory, never another value nor a refusal of
 * valid text. Returns the runs swept. */
static size_t sweep_js_load(const char *text, size_t flags)
{
    json_error_t je;
    json_t *ref = NULL;
    assert_int_equal(gpe_js_load(text, strlen(text), flags, &ref, &je), GPE_OK);
    size_t n;
    for (n = 1;; n++) {
        json_t *v = NULL;
        memset(&je, 0, sizeof je);
        arm(n, 0);
        gpe_status st = gpe_js_load(text, strlen(text), flags, &v, &je);
        size_t made = disarm();
        if (st == GPE_OK) {
            assert_true(json_equal(v, ref));
            char *a = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            char *b = json_dumps(ref, JSON_COMPACT | JSON_ENCODE_ANY);
            assert_string_equal(a, b);
            free(a);
            free(b);
        } else {
            if (st != GPE_ERR_NOMEM)
                fail_msg("malloc %zu failed: status %d, \"%s\"", n, (int)st, je.text);
            assert_null(v);
            assert_string_equal(je.text, "out of memory");
            assert_int_equal(json_error_code(&je), json_error_out_of_memory);
        }
        json_decref(v);
        if (made < n)
            break;
    }
    json_decref(ref);
    return n - 1;
}

/* What the engine does without the loader, in a child: the sweep of the
 * crash text through gpe_js_load (jansson's loader, judged by the
 * counter) can end the process (jansson 2.14). With the loader, the same
 * sweep in a child ends cleanly. */
static int sweep_in_child(bool with_loader)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the signal's own death, not cmocka's handler going on with the
         * next test in the child */
        static const int sigs[] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        counter(true);
        loader(with_loader);
        for (size_t n = 1; n < 400; n++) {
            json_t *v = NULL;
            json_error_t je;
            arm(n, 0);
            gpe_js_load(CRASH, strlen(CRASH), JSON_DECODE_ANY, &v, &je);
            size_t made = disarm();
            json_decref(v);
            if (made < n)
                break;
        }
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

static void test_jansson_crashes_the_engine(void **state)
{
    (void)state;
    int st = sweep_in_child(true);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    st = sweep_in_child(false);
    /* Printed, not asserted: jansson writes past its token buffer, and
     * whether that kills the process depends on the heap's layout, which
     * address-space randomisation changes from run to run (the child
     * exited cleanly in about one run in two here). What is asserted is
     * the loader's side: the same sweep always ends cleanly. */
    print_message("without the loader the child %s %d\n",
                  WIFSIGNALED(st) ? "was killed by signal" : "exited",
                  WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* gpe_js_load with the loader: every N-th malloc failing gives the exact
 * value or out of memory, over the crash text, the text jansson got wrong
 * twice alike, escapes, and the flags the engine passes. */
static void test_loader_sweep(void **state)
{
    (void)state;
    counter(true);
    loader(true);
    size_t runs = sweep_js_load(CRASH, 0);
    assert_true(runs > 10);
    sweep_js_load(VALUE, 0);
    sweep_js_load("{\"home_address_for_mail\":\"tab\\there, \\u00e9\\ud83d\\ude00, a long "
                  "string past sixty-four bytes of jansson's token buffer\"}",
                  JSON_DECODE_ANY | JSON_ALLOW_NUL);
    sweep_js_load("[12345678901234567890123,\"\\u0000 in a value\",-0]",
                  JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL);
    /* and the counter alone is not what keeps it right: off, the same */
    counter(false);
    sweep_js_load(CRASH, 0);
    sweep_js_load(VALUE, JSON_DECODE_ANY);
    loader(false);
}

/* With the loader, its refusals are the engine's GPE_ERR_ARG in the
 * loader's words, its values are jansson's (the flags pass through: an
 * integer past 64 bits refused, then read as a real by the validator),
 * and the wrong tree of test_load is out of memory even with no counter. */
static void test_loader_answers(void **state)
{
    (void)state;
    loader(true);
    json_error_t je;
    json_t *v = NULL;
    assert_int_equal(gpe_js_load("{\"a\":1 \"b\":2}", 13, 0, &v, &je), GPE_ERR_ARG);
    assert_null(v);
    assert_int_equal(json_error_code(&je), json_error_invalid_syntax);
    assert_non_null(strstr(je.text, "expected ',' or '}' after an object member"));
    assert_int_equal(gpe_js_load("[18446744073709551616]", 22, 0, &v, &je), GPE_ERR_ARG);
    assert_int_equal(json_error_code(&je), json_error_numeric_overflow);
    assert_int_equal(gpe_js_load("[18446744073709551616]", 22, JSON_DECODE_INT_AS_REAL, &v, &je),
                     GPE_OK);
    assert_true(json_is_real(json_array_get(v, 0)));
    json_decref(v);
    assert_int_equal(gpe_js_load("\"\\u0000\"", 8, JSON_DECODE_ANY | JSON_ALLOW_NUL, &v, &je),
                     GPE_OK);
    assert_int_equal(json_string_length(v), 1);
    json_decref(v);

    /* a value checked against a schema: an integer past 64 bits and a
     * NUL in a string, as without the loader */
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\","
                                "\"minimum\":1e19},\"s\":{\"type\":\"string\",\"maxLength\":3}}}",
                                0, NULL);
    assert_non_null(schema);
    char err[256], msg[256];
    gpe_jv *jv = gpe_jv_new(schema, err, sizeof err);
    json_decref(schema);
    assert_non_null(jv);
    static const char *const values[] = {"{\"n\":18446744073709551616,\"s\":\"a\\u0000b\"}",
                                         "{\"n\":5,\"s\":\"abc\"}", "{\"s\":\"abcd\"}",
                                         "{\"n\":"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        loader(false);
        gpe_jv_result want = gpe_jv_check_text(jv, values[i], strlen(values[i]), msg, sizeof msg);
        loader(true);
        gpe_jv_result got = gpe_jv_check_text(jv, values[i], strlen(values[i]), msg, sizeof msg);
        if (got != want)
            fail_msg("value %zu: %d with the loader, %d without: %s", i, got, want, msg);
    }
    /* (the first is valid: the validator reads the integer again as a
     * real, by the loader's code for it, not by jansson's words) */
    assert_int_equal(gpe_jv_check_text(jv, values[0], strlen(values[0]), msg, sizeof msg),
                     GPE_JV_VALID);

    /* test_load's failure, the loader alone (no counter): out of memory
     * or the exact value, as the sweep found; here the value itself */
    twice t = find_twice(VALUE);
    loader(true);
    arm(t.n, t.p + t.n);
    gpe_status st = gpe_js_load(VALUE, strlen(VALUE), 0, &v, &je);
    disarm();
    if (st == GPE_OK)
        assert_non_null(json_object_get(v, "home_address_for_mail"));
    else
        assert_int_equal(st, GPE_ERR_NOMEM);
    json_decref(v);
    gpe_jv_free(jv);
    loader(false);
}

/* The schema compiler and the validator with the loader, swept: the
 * compiled schema and the verdict of the unhurt run, or out of memory. */
static void test_loader_callers(void **state)
{
    (void)state;
    static const char schema[] = "{\"type\":\"object\",\"properties\":{"
                                 "\"home_address_for_mail\":{\"type\":\"string\","
                                 "\"description\":\"caf\\u00e9, a description long enough\"}},"
                                 "\"required\":[\"home_address_for_mail\"]}";
    counter(true);
    loader(true);
    char err[256], msg[256];
    for (size_t n = 1;; n++) {
        gpe_status st = GPE_OK;
        arm(n, 0);
        gpe_jschema *p = gpe_jschema_compile_text(schema, err, sizeof err, &st);
        size_t made = disarm();
        if (p) {
            const gpe_js_node *root = gpe_jschema_node(p, p->root);
            assert_int_equal(root->n_props, 1);
            assert_string_equal(root->props[0].key, "\"home_address_for_mail\":");
            gpe_jschema_free(p);
        } else {
            assert_int_equal(st, GPE_ERR_NOMEM);
        }
        if (made < n)
            break;
    }
    json_t *sj = json_loads(schema, 0, NULL);
    gpe_jv *v = gpe_jv_new(sj, err, sizeof err);
    json_decref(sj);
    assert_non_null(v);
    for (size_t n = 1;; n++) {
        arm(n, 0);
        gpe_jv_result r = gpe_jv_check_text(v, CRASH, strlen(CRASH), msg, sizeof msg);
        size_t made = disarm();
        if (r != GPE_JV_NOMEM)
            assert_int_equal(r, GPE_JV_INVALID); /* the required property is missing */
        if (made < n)
            break;
    }
    gpe_jv_free(v);
    counter(false);
    loader(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_premise),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_compile_text),
        cmocka_unit_test(test_check_text),
        cmocka_unit_test(test_dump),
        cmocka_unit_test(test_jansson_crashes_the_engine),
        cmocka_unit_test(test_loader_sweep),
        cmocka_unit_test(test_loader_answers),
        cmocka_unit_test(test_loader_callers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
