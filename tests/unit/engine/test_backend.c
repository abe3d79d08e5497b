/*
 * The engine's backend interface seen through the public API (issue 22):
 *
 *   - GPUPOOL_ENGINE_FAULT on the CPU backend: "init" fails gpe_ctx_init;
 *     "decode:N[:STATUS]" fails the N-th decode with that status, and every
 *     later decode of that context fails too, exactly as a device fault;
 *     the context still frees; contexts made without the variable work;
 *   - CPU contexts report "cpu" and no devices; gpe_ctx_vram_estimate
 *     refuses CPU models;
 *   - the CUDA plugin loader (once per process, so each case runs in a
 *     forked child): a missing file, a plugin whose dependency is missing
 *     (what a CUDA build meets on a machine without libcudart), a shared
 *     object that is no plugin: 0 GPUs with the one-line reason, a CUDA
 *     model load fails with it (GPE_ERR_BACKEND), and the CPU still runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpupool/engine.h"

#define MODEL GP_SOURCE_DIR "/models/stories260K.gguf"

static gpe_model *load_cpu(void)
{
    char err[256];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    if (gpe_model_load(MODEL, &mp, &m, err, sizeof err) != GPE_OK)
        fail_msg("load: %s", err);
    return m;
}

static gpe_ctx *new_ctx(gpe_model *m)
{
    char err[256];
    gpe_ctx *c = NULL;
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 1;
    if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK)
        fail_msg("ctx: %s", err);
    return c;
}

/* Decodes token 1 at the sequence's next position. */
static gpe_status step(gpe_ctx *c, gpe_batch *b, char *err, size_t errlen)
{
    gpe_batch_clear(b);
    gpe_batch_add(b, 1, gpe_seq_len(c, 0), 0, true);
    return gpe_decode(c, b, err, errlen);
}

static void test_fault_init(void **s)
{
    (void)s;
    char err[256] = "";
    gpe_model *m = load_cpu();
    gpe_ctx *c = NULL;
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 64;
    setenv("GPUPOOL_ENGINE_FAULT", "init", 1);
    assert_int_equal(gpe_ctx_init(m, &cp, &c, err, sizeof err), GPE_ERR_BACKEND);
    unsetenv("GPUPOOL_ENGINE_FAULT");
    assert_null(c);
    assert_non_null(strstr(err, "injected fault"));
    c = new_ctx(m);   /* without the variable: fine */
    gpe_ctx_free(c);
    gpe_model_free(m);
}

static void check_decode_fault(const char *value, gpe_status want)
{
    char err[256] = "";
    gpe_model *m = load_cpu();
    gpe_batch *b = gpe_batch_init(8);
    setenv("GPUPOOL_ENGINE_FAULT", value, 1);
    gpe_ctx *c = new_ctx(m);
    unsetenv("GPUPOOL_ENGINE_FAULT");
    gpe_ctx *ok = new_ctx(m);   /* made after: no fault */

    assert_int_equal(step(c, b, err, sizeof err), GPE_OK);
    assert_int_equal(step(c, b, err, sizeof err), GPE_OK);
    assert_int_equal(gpe_seq_len(c, 0), 2);
    assert_int_equal(step(c, b, err, sizeof err), want);
    assert_non_null(strstr(err, "injected fault: decode 3"));
    assert_int_equal(gpe_seq_len(c, 0), 2);          /* nothing committed */
    assert_null(gpe_get_logits(c, 0));
    /* unusable from now on, even after clearing the sequence */
    gpe_seq_clear(c, 0);
    assert_int_equal(step(c, b, err, sizeof err), GPE_ERR_BACKEND);
    assert_non_null(strstr(err, "unusable"));
    assert_non_null(strstr(err, "injected fault"));
    assert_string_equal(gpe_ctx_backend_name(c), "cpu");
    gpe_ctx_free(c);

    for (int i = 0; i < 4; i++)
        assert_int_equal(step(ok, b, err, sizeof err), GPE_OK);
    assert_non_null(gpe_get_logits(ok, 0));
    gpe_ctx_free(ok);
    gpe_batch_free(b);
    gpe_model_free(m);
}

static void test_fault_decode(void **s)
{
    (void)s;
    check_decode_fault("decode:3", GPE_ERR_BACKEND);
    check_decode_fault("decode:3:INSUFFICIENT_VRAM", GPE_ERR_INSUFFICIENT_VRAM);
}

static void test_cpu_reports(void **s)
{
    (void)s;
    char err[256] = "";
    gpe_model *m = load_cpu();
    gpe_ctx *c = new_ctx(m);
    gpe_vram_need need[GPE_MAX_DEVICES];
    int n = -1;
    assert_string_equal(gpe_ctx_backend_name(c), "cpu");
    assert_int_equal(gpe_ctx_devices(c, need), 0);
    gpe_ctx_params cp = gpe_ctx_default_params();
    assert_int_equal(gpe_ctx_vram_estimate(m, &cp, need, &n, err, sizeof err), GPE_ERR_ARG);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err, "CPU"));
    gpe_ctx_free(c);
    gpe_model_free(m);
}

/* In a child: point the loader at plugin (NULL: leave the variable
 * alone), check the reason contains want and want2, that a CUDA model
 * load fails with it and the CPU still decodes. Exit status = failures. */
static int child_loader(const char *plugin, const char *want, const char *want2)
{
    char why[512] = "", err[512] = "";
    int bad = 0;
    if (plugin)
        setenv("GPUPOOL_CUDA_PLUGIN", plugin, 1);
    if (gpe_gpu_count(why, sizeof why) != 0 || !strstr(why, want) ||
        (want2 && !strstr(why, want2))) {
        fprintf(stderr, "gpe_gpu_count reason: '%s' (want '%s' '%s')\n", why, want,
                want2 ? want2 : "");
        bad++;
    }
    if (strchr(why, '\n'))
        bad++;
    if (gpe_cuda_available())
        bad++;
    gpe_gpu_info gi;
    if (gpe_gpu_info_get(0, &gi, err, sizeof err) == GPE_OK)
        bad++;
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    mp.backend = GPE_BACKEND_CUDA;
    if (gpe_model_load(MODEL, &mp, &m, err, sizeof err) != GPE_ERR_BACKEND ||
        !strstr(err, want)) {
        fprintf(stderr, "CUDA load: '%s'\n", err);
        bad++;
    }
    mp = gpe_model_default_params();
    if (gpe_model_load(MODEL, &mp, &m, err, sizeof err) != GPE_OK) {
        bad++;
    } else {
        gpe_ctx *c = NULL;
        gpe_ctx_params cp = gpe_ctx_default_params();
        cp.n_ctx = 16;
        cp.n_threads = 1;
        gpe_batch *b = gpe_batch_init(4);
        if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK ||
            step(c, b, err, sizeof err) != GPE_OK)
            bad++;
        gpe_batch_free(b);
        gpe_ctx_free(c);
        gpe_model_free(m);
    }
    return bad;
}

static void run_child(const char *plugin, const char *want, const char *want2)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child_loader(plugin, want, want2));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_loader_missing_file(void **s)
{
    (void)s;
    run_child("/nonexistent/libgpupool-cuda.so", "cannot load /nonexistent/libgpupool-cuda.so",
              "No such file");
}

static void test_loader_missing_dependency(void **s)
{
    (void)s;
    run_child(GPE_TEST_NEEDS_MISSING, "libgpe_test_phantom.so: cannot open shared object file",
              NULL);
}

static void test_loader_not_a_plugin(void **s)
{
    (void)s;
    run_child(GPE_TEST_PHANTOM, "has no gpe_cuda_backend_entry", NULL);
}

static void test_loader_default(void **s)
{
    (void)s;
#ifdef GPE_HAVE_CUDA
    /* the real plugin of this build: either devices, or a reason */
    char why[512] = "";
    unsetenv("GPUPOOL_CUDA_PLUGIN");
    int n = gpe_gpu_count(why, sizeof why);
    if (n == 0)
        assert_true(strlen(why) > 0);
    print_message("CUDA plugin: %d device(s)%s%s\n", n, n ? "" : ": ", n ? "" : why);
#else
    unsetenv("GPUPOOL_CUDA_PLUGIN");
    run_child(NULL, "the CUDA backend is not built into this engine", NULL);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_init),
        cmocka_unit_test(test_fault_decode),
        cmocka_unit_test(test_cpu_reports),
        cmocka_unit_test(test_loader_missing_file),
        cmocka_unit_test(test_loader_missing_dependency),
        cmocka_unit_test(test_loader_not_a_plugin),
        cmocka_unit_test(test_loader_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
