/*
 * CUDA backend tests.
 *
 * Always (any build): gpe_cuda_available() agrees with the build and the
 * device count; gpe_cuda_selftest() fails cleanly when it cannot run.
 * In builds with the backend (GPE_HAVE_CUDA):
 *   - the VRAM budget of a model (weights, KV, scratch) adds up and grows
 *     with n_ctx / n_seq / n_batch; unsupported shapes are refused;
 *   - upload / forward argument errors are clear statuses, never crashes;
 *   - the self-test's random models of each type: the CPU forward of the
 *     type against the same model in F32 (what the GPU computes, since its
 *     kernels use F32 activations and exact dequantization) stays well under
 *     the self-test's threshold, so a correct GPU passes it;
 *   - on a machine with a device: the full self-test (every kernel and
 *     whole models against the CPU reference) must pass.
 * Without a device the GPU test is skipped via cmocka's skip(), and the
 * process exits 77 so CTest lists the test as skipped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpupool/engine.h"
#ifdef GPE_HAVE_CUDA
#include "engine/cuda/backend_cuda.h"
#include "engine/cuda/optest.h"
#endif

#define SKIP_CODE 77
static int g_skipped;

static void test_available_matches_build(void **state)
{
    (void)state;
    char err[256] = "";
#ifdef GPE_HAVE_CUDA
    int n = -1;
    bool any = gpe_cuda_device_count(&n);
    assert_true(n >= 0);
    assert_int_equal(any, n > 0);
    assert_int_equal(gpe_cuda_available(), any);
    if (!any) {
        assert_int_equal(gpe_cuda_selftest(err, sizeof err), GPE_ERR_BACKEND);
        assert_string_equal(err, "no CUDA device");
    }
#else
    assert_false(gpe_cuda_available());
    assert_int_equal(gpe_cuda_selftest(err, sizeof err), GPE_ERR_BACKEND);
    assert_non_null(strstr(err, "not built"));
#endif
}

#ifdef GPE_HAVE_CUDA

static void test_budget(void **state)
{
    (void)state;
    char err[256];
    gpe_st_model sm;
    assert_true(gpe_st_model_build(&sm, GPE_TYPE_Q4_K, 1));
    const gpe_hparams *hp = &sm.m.hp;
    gpe_cuda_budget a, b, c;
    assert_int_equal(gpe_cuda_model_bytes(&sm.m, 64, 2, 16, &a, err, sizeof err), GPE_OK);
    assert_int_equal(a.total, a.weights + a.kv + a.scratch + a.reserve);
    /* K and V, F32, every layer, sequence and position */
    uint64_t kv = 2ull * hp->n_layer * 2 * 64 * hp->n_head_kv * hp->head_dim * 4;
    assert_true(a.kv >= kv && a.kv < kv + 1024);
    /* weights: at least the bytes of the tensors */
    uint64_t w = sm.m.tok_embd.row_bytes * (uint64_t)sm.m.tok_embd.n_rows * 2;
    assert_true(a.weights >= w);
    assert_int_equal(gpe_cuda_model_bytes(&sm.m, 128, 2, 16, &b, err, sizeof err), GPE_OK);
    assert_int_equal(b.kv, 2 * a.kv);
    assert_int_equal(b.weights, a.weights);
    assert_int_equal(gpe_cuda_model_bytes(&sm.m, 64, 2, 64, &c, err, sizeof err), GPE_OK);
    assert_true(c.scratch > a.scratch);
    /* bad sizes */
    assert_int_equal(gpe_cuda_model_bytes(&sm.m, 0, 2, 16, &c, err, sizeof err), GPE_ERR_ARG);
    assert_int_equal(gpe_cuda_model_bytes(&sm.m, 64, 2, -1, &c, err, sizeof err), GPE_ERR_ARG);
    /* head size over the kernels' limit */
    sm.m.hp.head_dim = 512;
    assert_int_equal(gpe_cuda_model_bytes(&sm.m, 64, 2, 16, &c, err, sizeof err),
                     GPE_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "head size"));
    sm.m.hp.head_dim = 64;
    /* a type without kernels */
    gpe_type saved = sm.m.layers[1].wq.type;
    sm.m.layers[1].wq.type = GPE_TYPE_Q2_K;
    assert_int_equal(gpe_cuda_model_bytes(&sm.m, 64, 2, 16, &c, err, sizeof err),
                     GPE_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "Q2_K"));
    sm.m.layers[1].wq.type = saved;
    gpe_st_model_free(&sm);
}

static void test_errors_without_device(void **state)
{
    (void)state;
    if (gpe_cuda_available()) {
        skip();   /* covered by the self-test on a GPU machine */
        return;
    }
    char err[256] = "";
    gpe_st_model sm;
    assert_true(gpe_st_model_build(&sm, GPE_TYPE_F16, 2));
    gpe_cuda_model *cm = (gpe_cuda_model *)(uintptr_t)1;
    assert_int_equal(gpe_cuda_model_upload(&sm.m, 0, 64, 1, 8, &cm, err, sizeof err),
                     GPE_ERR_BACKEND);
    assert_null(cm);
    assert_string_equal(err, "no CUDA device");
    /* forward/free/clear tolerate a NULL model */
    int32_t tok = 0;
    int pos = 0, seq = 0;
    bool want = true;
    float logits[300];
    assert_int_equal(gpe_cuda_forward(NULL, &tok, &pos, &seq, &want, 1, logits, err, sizeof err),
                     GPE_ERR_ARG);
    gpe_cuda_seq_clear(NULL, 0);
    gpe_cuda_model_free(NULL);
    gpe_st_model_free(&sm);
}

/* The thresholds are sound: per type, the CPU forward of the model against
 * the same model in F32 is what a correct GPU's deviation looks like (the
 * CPU converts activations to Q8_0/Q8_K/F16, the GPU keeps F32). */
static void test_thresholds_on_cpu(void **state)
{
    (void)state;
    static const gpe_type types[] = { GPE_TYPE_F32,  GPE_TYPE_F16,  GPE_TYPE_BF16,
                                      GPE_TYPE_Q8_0, GPE_TYPE_Q4_0, GPE_TYPE_Q4_K,
                                      GPE_TYPE_Q5_K, GPE_TYPE_Q6_K };
    char err[256];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        gpe_st_model sm, f32;
        float *a = NULL, *b = NULL;
        int ra[GPE_ST_STEPS], rb[GPE_ST_STEPS];
        assert_true(gpe_st_model_build(&sm, types[i], 1000 + i));
        assert_true(gpe_st_model_to_f32(&f32, &sm));
        assert_int_equal(gpe_st_run_cpu(&sm.m, &a, ra, err, sizeof err), GPE_OK);
        assert_int_equal(gpe_st_run_cpu(&f32.m, &b, rb, err, sizeof err), GPE_OK);
        assert_memory_equal(ra, rb, sizeof ra);
        int total = 0;
        for (int s = 0; s < GPE_ST_STEPS; s++)
            total += ra[s];
        assert_int_equal(total, 12 / 4 + 1 + 5 + 3 * 2 + 1 + 4);
        /* logits are finite and not degenerate */
        double ss = 0;
        for (int k = 0; k < total * sm.m.hp.n_vocab; k++) {
            assert_true(a[k] == a[k] && a[k] < 1e30f && a[k] > -1e30f);
            ss += (double)a[k] * a[k];
        }
        assert_true(ss > 0);
        const double nmse = gpe_st_max_nmse(a, b, ra, sm.m.hp.n_vocab);
        const double th = gpe_st_model_threshold(types[i]);
        print_message("  %-5s CPU(type) vs CPU(F32 copy): max step NMSE %.3e (threshold %.0e)\n",
                      gpe_type_name(types[i]), nmse, th);
        assert_true(nmse <= th / 5);
        free(a);
        free(b);
        gpe_st_model_free(&f32);
        gpe_st_model_free(&sm);
    }
}

/* The self-test's feature variants are real: on the CPU each gives finite
 * logits that differ from the plain llama built from the same seed (so the
 * GPU comparison exercises the family's kernels). */
static void test_variants_on_cpu(void **state)
{
    (void)state;
    char err[256];
    gpe_st_model base;
    float *ref = NULL;
    int rr[GPE_ST_STEPS];
    assert_true(gpe_st_model_build(&base, GPE_TYPE_F16, 77));
    assert_int_equal(gpe_st_run_cpu(&base.m, &ref, rr, err, sizeof err), GPE_OK);
    for (int v = 1; v < GPE_ST_N_VARIANTS; v++) {
        gpe_st_model sm;
        float *a = NULL;
        int ra[GPE_ST_STEPS];
        assert_true(gpe_st_model_build(&sm, GPE_TYPE_F16, 77));
        assert_true(gpe_st_model_variant(&sm, v, 5));
        assert_int_equal(gpe_st_run_cpu(&sm.m, &a, ra, err, sizeof err), GPE_OK);
        assert_memory_equal(ra, rr, sizeof ra);
        int total = 0;
        for (int s = 0; s < GPE_ST_STEPS; s++)
            total += ra[s];
        for (int k = 0; k < total * sm.m.hp.n_vocab; k++)
            assert_true(a[k] == a[k] && a[k] < 1e30f && a[k] > -1e30f);
        const double d = gpe_st_max_nmse(a, ref, ra, sm.m.hp.n_vocab);
        print_message("  %-6s vs llama: max step NMSE %.3e\n", gpe_st_variant_name(v), d);
        assert_true(d > 1e-3);
        free(a);
        gpe_st_model_free(&sm);
    }
    free(ref);
    gpe_st_model_free(&base);
}

/* The architecture files (tests/data/arch): the backend accepts every dense
 * family (its kernels cover biases, NEOX RoPE, per-head and post norms,
 * GELU, soft-caps, sliding windows; the GPU comparison is in
 * test_engine_arch) and refuses the MoE file with one clear line instead of
 * running it without its experts. No device needed. */
static void test_arch_budget(void **state)
{
    (void)state;
    static const char *files[] = { "qwen2-f16", "qwen2-q8_0", "qwen3-f16", "llama3-f16",
                                   "phi3-f16",  "gemma2-f16", "gemma3-f16", "mixtral-f16" };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512], err[256] = "";
        snprintf(path, sizeof path, "%s/arch/tiny-random-%s.gguf", GP_MODEL_DATA, files[i]);
        gpe_gguf *g = NULL;
        assert_int_equal(gpe_gguf_open(path, &g, err, sizeof err), GPE_OK);
        gpe_llama m;
        if (gpe_llama_load(&m, g, err, sizeof err) != GPE_OK)
            fail_msg("%s: %s", files[i], err);
        gpe_cuda_budget b;
        gpe_status st = gpe_cuda_model_bytes(&m, 256, 2, 64, &b, err, sizeof err);
        print_message("  %-12s %s %s\n", files[i], gpe_status_name(st), st ? err : "");
        if (strcmp(files[i], "mixtral-f16") == 0) {
            assert_int_equal(st, GPE_ERR_UNSUPPORTED);
            assert_non_null(strstr(err, "mixture-of-experts"));
            assert_null(strchr(err, '\n'));
        } else {
            assert_int_equal(st, GPE_OK);
            assert_true(b.weights > 0 && b.total > b.weights);
        }
        gpe_llama_free(&m);
        gpe_gguf_close(g);
    }
}

#endif /* GPE_HAVE_CUDA */

static void test_gpu_selftest(void **state)
{
    (void)state;
    if (!gpe_cuda_available()) {
        g_skipped = 1;
        print_message("skipped: no CUDA device%s\n",
#ifdef GPE_HAVE_CUDA
                      ""
#else
                      " (CUDA backend not built)"
#endif
        );
        skip();
        return;
    }
    static char err[16384];
    gpe_status st = gpe_cuda_selftest(err, sizeof err);
    print_message("%s\n", err);
    assert_int_equal(st, GPE_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_available_matches_build),
#ifdef GPE_HAVE_CUDA
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_errors_without_device),
        cmocka_unit_test(test_thresholds_on_cpu),
        cmocka_unit_test(test_arch_budget),
        cmocka_unit_test(test_variants_on_cpu),
#endif
        cmocka_unit_test(test_gpu_selftest),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed)
        return failed;
    return g_skipped ? SKIP_CODE : 0;
}
