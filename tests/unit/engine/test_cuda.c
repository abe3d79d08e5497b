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
 *   - on a machine with a device, through the public API and the plugin
 *     (stories260K): a layer split over device 0 twice (and three times,
 *     1:3:1) gives the logits of one device (NMSE <= 1e-10; the test prints
 *     whether they are bit-identical, which they should be: same kernels,
 *     same shapes) and of the CPU (NMSE <= 1e-6, the F32 model threshold);
 *     the F16 KV cache against the CPU's F16 KV path (NMSE <= 1e-4; on the CPU
 *     the whole F16-vs-F32 KV effect on stories260K is 9.5e-8: F16
 *     rounding of K, V and q on both sides; the CPU also rounds the softmax
 *     weights); the prefix cache (gpe_seq_truncate, then the rest) against
 *     a fresh prefill; the VRAM preflight refusing a context too large,
 *     naming the device; the device report of a split context.
 * Without a device the GPU tests are skipped via cmocka's skip(), and the
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
        /* the plugin loads (built next to this test) and says why */
        assert_int_equal(gpe_cuda_selftest(err, sizeof err), GPE_ERR_BACKEND);
        assert_non_null(strstr(err, "no CUDA device is visible"));
        char why[256] = "";
        assert_int_equal(gpe_gpu_count(why, sizeof why), 0);
        assert_string_equal(why, err);
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
    assert_non_null(strstr(err, "no CUDA device"));
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

/* The self-test's F16 KV check is sound: on the CPU, the Q4_K model's F16
 * KV cache moves the logits by far less than the check's allowance over the
 * type's threshold (the GPU and CPU F16 paths differ only in where they
 * round, a fraction of this). */
static void test_kv_f16_on_cpu(void **state)
{
    (void)state;
    char err[256];
    gpe_st_model sm;
    float *a = NULL, *b = NULL;
    int ra[GPE_ST_STEPS], rb[GPE_ST_STEPS];
    assert_true(gpe_st_model_build(&sm, GPE_TYPE_Q4_K, 4242));
    assert_int_equal(gpe_st_run_cpu_kv(&sm.m, true, &a, ra, err, sizeof err), GPE_OK);
    assert_int_equal(gpe_st_run_cpu_kv(&sm.m, false, &b, rb, err, sizeof err), GPE_OK);
    const double d = gpe_st_max_nmse(a, b, ra, sm.m.hp.n_vocab);
    print_message("  Q4_K CPU KV F16 vs KV F32: max step NMSE %.3e (allowance %.0e)\n", d,
                  GPE_ST_KV_F16_THRESHOLD);
    assert_true(d > 0.0);
    assert_true(d <= GPE_ST_KV_F16_THRESHOLD);
    free(a);
    free(b);
    gpe_st_model_free(&sm);
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

/* ------------------------------------------ device tests (public API) */

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"
#define DEV_STEPS 8

/* Skips (and marks the run skipped) without a device. */
static bool need_device(void)
{
    char why[256] = "";
    if (gpe_gpu_count(why, sizeof why) > 0)
        return true;
    g_skipped = 1;
    print_message("skipped: %s\n", why);
    return false;
}

static gpe_model *load_on(gpe_backend_kind be, int n_devices, const float *split)
{
    char err[512];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    mp.backend = be;
    mp.n_devices = n_devices;
    for (int i = 0; i < n_devices; i++) {
        mp.devices[i] = 0;
        mp.split[i] = split ? split[i] : 0.0f;
    }
    if (gpe_model_load(STORIES, &mp, &m, err, sizeof err) != GPE_OK)
        fail_msg("load: %s", err);
    return m;
}

static gpe_ctx *ctx_on(gpe_model *m, bool kv_f16)
{
    char err[512];
    gpe_ctx *c = NULL;
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 128;
    cp.n_seq = 2;
    cp.n_batch = 16;     /* the 23-token prompt runs in two chunks (GEMM) */
    cp.n_threads = 2;
    cp.kv_f16 = kv_f16;
    if (gpe_ctx_init(m, &cp, &c, err, sizeof err) != GPE_OK)
        fail_msg("ctx: %s", err);
    return c;
}

/* The same fixed script on any context: two prompts prefilled (every
 * row's logits), then DEV_STEPS batched decode steps of both sequences
 * feeding fixed tokens (so runs stay comparable whatever they predict).
 * Returns malloc'd logits rows; *rows receives their count. */
static float *run_script(gpe_model *m, gpe_ctx *c, int *rows)
{
    char err[512];
    static const char *prompts[2] = {
        "Once upon a time, there was a little girl named Lily who loved to play outside.",
        "The cat sat on the mat."};
    const int V = gpe_model_n_vocab(m);
    int32_t toks[2][128];
    int nt[2];
    float *out = malloc((size_t)(128 + 2 * DEV_STEPS) * 2 * (size_t)V * sizeof *out);
    gpe_batch *b = gpe_batch_init(256);
    assert_non_null(out);
    *rows = 0;
    for (int s = 0; s < 2; s++) {
        nt[s] = gpe_tokenize(m, prompts[s], strlen(prompts[s]), true, false, toks[s], 128);
        assert_true(nt[s] > 4);
        gpe_batch_clear(b);
        for (int i = 0; i < nt[s]; i++)
            gpe_batch_add(b, toks[s][i], i, s, true);
        if (gpe_decode(c, b, err, sizeof err) != GPE_OK)
            fail_msg("prefill: %s", err);
        for (int i = 0; i < nt[s]; i++)
            memcpy(out + (size_t)(*rows)++ * V, gpe_get_logits(c, i), (size_t)V * sizeof *out);
    }
    for (int k = 0; k < DEV_STEPS; k++) {
        gpe_batch_clear(b);
        for (int s = 0; s < 2; s++)
            gpe_batch_add(b, toks[0][(k + 3 * s) % nt[0]], gpe_seq_len(c, s), s, true);
        if (gpe_decode(c, b, err, sizeof err) != GPE_OK)
            fail_msg("decode: %s", err);
        for (int s = 0; s < 2; s++)
            memcpy(out + (size_t)(*rows)++ * V, gpe_get_logits(c, s), (size_t)V * sizeof *out);
    }
    gpe_batch_free(b);
    return out;
}

static float *script_on(gpe_model *m, bool kv_f16, int *rows)
{
    gpe_ctx *c = ctx_on(m, kv_f16);
    float *r = run_script(m, c, rows);
    gpe_ctx_free(c);
    return r;
}

static void test_dev_info_and_preflight(void **state)
{
    (void)state;
    if (!need_device()) {
        skip();
        return;
    }
    char err[512] = "";
    gpe_gpu_info gi;
    assert_int_equal(gpe_gpu_info_get(0, &gi, err, sizeof err), GPE_OK);
    print_message("device 0: %s (%s), cc %d.%d, %.0f of %.0f MiB free\n", gi.name,
                  gi.pci_bus_id, gi.cc_major, gi.cc_minor, gi.free_bytes / 1048576.0,
                  gi.total_bytes / 1048576.0);
    assert_true(gi.name[0] && gi.total_bytes > 0 && gi.free_bytes <= gi.total_bytes);
    assert_int_equal(gpe_gpu_info_get(gpe_gpu_count(NULL, 0), &gi, err, sizeof err),
                     GPE_ERR_ARG);

    /* a context far larger than any GPU: refused before allocating,
     * naming the device and the numbers; the estimate says the same */
    gpe_model *m = load_on(GPE_BACKEND_CUDA, 0, NULL);
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 1 << 20;
    cp.n_seq = 4096;
    gpe_vram_need need[GPE_MAX_DEVICES];
    int n = 0;
    assert_int_equal(gpe_ctx_vram_estimate(m, &cp, need, &n, err, sizeof err), GPE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(need[0].device, 0);
    assert_true(need[0].total > need[0].free_bytes);
    gpe_ctx *c = NULL;
    assert_int_equal(gpe_ctx_init(m, &cp, &c, err, sizeof err), GPE_ERR_INSUFFICIENT_VRAM);
    print_message("preflight: %s\n", err);
    assert_null(c);
    assert_non_null(strstr(err, "CUDA device 0: "));
    assert_non_null(strstr(err, "MiB"));
    gpe_model_free(m);
}

static void test_dev_split_same_device(void **state)
{
    (void)state;
    if (!need_device()) {
        skip();
        return;
    }
    gpe_model *one = load_on(GPE_BACKEND_CUDA, 0, NULL);
    gpe_model *two = load_on(GPE_BACKEND_CUDA, 2, NULL);
    static const float shares[3] = {1.0f, 3.0f, 1.0f};
    gpe_model *three = load_on(GPE_BACKEND_CUDA, 3, shares);
    gpe_model *cpu = load_on(GPE_BACKEND_CPU, 0, NULL);
    gpe_model_info info;
    gpe_model_get_info(one, &info);

    /* the split context's report: stages in order, layers covering the
     * model, embeddings on the first and the head on the last */
    gpe_ctx *c = ctx_on(three, false);
    gpe_vram_need d[GPE_MAX_DEVICES];
    assert_string_equal(gpe_ctx_backend_name(c), "cuda");
    assert_int_equal(gpe_ctx_devices(c, d), 3);
    assert_int_equal(d[0].layer_begin, 0);
    assert_int_equal(d[2].layer_end, info.n_layer);
    for (int i = 0; i < 3; i++) {
        print_message("stage %d: device %d layers [%d, %d) weights %llu kv %llu total %llu\n",
                      i, d[i].device, d[i].layer_begin, d[i].layer_end,
                      (unsigned long long)d[i].weights, (unsigned long long)d[i].kv,
                      (unsigned long long)d[i].total);
        assert_int_equal(d[i].device, 0);
        assert_true(d[i].total == d[i].weights + d[i].kv + d[i].scratch + d[i].reserve);
        if (i > 0)
            assert_int_equal(d[i].layer_begin, d[i - 1].layer_end);
    }
    assert_true(d[1].layer_end - d[1].layer_begin >= d[0].layer_end - d[0].layer_begin);
    gpe_ctx_free(c);

    int r1, r2, r3, rc;
    float *a = script_on(one, false, &r1);
    float *b = script_on(two, false, &r2);
    float *t = script_on(three, false, &r3);
    float *p = script_on(cpu, false, &rc);
    assert_int_equal(r1, r2);
    assert_int_equal(r1, r3);
    assert_int_equal(r1, rc);
    const size_t n = (size_t)r1 * (size_t)info.n_vocab;
    const double e2 = gpe_st_nmse(b, a, n), e3 = gpe_st_nmse(t, a, n);
    const double ec = gpe_st_nmse(a, p, n), e2c = gpe_st_nmse(b, p, n);
    print_message("split 0,0 vs one device: NMSE %.3e (%s); split 0,0,0 (1:3:1): NMSE %.3e "
                  "(%s)\none device vs CPU: NMSE %.3e; split vs CPU: NMSE %.3e\n",
                  e2, memcmp(a, b, n * sizeof *a) ? "not bit-identical" : "bit-identical", e3,
                  memcmp(a, t, n * sizeof *a) ? "not bit-identical" : "bit-identical", ec, e2c);
    assert_true(e2 <= 1e-10);
    assert_true(e3 <= 1e-10);
    assert_true(ec <= 1e-6);
    assert_true(e2c <= 1e-6);
    free(a);
    free(b);
    free(t);
    free(p);
    gpe_model_free(one);
    gpe_model_free(two);
    gpe_model_free(three);
    gpe_model_free(cpu);
}

static void test_dev_kv_f16(void **state)
{
    (void)state;
    if (!need_device()) {
        skip();
        return;
    }
    char err[512];
    gpe_model *gpu = load_on(GPE_BACKEND_CUDA, 0, NULL);
    gpe_model *split = load_on(GPE_BACKEND_CUDA, 2, NULL);
    gpe_model *cpu = load_on(GPE_BACKEND_CPU, 0, NULL);
    /* half the KV memory */
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 1024;
    cp.n_seq = 4;
    gpe_vram_need a[GPE_MAX_DEVICES], h[GPE_MAX_DEVICES];
    int na = 0, nh = 0;
    assert_int_equal(gpe_ctx_vram_estimate(gpu, &cp, a, &na, err, sizeof err), GPE_OK);
    cp.kv_f16 = true;
    assert_int_equal(gpe_ctx_vram_estimate(gpu, &cp, h, &nh, err, sizeof err), GPE_OK);
    assert_true(h[0].kv * 2 >= a[0].kv && h[0].kv * 2 <= a[0].kv + 1024);

    int rg, rs, rc, r32;
    float *g = script_on(gpu, true, &rg);
    float *s = script_on(split, true, &rs);
    float *c = script_on(cpu, true, &rc);
    float *g32 = script_on(gpu, false, &r32);
    assert_int_equal(rg, rc);
    assert_int_equal(rs, rc);
    const size_t n = (size_t)rg * (size_t)gpe_model_n_vocab(gpu);
    const double e = gpe_st_nmse(g, c, n), es = gpe_st_nmse(s, g, n);
    const double e32 = gpe_st_nmse(g, g32, n);
    print_message("CUDA F16 KV vs CPU F16 KV: NMSE %.3e; split vs one device: %.3e; "
                  "F16 KV vs F32 KV on CUDA: %.3e\n", e, es, e32);
    assert_true(e <= 1e-4);
    assert_true(es <= 1e-10);
    assert_true(e32 > 0.0);   /* it really stored F16 */
    free(g);
    free(s);
    free(c);
    free(g32);
    gpe_model_free(gpu);
    gpe_model_free(split);
    gpe_model_free(cpu);
}

/* The prompt-prefix cache on CUDA: a sequence holding prompt A is cut to
 * the prefix A and B share, then fed the rest of B: the logits at B's last
 * token and the greedy continuation equal a fresh prefill of B. */
static void check_prefix(gpe_model *m, bool kv_f16)
{
    char err[512];
    const char *pa = "Once upon a time, there was a little girl named Lily. She liked to run.";
    const char *pb = "Once upon a time, there was a little girl named Lily. One day she saw a dog.";
    int32_t ta[128], tb[128];
    const int na = gpe_tokenize(m, pa, strlen(pa), true, false, ta, 128);
    const int nb = gpe_tokenize(m, pb, strlen(pb), true, false, tb, 128);
    int common = 0;
    while (common < na && common < nb && ta[common] == tb[common])
        common++;
    assert_true(common > 4 && common < nb);
    const int V = gpe_model_n_vocab(m);
    gpe_ctx *c = ctx_on(m, kv_f16);
    gpe_batch *b = gpe_batch_init(256);
    float *fresh = malloc((size_t)V * sizeof *fresh), *reused = malloc((size_t)V * sizeof *reused);
    int32_t gen[2][DEV_STEPS];
    for (int s = 0; s < 2; s++) {
        /* s = 0: fresh prefill of B in sequence 0; s = 1: A in sequence 1,
         * cut to the common prefix, then the rest of B */
        int from = 0;
        if (s == 1) {
            gpe_batch_clear(b);
            for (int i = 0; i < na; i++)
                gpe_batch_add(b, ta[i], i, 1, i == na - 1);
            if (gpe_decode(c, b, err, sizeof err) != GPE_OK)
                fail_msg("prefill A: %s", err);
            gpe_seq_truncate(c, 1, common);
            assert_int_equal(gpe_seq_len(c, 1), common);
            from = common;
        }
        gpe_batch_clear(b);
        for (int i = from; i < nb; i++)
            gpe_batch_add(b, tb[i], i, s, i == nb - 1);
        if (gpe_decode(c, b, err, sizeof err) != GPE_OK)
            fail_msg("prefill B: %s", err);
        memcpy(s ? reused : fresh, gpe_get_logits(c, nb - 1 - from), (size_t)V * sizeof(float));
        const float *lg = s ? reused : fresh;
        for (int k = 0; k < DEV_STEPS; k++) {
            int32_t best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best])
                    best = v;
            gen[s][k] = best;
            gpe_batch_clear(b);
            gpe_batch_add(b, best, gpe_seq_len(c, s), s, true);
            if (gpe_decode(c, b, err, sizeof err) != GPE_OK)
                fail_msg("decode: %s", err);
            lg = gpe_get_logits(c, 0);
        }
    }
    const double e = gpe_st_nmse(reused, fresh, (size_t)V);
    print_message("prefix cache on CUDA%s: %d of %d tokens reused, NMSE vs fresh prefill "
                  "%.3e\n", kv_f16 ? " (F16 KV)" : "", common, nb, e);
    assert_true(e <= 1e-6);
    assert_memory_equal(gen[0], gen[1], sizeof gen[0]);
    free(fresh);
    free(reused);
    gpe_batch_free(b);
    gpe_ctx_free(c);
}

static void test_dev_prefix(void **state)
{
    (void)state;
    if (!need_device()) {
        skip();
        return;
    }
    gpe_model *m = load_on(GPE_BACKEND_CUDA, 0, NULL);
    check_prefix(m, false);
    check_prefix(m, true);
    gpe_model_free(m);
    m = load_on(GPE_BACKEND_CUDA, 2, NULL);
    check_prefix(m, false);
    gpe_model_free(m);
}

/* Embeddings on CUDA (the backend's hidden op): two inputs, one of them
 * longer than the context's batch (several passes), through gpe_embed_batch
 * on the CPU and on CUDA (one device, split over device 0 twice): the same
 * pooled vectors up to float rounding. */
static void test_dev_embed(void **state)
{
    (void)state;
    if (!need_device()) {
        skip();
        return;
    }
    char err[512];
    const char *txt[2] = { "Once upon a time, there was a little girl named Lily.",
                           "The dog ran to the park and played with a red ball all day long, "
                           "then it went home and slept." };
    gpe_model *cpu = load_on(GPE_BACKEND_CPU, 0, NULL);
    const int dim = gpe_model_embedding_dim(cpu);
    int32_t tok[2][128];
    const int32_t *tp[2] = { tok[0], tok[1] };
    int nt[2];
    for (int i = 0; i < 2; i++) {
        nt[i] = gpe_tokenize(cpu, txt[i], strlen(txt[i]), true, false, tok[i], 128);
        assert_true(nt[i] > 0);
    }
    assert_true(nt[1] > 16);
    float *want = malloc(2 * (size_t)dim * sizeof *want);
    float *got = malloc(2 * (size_t)dim * sizeof *got);
    gpe_ctx *c = ctx_on(cpu, false);
    if (gpe_embed_batch(c, tp, nt, 2, want, dim, err, sizeof err) != GPE_OK)
        fail_msg("CPU embed: %s", err);
    gpe_ctx_free(c);
    for (int n_dev = 0; n_dev <= 2; n_dev += 2) {
        gpe_model *m = load_on(GPE_BACKEND_CUDA, n_dev, NULL);
        c = ctx_on(m, false);
        if (gpe_embed_batch(c, tp, nt, 2, got, dim, err, sizeof err) != GPE_OK)
            fail_msg("CUDA embed: %s", err);
        const double e = gpe_st_nmse(got, want, 2 * (size_t)dim);
        print_message("embeddings on CUDA (%s): NMSE vs CPU %.3e\n",
                      n_dev ? "split 0,0" : "one device", e);
        assert_true(e <= 1e-6);
        gpe_ctx_free(c);
        gpe_model_free(m);
    }
    free(want);
    free(got);
    gpe_model_free(cpu);
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
        cmocka_unit_test(test_kv_f16_on_cpu),
        cmocka_unit_test(test_dev_info_and_preflight),
        cmocka_unit_test(test_dev_split_same_device),
        cmocka_unit_test(test_dev_kv_f16),
        cmocka_unit_test(test_dev_prefix),
        cmocka_unit_test(test_dev_embed),
#endif
        cmocka_unit_test(test_gpu_selftest),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed)
        return failed;
    return g_skipped ? SKIP_CODE : 0;
}
