/*
 * The sampler and the stop-string matcher (src/engine/sampler.c) when
 * memory runs out: they give what they give with memory to spare, or say
 * so; never a quietly different result.
 *
 * test_stop_sweep: a stream through gpe_stop_feed_status /
 * gpe_stop_flush_status either comes out as it does without failure (the
 * same text, the same stop string matched), or says GPE_ERR_NOMEM after a
 * beginning of that text, emitting nothing with the failure nor after it
 * (a caller that goes on feeding gets GPE_ERR_NOMEM again, and its flush
 * too): never the text with a piece left out (the matcher's hold-back
 * buffer grows past its first 64 bytes for a long stop string the text
 * almost writes, for a long piece, for a primed continuation).
 *
 * test_history_sweep: a sampler whose penalties count the accepted tokens
 * samples what it samples without failure, or says -1; never a token
 * picked over a history with a token left out (the frequency penalty
 * makes the count of one token decide the pick).
 *
 * The N-th allocation fails, for N = 1, 2, ... until a run ends without
 * reaching it: libc's malloc, calloc and realloc (tests/unit/server/
 * fixture_oom.h arm_libc, through the linker's --wrap:
 * part-31-sampler-oom.cmake).
 */
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

/* ------------------------------------------------------ stop strings */

/* A stop string of 87 bytes; the first case's text writes its first 72,
 * then turns away. */
#define LONG_STOP                                                                             \
    "<end of the story, written out at a length no model's piece would ever reach in one go>"

typedef struct stop_case {
    const char *name;
    const char *stops[2];
    size_t n_stops;
    const char *prime;          /* primed before the first piece (NULL: none) */
    const char *text;           /* fed in pieces of step bytes */
    size_t step;
} stop_case;

static const stop_case STOP_CASES[] = {
    /* held back until the text turns away from the stop string: the
     * buffer grows to 128 bytes, then the rest goes out */
    {"long prefix held", {LONG_STOP, "\n\n"}, 2, NULL,
     "Once upon a time " "<end of the story, written out at a length no model's piece would "
     "ever r" "... and then it went on, for a while.", 7},
    /* the same text with the stop string whole in it: a match after growth */
    {"long stop matched", {"\n\n", LONG_STOP}, 2, NULL,
     "Once upon a time " LONG_STOP " never seen", 11},
    /* no stop strings: a piece longer than the first buffer */
    {"long piece", {NULL, NULL}, 0, NULL,
     "A piece of two hundred bytes and more, as a byte-fallback run or a long word "
     "might give it: the matcher holds nothing back, but it copies the piece into its "
     "buffer all the same, and that buffer starts at sixty-four bytes.", 0},
    /* a continuation: the matcher primed with 70 bytes it had held, a
     * half UTF-8 character at the end, then the rest */
    {"primed", {LONG_STOP, "END"}, 2,
     "<end of the story, written out at a length no model's piece would \xe2\x82",
     "\xac and the euro came whole. THE END. not this", 5},
};
#define N_STOP_CASES (sizeof STOP_CASES / sizeof STOP_CASES[0])

typedef struct stop_run {
    bool init_failed;           /* gpe_stop_init NULL (the caller's out of memory) */
    bool failed;                /* a call said GPE_ERR_NOMEM */
    bool broke;                 /* a call after it emitted, or said GPE_OK */
    bool stopped;
    int which;
    char out[1024];
    size_t n_out;
} stop_run;

static void out_add(stop_run *r, const char *s, size_t n)
{
    assert_true(r->n_out + n < sizeof r->out);
    memcpy(r->out + r->n_out, s, n);
    r->n_out += n;
    r->out[r->n_out] = '\0';
}

/* One feed or flush's result into r: emitted text goes out while nothing
 * failed; after a failure every call must say so again, emitting nothing. */
static void take(stop_run *r, gpe_status st, const char *emit, size_t n)
{
    if (r->failed) {
        r->broke |= st != GPE_ERR_NOMEM || n != 0;
        return;
    }
    if (st == GPE_ERR_NOMEM) {
        r->failed = true;
        r->broke |= n != 0;
        return;
    }
    assert_int_equal(st, GPE_OK);
    out_add(r, emit, n);
}

static void run_stop(const stop_case *c, stop_run *r)
{
    memset(r, 0, sizeof *r);
    r->which = -1;
    gpe_stop *st = gpe_stop_init(c->stops, c->n_stops);
    if (!st) {
        r->init_failed = true;
        return;
    }
    if (c->prime && gpe_stop_prime(st, c->prime, strlen(c->prime)) != 0) {
        r->failed = true;   /* the caller's out of memory: nothing fed */
        gpe_stop_free(st);
        return;
    }
    size_t len = strlen(c->text);
    /* A careless caller: it goes on feeding after a failure (the checks
     * are that nothing comes out of it any more). */
    for (size_t at = 0; at < len && !r->stopped;) {
        size_t n = c->step && len - at > c->step ? c->step : len - at;
        const char *emit = "sentinel";
        size_t elen = 12345;
        gpe_status s = GPE_ERR_BACKEND;
        bool m = gpe_stop_feed_status(st, c->text + at, n, &emit, &elen, &s);
        take(r, s, emit, elen);
        if (m && !r->failed) {
            r->stopped = true;
            r->which = gpe_stop_which(st);
        }
        at += n;
    }
    const char *emit = "sentinel";
    size_t elen = 12345;
    gpe_status s = GPE_ERR_BACKEND;
    gpe_stop_flush_status(st, &emit, &elen, &s);
    take(r, s, emit, elen);
    gpe_stop_free(st);
}

static void test_stop_sweep(void **state)
{
    (void)state;
    int bad = 0;
    for (size_t c = 0; c < N_STOP_CASES; c++) {
        stop_run ref, got;
        run_stop(&STOP_CASES[c], &ref);
        assert_false(ref.failed || ref.init_failed || ref.broke);
        size_t n;
        int bad_here = 0, n_nomem = 0;
        for (n = 1;; n++) {
            arm_libc(n);
            run_stop(&STOP_CASES[c], &got);
            bool hit = disarm();
            const char *why = NULL;
            if (got.broke)
                why = "a call after GPE_ERR_NOMEM emitted text or said GPE_OK";
            else if ((got.failed || got.init_failed) && !hit)
                why = "out of memory without a failed allocation";
            else if (got.failed && (got.n_out > ref.n_out ||
                                    memcmp(got.out, ref.out, got.n_out) != 0))
                why = "the text before GPE_ERR_NOMEM is not the reference's";
            else if (!got.failed && !got.init_failed &&
                     (got.n_out != ref.n_out || memcmp(got.out, ref.out, ref.n_out) != 0 ||
                      got.stopped != ref.stopped || got.which != ref.which))
                why = "another text without GPE_ERR_NOMEM";
            if (why) {
                print_message("%s: allocation %zu (%s): %s: \"%s\" (want \"%s\")\n",
                              STOP_CASES[c].name, n, hit ? "failed" : "not reached", why,
                              got.out, ref.out);
                bad_here++;
            }
            n_nomem += got.failed || got.init_failed;
            if (!hit)
                break;
        }
        print_message("%s: %zu runs, %d out of memory, %d broke the rule\n", STOP_CASES[c].name,
                      n, n_nomem, bad_here);
        /* the failures must reach the buffer's growth, not init alone */
        assert_true(n_nomem >= 2);
        bad += bad_here;
    }
    assert_int_equal(bad, 0);
}

/* The plain forms keep their contract (source compatibility) and, out of
 * memory, emit nothing more rather than text with a hole. */
static void test_stop_plain_forms(void **state)
{
    (void)state;
    const stop_case *c = &STOP_CASES[0];
    gpe_stop *st = gpe_stop_init(c->stops, c->n_stops);
    assert_non_null(st);
    const char *emit;
    size_t n;
    assert_false(gpe_stop_feed(st, "Once upon ", 10, &emit, &n));
    assert_int_equal(n, 10);
    arm_libc(1);
    assert_false(gpe_stop_feed(st, LONG_STOP, sizeof LONG_STOP - 2, &emit, &n));
    assert_true(disarm());
    assert_int_equal(n, 0);
    assert_false(gpe_stop_feed(st, "x", 1, &emit, &n));
    assert_int_equal(n, 0);
    gpe_stop_flush(st, &emit, &n);
    assert_int_equal(n, 0);
    assert_int_equal(gpe_stop_which(st), -1);
    assert_int_equal(gpe_stop_prime(st, "x", 1), -1);
    gpe_stop_free(st);
}

/* ----------------------------------------------------------- history */

#define HV 16
#define HN 600               /* accepted tokens: the history grows twice (256, 512) */

/* Token 3 at the places where the history grows (the accepts at 0, 256,
 * 512), 7 elsewhere: one accept lost to memory changes the count of 3. */
static int32_t hist_token(int i)
{
    return i == 0 || i == 256 || i == 512 ? 3 : 7;
}

/* Greedy with a frequency penalty of 0.5 over every accepted token: 3's
 * logit 5 - 0.5 * count is 3.5 with its three, under 12's 3.75; with two
 * it would be 4 and win. */
static const gpe_sampler_params HIST_PARAMS = {
    .temperature = 0,
    .repeat_penalty = 1.0f,
    .repeat_last_n = -1,
    .frequency_penalty = 0.5f,
};

static void hist_logits(float *l)
{
    for (int i = 0; i < HV; i++)
        l[i] = 0;
    l[3] = 5.0f;
    l[12] = 3.75f;
}

/* The sampled token, -1 (out of memory), or -2 (init failed); *again: a
 * second sample, the failure disarmed (the history a failed accept left). */
static int32_t run_hist(const gpe_sampler_params *p, bool armed, size_t n, bool *hit,
                        int32_t *again)
{
    float l[HV];
    hist_logits(l);
    if (armed)
        arm_libc(n);
    gpe_sampler *s = gpe_sampler_init(p);
    int32_t t = -2;
    if (s) {
        for (int i = 0; i < HN; i++)
            gpe_sampler_accept(s, hist_token(i));
        t = gpe_sampler_sample(s, l, HV);
    }
    *hit = armed ? disarm() : false;
    *again = s ? gpe_sampler_sample(s, l, HV) : -2;
    gpe_sampler_free(s);
    return t;
}

static void test_history_sweep(void **state)
{
    (void)state;
    bool hit;
    int32_t again;
    assert_int_equal(run_hist(&HIST_PARAMS, false, 0, &hit, &again), 12);
    assert_int_equal(again, 12);
    int bad = 0, n_nomem = 0;
    size_t n;
    for (n = 1;; n++) {
        int32_t t = run_hist(&HIST_PARAMS, true, n, &hit, &again);
        bool ok = t == 12 || (hit && (t == -1 || t == -2));
        /* once out of memory, never another token: the same, or -1 */
        ok = ok && (again == 12 || again == -1 || again == -2);
        if (!ok) {
            print_message("history: allocation %zu (%s): sampled %d, then %d (want 12 or -1)\n",
                          n, hit ? "failed" : "not reached", (int)t, (int)again);
            bad++;
        }
        n_nomem += t < 0;
        if (!hit)
            break;
    }
    print_message("history: %zu runs, %d out of memory, %d broke the rule\n", n, n_nomem, bad);
    assert_int_equal(bad, 0);
    /* the history's growths were reached (init, scratch, 3 growths) */
    assert_true(n >= 5);

    /* reset: a sampler that lost a token samples again from a new start */
    gpe_sampler *s = gpe_sampler_init(&HIST_PARAMS);
    assert_non_null(s);
    float l[HV];
    hist_logits(l);
    arm_libc(1);
    gpe_sampler_accept(s, 3);
    assert_true(disarm());
    assert_int_equal(gpe_sampler_sample(s, l, HV), -1);
    gpe_sampler_reset(s);
    assert_int_equal(gpe_sampler_sample(s, l, HV), 3);
    gpe_sampler_free(s);

    /* without penalties the history is not kept: accepting needs no memory */
    gpe_sampler_params off = gpe_sampler_default_params();
    s = gpe_sampler_init(&off);
    assert_non_null(s);
    arm_libc(1);
    for (int i = 0; i < HN; i++)
        gpe_sampler_accept(s, hist_token(i));
    assert_false(disarm());
    gpe_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_sweep),
        cmocka_unit_test(test_stop_plain_forms),
        cmocka_unit_test(test_history_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
