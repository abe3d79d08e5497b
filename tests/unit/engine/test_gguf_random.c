/*
 * bench/gguf-random writes files the GGUF reader loads, with the requested
 * shape, types, llama metadata and a synthetic vocabulary.
 */
#include <math.h>
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

#include "engine/gguf.h"

static char g_dir[64];

static int run(const char *args, const char *out)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s -o '%s' >/dev/null 2>&1", GGUF_RANDOM_EXE, args, out);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static gpe_gguf *open_ok(const char *path)
{
    char err[512];
    gpe_gguf *g = NULL;
    if (gpe_gguf_open(path, &g, err, sizeof err) != GPE_OK)
        fail_msg("%s", err);
    return g;
}

static void check_values(const gpe_gguf_tensor *t, float lo, float hi)
{
    float *y = malloc((size_t)t->n_elements * sizeof *y);
    assert_true(gpe_dequantize_row(t->type, t->data, y, t->n_elements));
    double sum = 0;
    for (int64_t i = 0; i < t->n_elements; i++) {
        if (!(y[i] >= lo && y[i] <= hi))
            fail_msg("%s[%lld] = %g outside [%g, %g]", t->name, (long long)i, y[i], lo, hi);
        sum += y[i];
    }
    free(y);
    (void)sum;
}

static void test_custom_q4_k(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/custom.gguf", g_dir);
    assert_int_equal(run("--shape custom --n-embd 256 --n-layer 2 --n-head 4 --n-head-kv 2 "
                         "--n-ff 768 --n-vocab 300 --type q4_k --seed 7", path), 0);
    gpe_gguf *g = open_ok(path);
    assert_int_equal(gpe_gguf_n_tensors(g), 3 + 9 * 2);
    uint32_t u;
    assert_true(gpe_gguf_get_u32(g, "llama.embedding_length", &u));
    assert_int_equal(u, 256);
    assert_true(gpe_gguf_get_u32(g, "llama.block_count", &u));
    assert_int_equal(u, 2);
    assert_true(gpe_gguf_get_u32(g, "llama.attention.head_count_kv", &u));
    assert_int_equal(u, 2);
    assert_true(gpe_gguf_get_u32(g, "llama.feed_forward_length", &u));
    assert_int_equal(u, 768);
    assert_string_equal(gpe_gguf_get_str(g, "general.architecture", NULL), "llama");
    assert_string_equal(gpe_gguf_get_str(g, "tokenizer.ggml.model", NULL), "llama");
    int64_t tk = gpe_gguf_find_key(g, "tokenizer.ggml.tokens");
    uint64_t n;
    assert_true(gpe_gguf_arr_info(g, tk, NULL, &n));
    assert_int_equal(n, 300);
    assert_string_equal(gpe_gguf_arr_str(g, tk, 1, NULL), "<s>");
    assert_string_equal(gpe_gguf_arr_str(g, tk, 3, NULL), "<0x00>");
    assert_string_equal(gpe_gguf_arr_str(g, tk, 258, NULL), "<0xFF>");
    /* made-up pieces are all distinct */
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = i + 1; j < n; j++)
            assert_true(strcmp(gpe_gguf_arr_str(g, tk, i, NULL), gpe_gguf_arr_str(g, tk, j, NULL)));
    int64_t tt = gpe_gguf_find_key(g, "tokenizer.ggml.token_type");
    int64_t v;
    assert_true(gpe_gguf_arr_i64(g, tt, 3, &v));
    assert_int_equal(v, 6);
    const gpe_gguf_tensor *t = gpe_gguf_tensor_get(g, "blk.1.attn_k.weight");
    assert_non_null(t);
    assert_int_equal(t->type, GPE_TYPE_Q4_K);
    assert_int_equal(t->ne[0], 256);
    assert_int_equal(t->ne[1], 128);
    check_values(t, -0.06f, 0.06f);
    t = gpe_gguf_tensor_get(g, "blk.0.ffn_down.weight");
    assert_int_equal(t->ne[0], 768);
    assert_int_equal(t->ne[1], 256);
    t = gpe_gguf_tensor_get(g, "blk.0.ffn_norm.weight");
    assert_int_equal(t->type, GPE_TYPE_F32);
    check_values(t, 0.9f, 1.1f);
    assert_non_null(gpe_gguf_tensor_get(g, "output.weight"));
    assert_non_null(gpe_gguf_tensor_get(g, "output_norm.weight"));
    assert_non_null(gpe_gguf_tensor_get(g, "token_embd.weight"));
    gpe_gguf_close(g);
    unlink(path);
}

static void test_stories_fallbacks(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/st.gguf", g_dir);
    assert_int_equal(run("--shape stories260k --type q4_k", path), 0);
    gpe_gguf *g = open_ok(path);
    assert_int_equal(gpe_gguf_n_tensors(g), 48);
    /* 64 columns: not a Q4_K row -> Q8_0; 172 columns: not even Q8_0 -> F16 */
    assert_int_equal(gpe_gguf_tensor_get(g, "blk.0.attn_q.weight")->type, GPE_TYPE_Q8_0);
    assert_int_equal(gpe_gguf_tensor_get(g, "blk.4.ffn_down.weight")->type, GPE_TYPE_F16);
    check_values(gpe_gguf_tensor_get(g, "blk.4.ffn_down.weight"), -0.06f, 0.06f);
    gpe_gguf_close(g);
    unlink(path);
    snprintf(path, sizeof path, "%s/f16.gguf", g_dir);
    assert_int_equal(run("--shape stories260k --type f16 --seed 3", path), 0);
    g = open_ok(path);
    assert_int_equal(gpe_gguf_tensor_get(g, "output.weight")->type, GPE_TYPE_F16);
    gpe_gguf_close(g);
    unlink(path);
}

static void test_bad_args(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/bad.gguf", g_dir);
    assert_int_equal(run("--shape nope", path), 2);
    assert_int_equal(run("--type q2_k", path), 2);
    assert_int_equal(run("--shape custom --n-embd 64 --n-layer 1 --n-head 3 --n-head-kv 1 "
                         "--n-ff 64 --n-vocab 300", path), 2);
    assert_int_equal(run("--shape custom --n-embd 64 --n-layer 1 --n-head 4 --n-head-kv 1 "
                         "--n-ff 64 --n-vocab 100", path), 2);
    assert_int_not_equal(access(path, F_OK), 0);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/gpe-gguf-random-XXXXXX");
    if (!mkdtemp(g_dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_custom_q4_k),
        cmocka_unit_test(test_stories_fallbacks),
        cmocka_unit_test(test_bad_args),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir);
    return rc;
}
