/* The schema compiler (src/engine/jschema.c) and its regex compiler
 * (jregex.c) under allocation failure: a compile either yields the very
 * program it yields with memory to spare, or fails with GPE_ERR_NOMEM
 * ("out of memory"); never GPE_ERR_UNSUPPORTED or GPE_ERR_ARG, which the
 * server answers with a 400 blaming the client's valid schema.
 *
 * The N-th allocation fails, for N = 1, 2, 3, ... until a run ends without
 * reaching it; the allocations counted are jansson's (json_set_alloc_funcs)
 * and the compilers' own malloc, calloc, realloc, strdup and strndup (the
 * linker's --wrap: part-46-jschema-oom.cmake), through the server sweeps'
 * failing allocator (tests/unit/server/fixture_oom.h), with strdup and
 * strndup added here (libc's copies allocate inside libc, where --wrap of
 * malloc does not reach). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include <gpupool/engine.h>

#include "common/gp_json.h"
#include "engine/jregex.h"
#include "engine/jschema.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#define GPS_FIXTURE_OOM_STRNDUP
#include "../server/fixture_oom.h"

/* Every feature that allocates: objects and required, enum with a type
 * (json_pack; values of other types dropped), const, anyOf of different types, a discriminated union
 * (tag_union's strdup), arrays with min/maxItems, a pattern and a format
 * (jregex), $defs/$ref used twice (the memo), additionalProperties as a
 * schema, and keys longer than jansson's first 16-byte token buffer. */
static const char RICH[] =
    "{\"type\":\"object\",\"$defs\":{\"address\":{\"type\":\"object\",\"properties\":{"
    "\"street\":{\"type\":\"string\",\"maxLength\":40},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}(-[0-9]{4})?$\"}},"
    "\"required\":[\"street\",\"zip\"],\"additionalProperties\":false}},"
    "\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1},"
    "\"created_at\":{\"type\":\"string\",\"format\":\"date-time\"},"
    "\"kind\":{\"type\":\"string\",\"enum\":[\"alpha\",\"beta\",1,\"gamma\",null,\"beta\"]},"
    "\"version\":{\"const\":3},"
    "\"level\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":10},"
    "\"score\":{\"type\":[\"number\",\"null\"]},"
    "\"value\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"null\"},"
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":8},"
    "\"minItems\":1,\"maxItems\":3},"
    "\"home_address_for_mail\":{\"$ref\":\"#/$defs/address\"},"
    "\"work\":{\"$ref\":\"#/$defs/address\"},"
    "\"shape\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},"
    "\"r\":{\"type\":\"number\"}},\"required\":[\"kind\",\"r\"]},"
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"square\"},"
    "\"side\":{\"type\":\"number\"}},\"required\":[\"kind\",\"side\"]},{\"type\":\"null\"}]},"
    "\"counts\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}},"
    "\"required\":[\"name\",\"created_at\",\"kind\",\"tags\",\"shape\"],"
    "\"additionalProperties\":false}";

/* Values written into the program by json_dumps (enum and const literals):
 * objects whose keys outgrow the dump's first buffers, which jansson 2.14
 * leaves out of the text, succeeding, when the buffer cannot grow for the
 * key (a literal the schema does not have: the checked dump, jcheck.h). */
static const char LITS[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"mode\":{\"enum\":[{\"home_address_for_mail\":\"x\",\"zip_code_of_the_street\":1},"
    "\"plain\",[{\"another_long_key_name_here\":null}]]},"
    "\"fixed\":{\"const\":{\"a_long_property_name_here\":{\"and_a_nested_one_as_long\":true}}},"
    "\"a_property_with_a_long_name\":{\"type\":\"integer\"}},"
    "\"required\":[\"mode\",\"fixed\"]}";

/* The two ways the engine learns of jansson's failed allocations
 * (engine.h gpe_set_json_alloc_failures): alone (no counter: jansson's
 * allocator is the fixture's failing one, arm_libc), and by the host's
 * counter (gp_json's, as the agent registers it: libc fails beneath it,
 * arm_beneath). The sweeps run both. */
static bool counted;

static void use_counter(bool on)
{
    counted = on;
    gp_json_init();
    gpe_set_json_alloc_failures(on ? gp_json_alloc_failures : NULL);
}

static void arm_mode(size_t n)
{
    if (counted)
        arm_beneath(n);
    else
        arm_libc(n);
}

/* ------------------------------------------------- programs compared */

static bool re_equal(const gpe_jre *a, const gpe_jre *b)
{
    if (!a || !b)
        return a == b;
    return a->n == b->n && a->nullable == b->nullable && a->first == b->first &&
           a->last == b->last && a->start_dist == b->start_dist &&
           !memcmp(a->follow, b->follow, sizeof a->follow) &&
           !memcmp(a->cls, b->cls, sizeof a->cls) &&
           !memcmp(a->by_byte, b->by_byte, sizeof a->by_byte) &&
           !memcmp(a->dist, b->dist, sizeof a->dist);
}

static bool ints_equal(const int *a, const int *b, int n)
{
    if (!a || !b)
        return a == b;
    return !memcmp(a, b, (size_t)n * sizeof *a);
}

static bool i64s_equal(const int64_t *a, const int64_t *b, int n)
{
    if (!a || !b)
        return a == b;
    return !memcmp(a, b, (size_t)n * sizeof *a);
}

static bool node_equal(const gpe_js_node *a, const gpe_js_node *b)
{
    if (a->kind != b->kind || a->min_len != b->min_len || memcmp(a->first, b->first, 32) ||
        a->n_props != b->n_props || a->extra != b->extra || a->items != b->items ||
        a->min_items != b->min_items || a->max_items != b->max_items ||
        a->min_chars != b->min_chars || a->max_chars != b->max_chars || a->lo != b->lo ||
        a->hi != b->hi || a->lo_x != b->lo_x || a->hi_x != b->hi_x ||
        a->allow_frac != b->allow_frac || a->n_lits != b->n_lits || a->n_alts != b->n_alts ||
        a->target != b->target || !re_equal(a->re, b->re))
        return false;
    for (int i = 0; i < a->n_props; i++)
        if (strcmp(a->props[i].key, b->props[i].key) || a->props[i].node != b->props[i].node ||
            a->props[i].required != b->props[i].required)
            return false;
    if (a->kind == GPE_JS_OBJECT && !i64s_equal(a->tail, b->tail, a->n_props + 1))
        return false;
    if (!ints_equal(a->tag_alt, b->tag_alt, a->n_lits ? a->n_lits : 1) && (a->tag_alt || b->tag_alt))
        return false;
    for (int i = 0; i < a->n_lits; i++)
        if (strcmp(a->lits[i], b->lits[i]) || a->lit_len[i] != b->lit_len[i])
            return false;
    if ((a->lit_extra || b->lit_extra) && !i64s_equal(a->lit_extra, b->lit_extra, a->n_lits))
        return false;
    return ints_equal(a->alts, b->alts, a->n_alts);
}

static bool prog_equal(const gpe_jschema *a, const gpe_jschema *b)
{
    if (a->n_nodes != b->n_nodes || a->root != b->root)
        return false;
    for (int i = 0; i < a->n_nodes; i++)
        if (!node_equal(&a->nodes[i], &b->nodes[i]))
            return false;
    return true;
}

/* ------------------------------------------------------------ sweeps */

typedef gpe_jschema *(*compile_fn)(const void *arg, char *err, size_t errlen, gpe_status *st);

static gpe_jschema *by_tree(const void *arg, char *err, size_t errlen, gpe_status *st)
{
    return gpe_jschema_compile_status(arg, err, errlen, st);
}

static gpe_jschema *by_text(const void *arg, char *err, size_t errlen, gpe_status *st)
{
    return gpe_jschema_compile_text(arg, err, errlen, st);
}

/* One failed run: false (printed) unless it is out of memory, said so. */
static bool oom_ok(const char *what, size_t n, bool hit, gpe_status st, const char *err)
{
    if (hit && st == GPE_ERR_NOMEM && !strcmp(err, "out of memory"))
        return true;
    print_message("%s: allocation %zu %s: status %d (want GPE_ERR_NOMEM %d), \"%s\"\n", what,
                  n, hit ? "failed" : "did not fail", (int)st, (int)GPE_ERR_NOMEM, err);
    return false;
}

/* Runs compile on arg for N = 1, 2, ...; the number of runs that broke
 * the rule (each printed). */
static int sweep(const char *what, compile_fn compile, const void *arg)
{
    char err[256];
    gpe_status st;
    gpe_jschema *ref = compile(arg, err, sizeof err, &st);
    if (!ref)
        fail_msg("%s: the unhurt compile failed: %s", what, err);
    int bad = 0;
    size_t n;
    for (n = 1;; n++) {
        err[0] = '\0';
        st = GPE_OK;
        arm_mode(n);
        gpe_jschema *p = compile(arg, err, sizeof err, &st);
        bool hit = disarm();
        if (p) {
            if (st != GPE_OK || !prog_equal(p, ref)) {
                print_message("%s: allocation %zu failed, the compile succeeded with "
                              "another program (status %d)\n", what, n, (int)st);
                bad++;
            }
            gpe_jschema_free(p);
        } else {
            bad += !oom_ok(what, n, hit, st, err);
        }
        if (!hit)
            break;
    }
    print_message("%s%s: %zu allocations swept, %d broke the rule\n", what,
                  counted ? " (counter)" : "", n - 1, bad);
    gpe_jschema_free(ref);
    return bad;
}

/* sweep alone and with the counter. */
static int sweep_both(const char *what, compile_fn compile, const void *arg)
{
    int bad = 0;
    for (int on = 0; on <= 1; on++) {
        use_counter(on);
        bad += sweep(what, compile, arg);
    }
    use_counter(false);
    return bad;
}

static void test_compile_tree(void **state)
{
    (void)state;
    json_t *schema = J(RICH);
    int bad = sweep_both("compile (tree)", by_tree, schema);
    json_decref(schema);
    assert_int_equal(bad, 0);
}

/* Literals dumped from the tree: a dump that lost a key is out of memory,
 * never another literal. */
static void test_compile_literals(void **state)
{
    (void)state;
    json_t *schema = J(LITS);
    int bad = sweep_both("literals (tree)", by_tree, schema);
    json_decref(schema);
    bad += sweep_both("literals (text)", by_text, LITS);
    assert_int_equal(bad, 0);
}

/* The text too: jansson's load under failure, then the compile. */
static void test_compile_text(void **state)
{
    (void)state;
    assert_int_equal(sweep_both("compile (text)", by_text, RICH), 0);
    assert_int_equal(sweep_both("compile (json_object mode)", by_text, ""), 0);
}

/* gpe_schema_check, what the server calls: only its status to judge. */
static void test_schema_check(void **state)
{
    (void)state;
    char err[256];
    int bad = 0;
    for (int on = 0; on <= 1; on++) {
        use_counter(on);
        size_t n;
        for (n = 1;; n++) {
            err[0] = '\0';
            arm_mode(n);
            gpe_status st = gpe_schema_check(RICH, err, sizeof err);
            bool hit = disarm();
            if (st != GPE_OK)
                bad += !oom_ok("gpe_schema_check", n, hit, st, err);
            if (!hit)
                break;
        }
        print_message("gpe_schema_check%s: %zu allocations swept, %d broke the rule\n",
                      on ? " (counter)" : "", n - 1, bad);
    }
    use_counter(false);
    assert_int_equal(bad, 0);
    /* and the refusals keep their statuses */
    assert_int_equal(gpe_schema_check("{nope", err, sizeof err), GPE_ERR_ARG);
    assert_int_equal(gpe_schema_check("{\"type\":\"string\",\"pattern\":\"(?=x)\"}", err,
                                      sizeof err),
                     GPE_ERR_UNSUPPORTED);
}

/* The regex compiler alone, both dialects. */
static void test_jre(void **state)
{
    (void)state;
    const char *pats[] = {gpe_jre_format_pattern("date-time"), "a[b-d]+(x|yz){2,3}", "\\d\\w."};
    int bad = 0;
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
        for (int full = 0; full <= 1; full++) {
            char err[256];
            gpe_status st;
            gpe_jre *ref = gpe_jre_compile_status(pats[i], full, err, sizeof err, &st);
            assert_non_null(ref);
            assert_int_equal(st, GPE_OK);
            size_t n;
            for (n = 1;; n++) {
                err[0] = '\0';
                st = GPE_OK;
                arm_libc(n);
                gpe_jre *r = gpe_jre_compile_status(pats[i], full, err, sizeof err, &st);
                bool hit = disarm();
                if (r && (st != GPE_OK || !re_equal(r, ref))) {
                    print_message("jre %s: allocation %zu failed, another automaton\n",
                                  pats[i], n);
                    bad++;
                } else if (!r) {
                    bad += !oom_ok(pats[i], n, hit, st, err);
                }
                gpe_jre_free(r);
                if (!hit)
                    break;
            }
            gpe_jre_free(ref);
        }
    assert_int_equal(bad, 0);
    /* a refusal is no out of memory */
    char err[256];
    gpe_status st = GPE_OK;
    assert_null(gpe_jre_compile_status("a\\b", false, err, sizeof err, &st));
    assert_int_equal(st, GPE_ERR_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_tree),
        cmocka_unit_test(test_compile_literals),
        cmocka_unit_test(test_compile_text),
        cmocka_unit_test(test_schema_check),
        cmocka_unit_test(test_jre),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
