/* gpupool-run (src/run) with a token longer than its old fixed buffers:
 * generate rendered each sampled token into a char piece[256], tokenize
 * into a char piece[512]; a longer token (a GGUF may hold any length; real
 * vocabularies have long whitespace runs) came back as -(needed) and was
 * written as "": its text vanished from the output. The real binary is run
 * on stories260K with tokens rewritten long (its GGUF's tokenizer.ggml.
 * tokens, fixture_gguf.h): " little", the greedy story's fifth token,
 * made " little" and 300 or 600 '~' (past 256, past 512), and the BOS "<s>" made "<s>" and 600
 * '~'. Then the binary swept: the N-th allocation fails (run_failalloc.c
 * preloaded), and each run is the whole output or a clear "out of memory"
 * with a non-zero exit, its output cut short, never different. */
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

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture_gguf.h"

extern char **environ;

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"
#define PROMPT "Once upon a time"

/* ------------------------------------------------------ the real binary */

typedef struct res {
    int rc;        /* exit status; 128 + the signal that ended it */
    char *out;     /* stdout, NUL-terminated */
    size_t nout;
    char *err;     /* stderr */
    bool hit;      /* the failure asked for was handed out */
} res;

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc(len + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, len, f), len);
    s[len] = '\0';
    fclose(f);
    if (n)
        *n = len;
    return s;
}

static void res_free(res *r)
{
    free(r->out);
    free(r->err);
}

static void tmp_file(char *path)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

/* gpupool-run with args (NULL-terminated); fail_at > 0: its fail_at-th
 * allocation fails (run_failalloc.c). */
static void run_cli(res *r, size_t fail_at, const char *const *args)
{
    char po[] = "/tmp/gpupool-test-runout-XXXXXX", pe[] = "/tmp/gpupool-test-runerr-XXXXXX";
    char ph[] = "/tmp/gpupool-test-runhit-XXXXXX";
    tmp_file(po);
    tmp_file(pe);
    tmp_file(ph);
    const char *argv[16] = {GP_RUN_BIN};
    int na = 1;
    while (args[na - 1]) {
        assert_true(na < 15);
        argv[na] = args[na - 1];
        na++;
    }
    argv[na] = NULL;
    size_t ne = 0;
    while (environ[ne])
        ne++;
    char **envp = calloc(ne + 4, sizeof *envp);
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
            envp[k++] = environ[i];
    char pre[1024], fa[64], hit[128];
#ifdef GP_FAILALLOC
    snprintf(pre, sizeof pre, "LD_PRELOAD=%s", GP_FAILALLOC);
#else
    assert_int_equal(fail_at, 0);
    pre[0] = '\0';
#endif
    snprintf(fa, sizeof fa, "GP_FAIL_ALLOC=%zu", fail_at);
    snprintf(hit, sizeof hit, "GP_FAIL_ALLOC_HIT=%s", ph);
    if (fail_at) {
        envp[k++] = pre;
        envp[k++] = fa;
        envp[k++] = hit;
    }
    envp[k] = NULL;
    posix_spawn_file_actions_t acts;
    assert_int_equal(posix_spawn_file_actions_init(&acts), 0);
    assert_int_equal(posix_spawn_file_actions_addopen(&acts, 1, po, O_WRONLY | O_TRUNC, 0), 0);
    assert_int_equal(posix_spawn_file_actions_addopen(&acts, 2, pe, O_WRONLY | O_TRUNC, 0), 0);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, GP_RUN_BIN, &acts, NULL, (char *const *)argv, envp), 0);
    posix_spawn_file_actions_destroy(&acts);
    free(envp);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r->out = slurp(po, &r->nout);
    r->err = slurp(pe, NULL);
    struct stat sb;
    r->hit = stat(ph, &sb) == 0 && sb.st_size > 0;
    unlink(po);
    unlink(pe);
    unlink(ph);
}

/* The greedy text of PROMPT (10 tokens), plain. */
static void generate_plain(res *r, const char *model, size_t fail_at)
{
    const char *a[] = {"generate", "-m", model, "-p", PROMPT, "-n", "10", "--temp", "0",
                       "-t", "1", NULL};
    run_cli(r, fail_at, a);
}

static void generate_json(res *r, const char *model, size_t fail_at)
{
    const char *a[] = {"generate", "-m", model, "-p", PROMPT, "-n", "10", "--temp", "0",
                       "-t", "1", "--json", NULL};
    run_cli(r, fail_at, a);
}

static void tokenize(res *r, const char *model, size_t fail_at)
{
    const char *a[] = {"tokenize", "-m", model, "-p", PROMPT, NULL};
    run_cli(r, fail_at, a);
}

static char *tildes(size_t n)
{
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, '~', n);
    s[n] = '\0';
    return s;
}

/* ------------------------------------------------------------ the tests */

/* generate, plain and --json: the long token's whole text where the
 * model samples it (before, "": the 300 or 600 '~' missing). */
static void test_generate(void **state)
{
    (void)state;
    res orig;
    generate_plain(&orig, STORIES, 0);
    assert_int_equal(orig.rc, 0);
    const char *l = strstr(orig.out, " little");
    assert_non_null(l);
    assert_null(strstr(l + 1, " little"));
    size_t cut = (size_t)(l - orig.out) + 7;
    static const size_t runs[] = {300, 600};
    for (size_t i = 0; i < 2; i++) {
        char path[] = "/tmp/gpupool-test-runlong-XXXXXX";
        tmp_file(path);
        char *run = tildes(runs[i]);
        char spelled[1024];
        snprintf(spelled, sizeof spelled, "\xE2\x96\x81little%s", run);
        const char *from[] = {"\xE2\x96\x81little"}, *to[] = {spelled};
        int32_t lil;
        fixture_gguf_with_tokens(STORIES, path, from, to, &lil, 1);
        size_t nw = orig.nout + runs[i];
        char *want = malloc(nw + 1);
        assert_non_null(want);
        snprintf(want, nw + 1, "%.*s%s%s", (int)cut, orig.out, run, orig.out + cut);

        res p;
        generate_plain(&p, path, 0);
        assert_int_equal(p.rc, 0);
        if (strcmp(p.out, want) != 0)
            fail_msg("%zu '~': plain \"%s\", want \"%s\"", runs[i], p.out, want);
        res_free(&p);

        /* --json: the token's own object carries it, and the texts add up
         * to the plain text */
        res j;
        generate_json(&j, path, 0);
        assert_int_equal(j.rc, 0);
        char *text = calloc(1, nw + 1);
        assert_non_null(text);
        size_t nt = 0;
        bool seen = false;
        for (char *line = strtok(j.out, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *v = json_loads(line, 0, NULL);
            assert_non_null(v);
            const char *t = json_string_value(json_object_get(v, "text"));
            if (t && !json_object_get(v, "summary")) {
                assert_true(nt + strlen(t) <= nw);
                memcpy(text + nt, t, strlen(t));
                nt += strlen(t);
                if (json_integer_value(json_object_get(v, "id")) == lil) {
                    assert_int_equal(strlen(t), 7 + runs[i]);
                    assert_memory_equal(t, " little", 7);
                    assert_memory_equal(t + 7, run, runs[i]);
                    seen = true;
                }
            }
            json_decref(v);
        }
        assert_true(seen);
        if (nt + 1 != nw || memcmp(text, want, nt) != 0)
            fail_msg("%zu '~': --json texts \"%s\", want \"%s\"", runs[i], text, want);
        free(text);
        res_free(&j);
        free(want);
        free(run);
        unlink(path);
    }
    res_free(&orig);
}

/* tokenize: the BOS "<s>" and 600 '~' listed whole (before, ''), and the
 * text back to the same id (--parse-special --ids: the round trip). */
static void test_tokenize(void **state)
{
    (void)state;
    char path[] = "/tmp/gpupool-test-runbos-XXXXXX";
    tmp_file(path);
    char *run = tildes(600);
    char bos[700];
    snprintf(bos, sizeof bos, "<s>%s", run);
    const char *from[] = {"<s>"}, *to[] = {bos};
    int32_t id;
    fixture_gguf_with_tokens(STORIES, path, from, to, &id, 1);

    res orig, r;
    tokenize(&orig, STORIES, 0);
    tokenize(&r, path, 0);
    assert_int_equal(orig.rc, 0);
    assert_int_equal(r.rc, 0);
    char want[2048];
    const char *rest = strchr(orig.out, '\n');
    assert_non_null(rest);
    snprintf(want, sizeof want, "%6d\t'%s'%s", (int)id, bos, rest);
    if (strcmp(r.out, want) != 0)
        fail_msg("tokenize \"%s\", want \"%s\"", r.out, want);

    char text[800];
    snprintf(text, sizeof text, "%s Once", bos);
    const char *a[] = {"tokenize", "-m", path, "-p", text, "--no-bos", "--parse-special",
                       "--ids", NULL};
    res ids;
    run_cli(&ids, 0, a);
    assert_int_equal(ids.rc, 0);
    char head[32];
    snprintf(head, sizeof head, "[%d, ", (int)id);
    if (strncmp(ids.out, head, strlen(head)) != 0)
        fail_msg("--ids \"%s\", want it to begin \"%s\"", ids.out, head);
    res_free(&ids);
    res_free(&orig);
    res_free(&r);
    free(run);
    unlink(path);
}

#ifdef GP_FAILALLOC
/* The output up to (not with) its last line: --json's summary, whose
 * timings differ run to run. */
static size_t before_last_line(const char *s, size_t n)
{
    if (n && s[n - 1] == '\n')
        n--;
    while (n && s[n - 1] != '\n')
        n--;
    return n;
}

/* One command swept: run k (k-th allocation failing) is the reference's
 * output whole with exit 0, or a clear out of memory with exit 1 and the
 * reference's output cut short (what streamed before). */
static int sweep(const char *what, const char *model, void (*cmd)(res *, const char *, size_t),
                 bool json)
{
    res ref;
    cmd(&ref, model, 0);
    assert_int_equal(ref.rc, 0);
    size_t keep = json ? before_last_line(ref.out, ref.nout) : ref.nout;
    int bad = 0, nomem = 0;
    size_t k;
    for (k = 1;; k++) {
        res r;
        cmd(&r, model, k);
        size_t rk = json && r.rc == 0 ? before_last_line(r.out, r.nout) : r.nout;
        bool whole = r.rc == 0 && rk == keep && memcmp(r.out, ref.out, keep) == 0;
        bool short_nomem = r.rc == 1 && r.nout <= keep && memcmp(r.out, ref.out, r.nout) == 0 &&
                           (strstr(r.err, "out of memory") || strstr(r.err, "cannot allocate"));
        if (short_nomem)
            nomem++;
        if (!whole && !short_nomem) {
            print_error("%s: allocation %zu: exit %d, stdout \"%s\", stderr \"%s\"\n", what, k,
                        r.rc, r.out, r.err);
            bad++;
        }
        bool hit = r.hit;
        res_free(&r);
        if (!hit)
            break;
    }
    print_message("%s: %zu runs, %d out of memory\n", what, k, nomem);
    res_free(&ref);
    return bad;
}

#endif

/* The binary swept on a model with both long tokens: generate's piece
 * and --json's pending text that cannot grow, tokenize's listing, say
 * out of memory and exit 1, never write the output without the token. */
static void test_sweep(void **state)
{
    (void)state;
#ifndef GP_FAILALLOC
    skip();   /* the sanitizers' allocator must come first: no preloaded one */
#else
    char path[] = "/tmp/gpupool-test-runsweep-XXXXXX";
    tmp_file(path);
    char *run = tildes(600);
    char lil[700], bos[700];
    snprintf(lil, sizeof lil, "\xE2\x96\x81little%s", run);
    snprintf(bos, sizeof bos, "<s>%s", run);
    const char *from[] = {"\xE2\x96\x81little", "<s>"}, *to[] = {lil, bos};
    int32_t ids[2];
    fixture_gguf_with_tokens(STORIES, path, from, to, ids, 2);
    int bad = sweep("generate", path, generate_plain, false);
    bad += sweep("generate --json", path, generate_json, true);
    bad += sweep("tokenize", path, tokenize, false);
    free(run);
    unlink(path);
    assert_int_equal(bad, 0);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
