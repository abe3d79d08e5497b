/*
 * model: llama-family hyper-parameters, weight binding and the CPU forward
 * pass (see model.h for the architecture and the determinism contract).
 *
 * Sections: loading (metadata, tensors), scratch, parallel jobs (activation
 * conversion, matmul, RoPE + KV store, attention, SwiGLU), forward.
 */
#include "engine/model.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Sanity caps on hyper-parameters: far above any model this engine can run,
 * low enough that no size computed from them overflows. */
#define MAX_EMBD   (1 << 16)
#define MAX_FF     (1 << 18)
#define MAX_LAYER  1024
#define MAX_HEAD   1024
#define MAX_VOCAB  (1 << 22)
#define MAX_CTX    (1 << 22)
#define GPE_MAX_ROT 1024   /* rotated dims per head (real models: 64..256) */
#define GPE_MAX_HEAD_DIM 1024 /* head size (real models: 64..256) */

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ============================================================== loading */

static void gelu_init(void);   /* the GELU table (forward pass section) */

/* Architectures this engine runs. Mistral, Llama 3 and Mixtral files are
 * written as "llama" by llama.cpp's converter. */
static const struct {
    const char *name;
    gpe_arch_kind kind;
} k_archs[] = {
    {"llama", GPE_ARCH_LLAMA},   {"qwen2", GPE_ARCH_QWEN2},   {"qwen3", GPE_ARCH_QWEN3},
    {"phi3", GPE_ARCH_PHI3},     {"gemma2", GPE_ARCH_GEMMA2}, {"gemma3", GPE_ARCH_GEMMA3},
    {"bert", GPE_ARCH_BERT},     {"nomic-bert", GPE_ARCH_NOMIC_BERT},
};
#define SUPPORTED_ARCHS \
    "llama (incl. Mistral, Llama 3, Mixtral MoE), qwen2, qwen3, phi3, gemma2, gemma3; " \
    "encoders (embeddings only): bert, nomic-bert"

static bool arch_lookup(const char *a, gpe_arch_kind *kind)
{
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (strcmp(a, k_archs[i].name) == 0) {
            *kind = k_archs[i].kind;
            return true;
        }
    return false;
}

/* Reads "<arch>.<suffix>" as a positive int into *out; absent -> dflt (or
 * an error when dflt < 0). */
static gpe_status get_int(const gpe_gguf *g, const char *arch, const char *suffix, int dflt,
                          int maxv, int *out, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    if (!gpe_gguf_get_i64(g, key, &v)) {
        if (gpe_gguf_find_key(g, key) >= 0) {
            seterr(err, errlen, "metadata '%s' is not an integer", key);
            return GPE_ERR_FORMAT;
        }
        if (dflt < 0) {
            seterr(err, errlen, "metadata '%s' is missing", key);
            return GPE_ERR_FORMAT;
        }
        *out = dflt;
        return GPE_OK;
    }
    if (v <= 0 || v > maxv) {
        seterr(err, errlen, "metadata '%s' = %lld is out of range [1, %d]", key, (long long)v,
               maxv);
        return GPE_ERR_FORMAT;
    }
    *out = (int)v;
    return GPE_OK;
}

static bool get_f32(const gpe_gguf *g, const char *arch, const char *suffix, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gpe_gguf_get_f32(g, key, out);
}

/* Optional positive float "<arch>.<suffix>": absent -> dflt. */
static gpe_status get_pos_f32(const gpe_gguf *g, const char *arch, const char *suffix,
                              float dflt, float *out, char *err, size_t errlen)
{
    *out = dflt;
    if (get_f32(g, arch, suffix, out) && !(*out > 0.0f && isfinite(*out))) {
        seterr(err, errlen, "metadata '%s.%s' must be a positive number", arch, suffix);
        return GPE_ERR_FORMAT;
    }
    return GPE_OK;
}

/* Reads "<arch>.<suffix>" as a count in [0, maxv]; absent -> 0. */
static gpe_status get_count(const gpe_gguf *g, const char *arch, const char *suffix, int maxv,
                            int *out, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v = 0;
    *out = 0;
    if (!gpe_gguf_get_i64(g, key, &v)) {
        if (gpe_gguf_find_key(g, key) >= 0) {
            seterr(err, errlen, "metadata '%s' is not an integer", key);
            return GPE_ERR_FORMAT;
        }
        return GPE_OK;
    }
    if (v < 0 || v > maxv) {
        seterr(err, errlen, "metadata '%s' = %lld is out of range [0, %d]", key, (long long)v,
               maxv);
        return GPE_ERR_FORMAT;
    }
    *out = (int)v;
    return GPE_OK;
}

/* BERT-style encoders: LayerNorm eps (required, as llama.cpp), non-causal
 * attention (a file declaring causal attention is some other model), and
 * the token type count that sizes token_types. */
static gpe_status read_encoder_hparams(gpe_hparams *hp, const gpe_gguf *g, const char *arch,
                                       char *err, size_t errlen)
{
    char key[128];
    bool causal = false;
    hp->encoder = true;
    hp->rope_neox = true;
    if (!get_f32(g, arch, "attention.layer_norm_epsilon", &hp->norm_eps) ||
        !(hp->norm_eps > 0.0f) || !isfinite(hp->norm_eps)) {
        seterr(err, errlen, "metadata '%s.attention.layer_norm_epsilon' must be a positive "
               "number", arch);
        return GPE_ERR_FORMAT;
    }
    snprintf(key, sizeof key, "%s.attention.causal", arch);
    if (gpe_gguf_get_bool(g, key, &causal) && causal) {
        seterr(err, errlen, "metadata '%s' = true: causal encoders are not supported", key);
        return GPE_ERR_UNSUPPORTED;
    }
    int64_t v = 0;
    if (!gpe_gguf_get_i64(g, "tokenizer.ggml.token_type_count", &v) || v < 1 || v > 1024) {
        seterr(err, errlen, "metadata 'tokenizer.ggml.token_type_count' must be in [1, 1024] "
               "for %s", arch);
        return GPE_ERR_FORMAT;
    }
    hp->n_token_types = (int)v;
    return GPE_OK;
}

/* What differs per family (defaults are llama.cpp's). */
static gpe_status read_arch_hparams(gpe_hparams *hp, const gpe_gguf *g, const char *arch,
                                    char *err, size_t errlen)
{
    gpe_status st;
    hp->rope_neox = hp->kind != GPE_ARCH_LLAMA;
    hp->rope_base_swa = hp->rope_base;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = 1.0f;
    switch (hp->kind) {
    case GPE_ARCH_LLAMA:
        /* 0 (some converters write it for dense files) means dense */
        if ((st = get_count(g, arch, "expert_count", 256, &hp->n_expert, err, errlen)) ||
            (st = get_count(g, arch, "expert_used_count", 256, &hp->n_expert_used, err,
                            errlen)))
            return st;
        if (hp->n_expert_used > hp->n_expert || (hp->n_expert > 0 && hp->n_expert_used == 0)) {
            seterr(err, errlen,
                   "metadata '%s.expert_used_count' = %d must be in [1, %s.expert_count = %d]",
                   arch, hp->n_expert_used, arch, hp->n_expert);
            return GPE_ERR_FORMAT;
        }
        break;
    case GPE_ARCH_QWEN2:
    case GPE_ARCH_QWEN3:
        break;
    case GPE_ARCH_PHI3:
        /* phi3.attention.sliding_window is read but not applied: llama.cpp
         * disables Phi-3's window too (its converter's value is unreliable),
         * and the references follow llama.cpp. */
        break;
    case GPE_ARCH_BERT:
    case GPE_ARCH_NOMIC_BERT:
        return read_encoder_hparams(hp, g, arch, err, errlen);
    case GPE_ARCH_GEMMA2:
    case GPE_ARCH_GEMMA3:
        hp->embd_scale = sqrtf((float)hp->n_embd);
        hp->gelu = true;
        /* The 27B sizes scale queries by 1/sqrt(n_embd / n_head) (llama.cpp
         * recognises them by their layer count: 46 for gemma2, 62 gemma3). */
        if (hp->n_layer == (hp->kind == GPE_ARCH_GEMMA2 ? 46 : 62))
            hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
        if ((st = get_int(g, arch, "attention.sliding_window", 4096, MAX_CTX, &hp->n_swa, err,
                          errlen)))
            return st;
        if (hp->kind == GPE_ARCH_GEMMA2) {
            hp->swa_pattern = 2;
            if ((st = get_pos_f32(g, arch, "attn_logit_softcapping", 50.0f, &hp->attn_softcap,
                                  err, errlen)) ||
                (st = get_pos_f32(g, arch, "final_logit_softcapping", 30.0f,
                                  &hp->final_softcap, err, errlen)))
                return st;
        } else {
            if ((st = get_int(g, arch, "attention.sliding_window_pattern", 6, MAX_LAYER,
                              &hp->swa_pattern, err, errlen)) ||
                (st = get_pos_f32(g, arch, "rope.freq_base_swa", 10000.0f, &hp->rope_base_swa,
                                  err, errlen)))
                return st;
        }
        break;
    }
    return GPE_OK;
}

static gpe_status read_hparams(gpe_hparams *hp, const gpe_gguf *g, char *err, size_t errlen)
{
    gpe_status st;
    const char *arch = gpe_gguf_get_str(g, "general.architecture", NULL);
    if (!arch) {
        seterr(err, errlen, "metadata 'general.architecture' is missing");
        return GPE_ERR_FORMAT;
    }
    if (!arch_lookup(arch, &hp->kind)) {
        seterr(err, errlen, "unsupported architecture '%.64s' (this engine runs: %s)", arch,
               SUPPORTED_ARCHS);
        return GPE_ERR_UNSUPPORTED;
    }
    snprintf(hp->arch, sizeof hp->arch, "%s", arch);

    if ((st = get_int(g, arch, "embedding_length", -1, MAX_EMBD, &hp->n_embd, err, errlen)) ||
        (st = get_int(g, arch, "block_count", -1, MAX_LAYER, &hp->n_layer, err, errlen)) ||
        (st = get_int(g, arch, "feed_forward_length", -1, MAX_FF, &hp->n_ff, err, errlen)) ||
        (st = get_int(g, arch, "attention.head_count", -1, MAX_HEAD, &hp->n_head, err,
                      errlen)) ||
        (st = get_int(g, arch, "attention.head_count_kv", hp->n_head, MAX_HEAD, &hp->n_head_kv,
                      err, errlen)) ||
        (st = get_int(g, arch, "context_length", 2048, MAX_CTX, &hp->n_ctx_train, err,
                      errlen)))
        return st;
    if (hp->n_embd % hp->n_head != 0) {
        seterr(err, errlen, "embedding_length %d is not a multiple of head_count %d", hp->n_embd,
               hp->n_head);
        return GPE_ERR_FORMAT;
    }
    if ((st = get_int(g, arch, "attention.key_length", hp->n_embd / hp->n_head, MAX_EMBD,
                      &hp->head_dim, err, errlen)))
        return st;
    int vlen;
    if ((st = get_int(g, arch, "attention.value_length", hp->head_dim, MAX_EMBD, &vlen, err,
                      errlen)))
        return st;
    if (vlen != hp->head_dim) {
        seterr(err, errlen, "key_length %d != value_length %d is not supported", hp->head_dim,
               vlen);
        return GPE_ERR_UNSUPPORTED;
    }
    if (hp->head_dim > GPE_MAX_HEAD_DIM) {
        seterr(err, errlen, "head size %d is above this engine's limit %d", hp->head_dim,
               GPE_MAX_HEAD_DIM);
        return GPE_ERR_UNSUPPORTED;
    }
    if ((uint64_t)hp->head_dim * (uint64_t)hp->n_head > MAX_EMBD * 4ull) {
        seterr(err, errlen, "head_count x key_length is too large");
        return GPE_ERR_FORMAT;
    }
    if (hp->n_head % hp->n_head_kv != 0) {
        seterr(err, errlen, "head_count %d is not a multiple of head_count_kv %d", hp->n_head,
               hp->n_head_kv);
        return GPE_ERR_FORMAT;
    }
    if ((st = get_int(g, arch, "rope.dimension_count", hp->head_dim, MAX_EMBD, &hp->n_rot, err,
                      errlen)))
        return st;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0) {
        seterr(err, errlen, "rope.dimension_count %d must be even and <= head size %d",
               hp->n_rot, hp->head_dim);
        return GPE_ERR_FORMAT;
    }
    if (hp->n_rot > GPE_MAX_ROT) {
        seterr(err, errlen, "rope.dimension_count %d is above this engine's limit %d", hp->n_rot,
               GPE_MAX_ROT);
        return GPE_ERR_UNSUPPORTED;
    }

    hp->rope_base = 10000.0f;
    if (get_f32(g, arch, "rope.freq_base", &hp->rope_base) && !(hp->rope_base > 0.0f)) {
        seterr(err, errlen, "rope.freq_base must be > 0");
        return GPE_ERR_FORMAT;
    }
    /* RoPE scaling: linear ("position interpolation") divides positions by
     * the factor. Other kinds change the frequencies in ways this engine
     * does not implement: refuse rather than produce wrong text. */
    hp->rope_freq_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const char *stype = gpe_gguf_get_str(g, key, NULL);
    float factor = 0.0f;
    bool have_factor = get_f32(g, arch, "rope.scaling.factor", &factor);
    if (!have_factor && get_f32(g, arch, "rope.scale_linear", &factor))
        have_factor = true;
    if (stype && strcmp(stype, "none") != 0 && strcmp(stype, "linear") != 0) {
        seterr(err, errlen, "rope scaling type '%.32s' is not supported (only linear)", stype);
        return GPE_ERR_UNSUPPORTED;
    }
    if (have_factor && !(stype && strcmp(stype, "none") == 0) && factor != 0.0f &&
        factor != 1.0f) {
        if (!(factor > 0.0f) || !isfinite(factor)) {
            seterr(err, errlen, "rope scaling factor %g is invalid", (double)factor);
            return GPE_ERR_FORMAT;
        }
        hp->rope_freq_scale = 1.0f / factor;
    }

    hp->rms_eps = 1e-5f;
    float eps;
    if (get_f32(g, arch, "attention.layer_norm_rms_epsilon", &eps)) {
        if (!(eps > 0.0f) || !isfinite(eps)) {
            seterr(err, errlen, "attention.layer_norm_rms_epsilon must be > 0");
            return GPE_ERR_FORMAT;
        }
        hp->rms_eps = eps;
    }
    return read_arch_hparams(hp, g, arch, err, errlen);
}

/* Loader state: the file, and which of its tensors the model uses (a
 * tensor nobody binds is a feature this engine would silently skip, so the
 * load refuses it, as llama.cpp does). */
typedef struct loader {
    const gpe_gguf *g;
    bool *used;   /* [n_tensors] */
    char *err;
    size_t errlen;
} loader;

static const gpe_gguf_tensor *lookup(loader *ld, const char *name)
{
    int64_t i = gpe_gguf_find_tensor(ld->g, name);
    if (i < 0)
        return NULL;
    ld->used[i] = true;
    return gpe_gguf_tensor_at(ld->g, i);
}

static gpe_status weight_view(gpe_weight *w, const gpe_gguf_tensor *t, int64_t cols,
                              int64_t row0, int64_t rows)
{
    w->type = t->type;
    w->n_cols = cols;
    w->n_rows = rows;
    w->row_bytes = gpe_row_size(t->type, cols);
    w->data = (const char *)t->data + (size_t)row0 * w->row_bytes;
    return GPE_OK;
}

static gpe_status check_type(loader *ld, const gpe_gguf_tensor *t, const char *name)
{
    if (!gpe_type_supported(t->type)) {
        seterr(ld->err, ld->errlen,
               "tensor '%s' has type %s, which this engine does not support", name,
               gpe_type_name(t->type));
        return GPE_ERR_UNSUPPORTED;
    }
    return GPE_OK;
}

/* Binds a 2-D weight of shape [rows][cols] (GGUF ne = {cols, rows}). */
static gpe_status bind_weight(loader *ld, gpe_weight *w, const char *name, int64_t cols,
                              int64_t rows)
{
    const gpe_gguf_tensor *t = lookup(ld, name);
    if (!t) {
        seterr(ld->err, ld->errlen, "tensor '%s' is missing", name);
        return GPE_ERR_FORMAT;
    }
    if (t->n_dims > 2 || t->ne[0] != cols || t->ne[1] != rows) {
        seterr(ld->err, ld->errlen,
               "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
               (long long)t->ne[0], (long long)t->ne[1], (long long)cols, (long long)rows);
        return GPE_ERR_FORMAT;
    }
    gpe_status st = check_type(ld, t, name);
    return st ? st : weight_view(w, t, cols, 0, rows);
}

/* Binds a fused weight (GGUF ne = {cols, sum of parts}) as n consecutive
 * row views: phi3's attn_qkv (q, k, v) and ffn_up (gate, up). */
static gpe_status bind_fused(loader *ld, const char *name, int64_t cols, int n,
                             gpe_weight *const *parts, const int64_t *rows)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += rows[i];
    gpe_weight whole;
    gpe_status st = bind_weight(ld, &whole, name, cols, total);
    if (st)
        return st;
    const gpe_gguf_tensor *t = gpe_gguf_tensor_get(ld->g, name);
    for (int64_t i = 0, r0 = 0; i < n; r0 += rows[i], i++)
        weight_view(parts[i], t, cols, r0, rows[i]);
    return GPE_OK;
}

/* Binds a 3-D expert tensor (GGUF ne = {cols, rows, n_exp}) as n_exp views. */
static gpe_status bind_experts(loader *ld, gpe_weight *out, const char *name, int64_t cols,
                               int64_t rows, int n_exp)
{
    const gpe_gguf_tensor *t = lookup(ld, name);
    if (!t) {
        seterr(ld->err, ld->errlen, "tensor '%s' is missing", name);
        return GPE_ERR_FORMAT;
    }
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_exp) {
        seterr(ld->err, ld->errlen,
               "tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %d]", name,
               (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)cols,
               (long long)rows, n_exp);
        return GPE_ERR_FORMAT;
    }
    gpe_status st = check_type(ld, t, name);
    if (st)
        return st;
    for (int e = 0; e < n_exp; e++)
        weight_view(&out[e], t, cols, (int64_t)e * rows, rows);
    return GPE_OK;
}

/* Binds a 1-D F32 vector of n elements. */
static gpe_status bind_vec(loader *ld, const float **out, const char *name, int64_t n)
{
    const gpe_gguf_tensor *t = lookup(ld, name);
    if (!t) {
        seterr(ld->err, ld->errlen, "tensor '%s' is missing", name);
        return GPE_ERR_FORMAT;
    }
    if (t->n_elements != n || t->ne[0] != n) {
        seterr(ld->err, ld->errlen, "tensor '%s' has %lld elements, expected %lld", name,
               (long long)t->n_elements, (long long)n);
        return GPE_ERR_FORMAT;
    }
    if (t->type != GPE_TYPE_F32) {
        seterr(ld->err, ld->errlen, "tensor '%s' has type %s, expected F32", name,
               gpe_type_name(t->type));
        return GPE_ERR_UNSUPPORTED;
    }
    *out = t->data;
    return GPE_OK;
}

/* Same, when the tensor may be absent (*out stays NULL). */
static gpe_status bind_vec_opt(loader *ld, const float **out, const char *name, int64_t n)
{
    *out = NULL;
    return gpe_gguf_find_tensor(ld->g, name) < 0 ? GPE_OK : bind_vec(ld, out, name, n);
}

/* Binds layer l's tensors as its family has them. */
static gpe_status bind_layer(loader *ld, const gpe_llama *m, int l, gpe_layer *L,
                             gpe_weight *exps)
{
    const gpe_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    const gpe_arch_kind k = hp->kind;
    const bool gemma = k == GPE_ARCH_GEMMA2 || k == GPE_ARCH_GEMMA3;
    char n[GPE_GGUF_MAX_NAME];
    gpe_status st;
#define NM(nm) (snprintf(n, sizeof n, "blk.%d.%s", l, nm), n)
    if ((st = bind_vec(ld, &L->attn_norm, NM("attn_norm.weight"), E)))
        return st;
    if (k == GPE_ARCH_PHI3) {
        gpe_weight *parts[3] = { &L->wq, &L->wk, &L->wv };
        const int64_t rows[3] = { qd, kvd, kvd };
        if ((st = bind_fused(ld, NM("attn_qkv.weight"), E, 3, parts, rows)))
            return st;
    } else if ((st = bind_weight(ld, &L->wq, NM("attn_q.weight"), E, qd)) ||
               (st = bind_weight(ld, &L->wk, NM("attn_k.weight"), E, kvd)) ||
               (st = bind_weight(ld, &L->wv, NM("attn_v.weight"), E, kvd))) {
        return st;
    }
    if ((st = bind_weight(ld, &L->wo, NM("attn_output.weight"), qd, E)))
        return st;
    /* Biases: qwen2 requires q/k/v ones; llama-layout files may carry them. */
    if (k == GPE_ARCH_QWEN2) {
        if ((st = bind_vec(ld, &L->bq, NM("attn_q.bias"), qd)) ||
            (st = bind_vec(ld, &L->bk, NM("attn_k.bias"), kvd)) ||
            (st = bind_vec(ld, &L->bv, NM("attn_v.bias"), kvd)))
            return st;
    } else if (k == GPE_ARCH_LLAMA) {
        if ((st = bind_vec_opt(ld, &L->bq, NM("attn_q.bias"), qd)) ||
            (st = bind_vec_opt(ld, &L->bk, NM("attn_k.bias"), kvd)) ||
            (st = bind_vec_opt(ld, &L->bv, NM("attn_v.bias"), kvd)))
            return st;
    }
    if ((k == GPE_ARCH_LLAMA || k == GPE_ARCH_QWEN2) &&
        (st = bind_vec_opt(ld, &L->bo, NM("attn_output.bias"), E)))
        return st;
    if (k == GPE_ARCH_QWEN3 || k == GPE_ARCH_GEMMA3) {
        if ((st = bind_vec(ld, &L->q_norm, NM("attn_q_norm.weight"), hp->head_dim)) ||
            (st = bind_vec(ld, &L->k_norm, NM("attn_k_norm.weight"), hp->head_dim)))
            return st;
    }
    if (gemma && ((st = bind_vec(ld, &L->post_attn_norm, NM("post_attention_norm.weight"), E)) ||
                  (st = bind_vec(ld, &L->post_ffn_norm, NM("post_ffw_norm.weight"), E))))
        return st;
    if ((st = bind_vec(ld, &L->ffn_norm, NM("ffn_norm.weight"), E)))
        return st;
    if (hp->n_expert > 0) {
        const int X = hp->n_expert;
        L->exp_gate = exps;
        L->exp_up = exps + X;
        L->exp_down = exps + 2 * X;
        if (gpe_gguf_find_tensor(ld->g, NM("ffn_gate.0.weight")) >= 0) {
            seterr(ld->err, ld->errlen,
                   "tensor '%s': experts stored one tensor each (old Mixtral layout) are not "
                   "supported; reconvert to the merged ffn_*_exps layout", n);
            return GPE_ERR_UNSUPPORTED;
        }
        if ((st = bind_weight(ld, &L->w_router, NM("ffn_gate_inp.weight"), E, X)) ||
            (st = bind_experts(ld, L->exp_gate, NM("ffn_gate_exps.weight"), E, F, X)) ||
            (st = bind_experts(ld, L->exp_up, NM("ffn_up_exps.weight"), E, F, X)) ||
            (st = bind_experts(ld, L->exp_down, NM("ffn_down_exps.weight"), F, E, X)))
            return st;
    } else if (k == GPE_ARCH_PHI3) {
        gpe_weight *parts[2] = { &L->w_gate, &L->w_up };
        const int64_t rows[2] = { F, F };
        if ((st = bind_fused(ld, NM("ffn_up.weight"), E, 2, parts, rows)))
            return st;
    } else if ((st = bind_weight(ld, &L->w_gate, NM("ffn_gate.weight"), E, F)) ||
               (st = bind_weight(ld, &L->w_up, NM("ffn_up.weight"), E, F))) {
        return st;
    }
    if (hp->n_expert == 0 && (st = bind_weight(ld, &L->w_down, NM("ffn_down.weight"), F, E)))
        return st;
#undef NM
    L->swa = hp->n_swa > 0 && hp->swa_pattern > 0 && l % hp->swa_pattern < hp->swa_pattern - 1;
    L->rope_base = hp->rope_base;
    L->rope_freq_scale = hp->rope_freq_scale;
    if (k == GPE_ARCH_GEMMA3 && L->swa) {
        /* local layers: their own base, no position scaling */
        L->rope_base = hp->rope_base_swa;
        L->rope_freq_scale = 1.0f;
    }
    return GPE_OK;
}

/* An encoder block (bert, nomic-bert): attention projections (bert: three,
 * with biases; nomic-bert: one fused qkv), output projection [+ bias], the
 * two post-norms with biases, and the FFN: bert up/down with biases and
 * GELU, nomic-bert gate/up/down (SwiGLU). Biases llama.cpp treats as
 * optional are optional here too. */
static gpe_status bind_encoder_layer(loader *ld, const gpe_llama *m, int l, gpe_layer *L)
{
    const gpe_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    char n[GPE_GGUF_MAX_NAME];
    gpe_status st;
#define NM(nm) (snprintf(n, sizeof n, "blk.%d.%s", l, nm), n)
    if (gpe_gguf_find_tensor(ld->g, NM("attn_qkv.weight")) >= 0) {
        gpe_weight *parts[3] = { &L->wq, &L->wk, &L->wv };
        const int64_t rows[3] = { qd, kvd, kvd };
        if ((st = bind_fused(ld, n, E, 3, parts, rows)))
            return st;
    } else if ((st = bind_weight(ld, &L->wq, NM("attn_q.weight"), E, qd)) ||
               (st = bind_weight(ld, &L->wk, NM("attn_k.weight"), E, kvd)) ||
               (st = bind_weight(ld, &L->wv, NM("attn_v.weight"), E, kvd)) ||
               (st = bind_vec_opt(ld, &L->bq, NM("attn_q.bias"), qd)) ||
               (st = bind_vec_opt(ld, &L->bk, NM("attn_k.bias"), kvd)) ||
               (st = bind_vec_opt(ld, &L->bv, NM("attn_v.bias"), kvd))) {
        return st;
    }
    if ((st = bind_weight(ld, &L->wo, NM("attn_output.weight"), qd, E)) ||
        (st = bind_vec_opt(ld, &L->bo, NM("attn_output.bias"), E)) ||
        (st = bind_vec(ld, &L->attn_out_norm, NM("attn_output_norm.weight"), E)) ||
        (st = bind_vec(ld, &L->attn_out_norm_b, NM("attn_output_norm.bias"), E)) ||
        (st = bind_weight(ld, &L->w_up, NM("ffn_up.weight"), E, F)) ||
        (st = bind_vec_opt(ld, &L->b_up, NM("ffn_up.bias"), F)) ||
        (st = bind_weight(ld, &L->w_down, NM("ffn_down.weight"), F, E)) ||
        (st = bind_vec_opt(ld, &L->b_down, NM("ffn_down.bias"), E)) ||
        (st = bind_vec(ld, &L->out_norm, NM("layer_output_norm.weight"), E)) ||
        (st = bind_vec(ld, &L->out_norm_b, NM("layer_output_norm.bias"), E)))
        return st;
    if (hp->kind == GPE_ARCH_NOMIC_BERT &&
        (st = bind_weight(ld, &L->w_gate, NM("ffn_gate.weight"), E, F)))
        return st;
#undef NM
    L->rope_base = hp->rope_base;
    L->rope_freq_scale = hp->rope_freq_scale;
    return GPE_OK;
}

/* Encoder tensors outside the blocks: token types (optional, as in
 * llama.cpp), bert's absolute positions, the embedding LayerNorm. No
 * output norm or head: an encoder only gives hidden states. */
static gpe_status bind_encoder(loader *ld, gpe_llama *m)
{
    const gpe_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd;
    gpe_status st;
    if (gpe_gguf_find_tensor(ld->g, "token_types.weight") >= 0 &&
        (st = bind_weight(ld, &m->type_embd, "token_types.weight", E, hp->n_token_types)))
        return st;
    if (hp->kind == GPE_ARCH_BERT &&
        (st = bind_weight(ld, &m->pos_embd, "position_embd.weight", E, hp->n_ctx_train)))
        return st;
    if ((st = bind_vec(ld, &m->tok_norm, "token_embd_norm.weight", E)) ||
        (st = bind_vec(ld, &m->tok_norm_b, "token_embd_norm.bias", E)))
        return st;
    for (int l = 0; l < hp->n_layer; l++)
        if ((st = bind_encoder_layer(ld, m, l, &m->layers[l])))
            return st;
    return GPE_OK;
}

/* A decoder's output norm, output matrix (or tied), RoPE factors, blocks. */
static gpe_status bind_decoder(loader *ld, gpe_llama *m)
{
    const gpe_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    gpe_status st;
    if ((st = bind_vec(ld, &m->output_norm, "output_norm.weight", E)))
        return st;
    if (gpe_gguf_find_tensor(ld->g, "output.weight") >= 0) {
        if ((st = bind_weight(ld, &m->output, "output.weight", E, V)))
            return st;
    } else {
        m->output = m->tok_embd;
        m->tied_output = true;
    }
    if ((st = bind_vec_opt(ld, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2)))
        return st;
    for (int l = 0; l < hp->n_layer; l++) {
        gpe_weight *exps = m->experts ? m->experts + (size_t)l * 3 * (size_t)hp->n_expert : NULL;
        if ((st = bind_layer(ld, m, l, &m->layers[l], exps)))
            return st;
    }
    return GPE_OK;
}

gpe_status gpe_llama_load(gpe_llama *m, const gpe_gguf *g, char *err, size_t errlen)
{
    gpe_status st;
    gelu_init();
    memset(m, 0, sizeof *m);
    gpe_hparams *hp = &m->hp;
    if ((st = read_hparams(hp, g, err, errlen)))
        return st;

    /* Vocabulary size from the embedding matrix (the tokenizer is checked
     * against it by the caller). */
    const gpe_gguf_tensor *te = gpe_gguf_tensor_get(g, "token_embd.weight");
    if (!te) {
        seterr(err, errlen, "tensor 'token_embd.weight' is missing");
        return GPE_ERR_FORMAT;
    }
    if (te->n_dims != 2 || te->ne[1] <= 0 || te->ne[1] > MAX_VOCAB) {
        seterr(err, errlen, "tensor 'token_embd.weight' has a bad shape");
        return GPE_ERR_FORMAT;
    }
    hp->n_vocab = (int)te->ne[1];

    const int64_t n_t = gpe_gguf_n_tensors(g);
    loader ld = { g, calloc((size_t)n_t + 1, sizeof(bool)), err, errlen };
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (hp->n_expert > 0)
        m->experts = calloc((size_t)hp->n_layer * 3 * (size_t)hp->n_expert, sizeof *m->experts);
    if (!ld.used || !m->layers || (hp->n_expert > 0 && !m->experts)) {
        seterr(err, errlen, "out of memory");
        st = GPE_ERR_NOMEM;
        goto fail;
    }

    if ((st = bind_weight(&ld, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab)) ||
        (st = hp->encoder ? bind_encoder(&ld, m) : bind_decoder(&ld, m)))
        goto fail;

    for (int64_t i = 0; i < n_t; i++)
        if (!ld.used[i]) {
            seterr(err, errlen,
                   "tensor '%s' is not used by this engine's '%s' architecture (unsupported "
                   "feature)",
                   gpe_gguf_tensor_at(g, i)->name, hp->arch);
            st = GPE_ERR_UNSUPPORTED;
            goto fail;
        }

    /* Parameter count: every tensor of the file. */
    for (int64_t i = 0; i < n_t; i++)
        m->n_params += (uint64_t)gpe_gguf_tensor_at(g, i)->n_elements;
    free(ld.used);
    return GPE_OK;

fail:
    free(ld.used);
    gpe_llama_free(m);
    return st;
}

/* Tell the kernel the whole pages inside [p, p + n) of the read-only file
 * mapping are not needed (they are read back from the file if touched). */
static void drop_pages(const void *p, size_t n)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + pg - 1) / pg * pg, e = ((uintptr_t)p + n) / pg * pg;
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);
}

/* The dense matmul weights of the model (experts are left on their rows). */
static int pack_list(gpe_llama *m, gpe_weight **ws, int cap)
{
    int n = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        gpe_layer *L = &m->layers[l];
        gpe_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++)
            if (lw[i]->data && n < cap)
                ws[n++] = lw[i];
    }
    if (n < cap && m->output.data)
        ws[n++] = &m->output;
    return n;
}

/* One weight to pack: where it goes, and whether its file pages may go. */
typedef struct pack_item {
    gpe_weight *w;
    uint8_t *dst;
    bool drop;
} pack_item;

typedef struct pack_job {
    pack_item *it;
    int n;
    atomic_int next;
} pack_job;

static void *pack_worker(void *arg)
{
    pack_job *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        gpe_weight *w = j->it[i].w;
        gpe_pack_rows(w->type, w->data, w->n_rows, w->n_cols, j->it[i].dst);
        /* the packed rows' file pages are not read again (a tied output is
         * also the token embedding, which is): let the kernel drop them now
         * rather than count the weights twice in RSS */
        if (j->it[i].drop)
            drop_pages(w->data, (size_t)(w->n_rows / 8 * 8) * w->row_bytes);
    }
    return NULL;
}

bool gpe_llama_pack(gpe_llama *m)
{
    const int cap = 7 * m->hp.n_layer + 1;
    gpe_weight **ws = malloc((size_t)cap * sizeof *ws);
    pack_item *items = malloc((size_t)cap * sizeof *items);
    bool ok = false;
    if (!ws || !items)
        goto out;
    const int n = pack_list(m, ws, cap);
    size_t total = 0;
    int ni = 0;
    for (int i = 0; i < n; i++) {
        const size_t b = gpe_pack_size(ws[i]->type, ws[i]->n_rows, ws[i]->n_cols);
        total += (b + 63) / 64 * 64;
    }
    ok = total == 0;
    uint8_t *buf = total ? aligned_alloc(64, total) : NULL;
    if (!buf)
        goto out;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t b = gpe_pack_size(ws[i]->type, ws[i]->n_rows, ws[i]->n_cols);
        if (!b)
            continue;
        items[ni++] = (pack_item){ws[i], buf + off, !(ws[i] == &m->output && m->tied_output)};
        off += (b + 63) / 64 * 64;
    }
    /* A few hundred MB to tens of GB of copying: spread over the cores
     * (agent start-up waits for it). Threads that cannot start leave
     * their share to the others and to this one. */
    pack_job job = {.it = items, .n = ni};
    atomic_init(&job.next, 0);
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = nc < 1 ? 1 : nc > 16 ? 16 : (int)nc, started = 0;
    pthread_t th[16];
    for (int t = 1; t < nt && t < ni; t++)
        if (pthread_create(&th[started], NULL, pack_worker, &job) == 0)
            started++;
    pack_worker(&job);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    for (int i = 0; i < ni; i++)
        items[i].w->packed = items[i].dst;
    m->packed = buf;
    m->packed_bytes = total;
    ok = true;
out:
    free(ws);
    free(items);
    return ok;
}

void gpe_llama_free(gpe_llama *m)
{
    if (!m)
        return;
    free(m->packed);
    m->packed = NULL;
    free(m->layers);
    m->layers = NULL;
    free(m->experts);
    m->experts = NULL;
}

/* ============================================================== scratch */

static void *xalloc(size_t n)
{
    /* 64-byte aligned (cache line, AVX-512 loads), rounded up as
     * aligned_alloc requires. */
    size_t sz = (n + 63) & ~(size_t)63;
    return aligned_alloc(64, sz ? sz : 64);
}

int gpe_fwd_init(gpe_fwd *f, const gpe_llama *m, int n_batch, int n_ctx, int n_threads)
{
    const gpe_hparams *hp = &m->hp;
    memset(f, 0, sizeof *f);
    if (n_batch <= 0 || n_ctx <= 0 || n_threads <= 0)
        return -1;
    f->n_batch = n_batch;
    f->n_ctx = n_ctx;
    f->n_threads = n_threads;
    size_t B = (size_t)n_batch;
    size_t qd = (size_t)hp->n_head * (size_t)hp->head_dim;
    size_t kvd = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    size_t maxc = (size_t)hp->n_embd;
    if (qd > maxc) maxc = qd;
    if ((size_t)hp->n_ff > maxc) maxc = (size_t)hp->n_ff;

    f->x = xalloc(B * (size_t)hp->n_embd * sizeof(float));
    f->xn = xalloc(B * (size_t)hp->n_embd * sizeof(float));
    f->q = xalloc(B * qd * sizeof(float));
    f->k = xalloc(B * kvd * sizeof(float));
    f->v = xalloc(B * kvd * sizeof(float));
    f->att = xalloc(B * qd * sizeof(float));
    f->gate = xalloc(B * (size_t)hp->n_ff * sizeof(float));
    f->up = xalloc(B * (size_t)hp->n_ff * sizeof(float));
    /* Widest converted row: F32 (4 bytes per element) is an upper bound of
     * every vec_dot type (Q8_K is 292/256, F16 2). */
    f->act_bytes = B * maxc * sizeof(float);
    f->act = xalloc(f->act_bytes);
    f->act2 = xalloc(f->act_bytes);
    const bool attn_ok = gpe_attn_ws_init(&f->attn, n_batch, n_ctx, hp->head_dim, n_threads) == 0;
    bool moe_ok = true;
    if (hp->n_expert > 0) {
        const size_t K = (size_t)hp->n_expert_used, E = (size_t)hp->n_embd;
        f->moe_x = xalloc(B * E * sizeof(float));
        f->moe_y = xalloc(B * E * sizeof(float));
        f->moe_out = xalloc(B * K * E * sizeof(float));
        f->router = xalloc(B * (size_t)hp->n_expert * sizeof(float));
        f->moe_sel = xalloc(B * K * sizeof(int));
        f->moe_w = xalloc(B * K * sizeof(float));
        f->moe_tok = xalloc(B * sizeof(int));
        f->moe_rank = xalloc(B * sizeof(int));
        moe_ok = f->moe_x && f->moe_y && f->moe_out && f->router && f->moe_sel && f->moe_w &&
                 f->moe_tok && f->moe_rank;
    }
    if (!f->x || !f->xn || !f->q || !f->k || !f->v || !f->att || !f->gate || !f->up ||
        !f->act || !f->act2 || !attn_ok || !moe_ok) {
        gpe_fwd_free(f);
        return -1;
    }
    return 0;
}

int gpe_fwd_reserve_logits(gpe_fwd *f, const gpe_llama *m, int n_out)
{
    if (n_out <= f->logits_cap)
        return 0;
    float *p = xalloc((size_t)n_out * (size_t)m->hp.n_vocab * sizeof(float));
    if (!p)
        return -1;
    free(f->logits);
    f->logits = p;
    f->logits_cap = n_out;
    return 0;
}

void gpe_fwd_free(gpe_fwd *f)
{
    if (!f)
        return;
    free(f->x);
    free(f->xn);
    free(f->q);
    free(f->k);
    free(f->v);
    free(f->att);
    free(f->gate);
    free(f->up);
    free(f->act);
    free(f->act2);
    gpe_attn_ws_free(&f->attn);
    free(f->logits);
    free(f->moe_x);
    free(f->moe_y);
    free(f->moe_out);
    free(f->router);
    free(f->moe_sel);
    free(f->moe_w);
    free(f->moe_tok);
    free(f->moe_rank);
    memset(f, 0, sizeof *f);
}

/* ========================================================= parallel jobs */

/* Worker count for a job of `work` multiply-adds: small jobs run on fewer
 * threads because waking a worker costs more than it saves. Results do not
 * depend on this choice (each element is computed the same way by whichever
 * thread owns it). */
static int nth_for(gpe_pool *pool, double work)
{
    int n = gpe_pool_size(pool);
    double per = 32768.0;
    int want = (int)(work / per);
    if (want < 1)
        want = 1;
    return want < n ? want : n;
}

/* ---- matmuls sharing one input: Y_i = X W_i^T for up to 3 weights. ---- */

typedef struct mm_item {
    const gpe_weight *w;
    float *out;             /* [n_tok][w->n_rows] */
    const void *act;        /* converted X for w's vec_dot type */
    size_t act_row_bytes;
} mm_item;

typedef struct mm_job {
    mm_item it[3];
    int n_items;
    const float *x;         /* [n_tok][n_cols] input (for the conversion step) */
    int n_tok;
    /* conversion step: distinct weight types needing a converted copy */
    gpe_type cvt_type[3];
    void *cvt_dst[3];
    size_t cvt_row_bytes[3];
    int n_cvt;
    int64_t n_cols;
} mm_job;

static void cvt_fn(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    int64_t lo, hi;
    gpe_pool_split(j->n_tok, ith, nth, &lo, &hi);
    for (int c = 0; c < j->n_cvt; c++)
        for (int64_t t = lo; t < hi; t++)
            gpe_quantize_row_act(j->cvt_type[c], j->x + t * j->n_cols,
                                 (char *)j->cvt_dst[c] + (size_t)t * j->cvt_row_bytes[c],
                                 j->n_cols);
}

static void mm_fn(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    for (int i = 0; i < j->n_items; i++) {
        const mm_item *it = &j->it[i];
        int64_t lo, hi;
        if (it->w->packed) {
            /* whole groups of 8 rows per worker; the last takes the tail */
            const int64_t ng = it->w->n_rows / 8;
            gpe_pool_split(ng, ith, nth, &lo, &hi);
            lo *= 8;
            hi = ith == nth - 1 ? it->w->n_rows : hi * 8;
            if (lo < hi)
                gpe_matmul_packed(it->w->type, it->w->packed, it->w->data, lo, hi, it->w->n_cols,
                                  it->act, j->n_tok, it->act_row_bytes, it->out, it->w->n_rows);
            continue;
        }
        gpe_pool_split(it->w->n_rows, ith, nth, &lo, &hi);
        if (lo < hi)
            gpe_matmul_rows(it->w->type, it->w->data, lo, hi, it->w->n_cols, it->act, j->n_tok,
                            it->act_row_bytes, it->out, it->w->n_rows);
    }
}

/* out_i[t][r] = dot(W_i row r, x row t). All W_i have n_cols columns. The
 * input is converted once per distinct vec_dot type (F32 needs none). */
static void matmul_multi(gpe_fwd *f, gpe_pool *pool, const float *x, int n_tok, int n,
                         const gpe_weight *const *ws, float *const *outs)
{
    mm_job j;
    memset(&j, 0, sizeof j);
    j.x = x;
    j.n_tok = n_tok;
    j.n_items = n;
    j.n_cols = ws[0]->n_cols;
    void *bufs[2] = { f->act, f->act2 };
    double work = 0.0;
    for (int i = 0; i < n; i++) {
        const gpe_weight *w = ws[i];
        gpe_type vt = gpe_vec_dot_type(w->type);
        j.it[i].w = w;
        j.it[i].out = outs[i];
        work += (double)w->n_rows * (double)w->n_cols * n_tok;
        if (vt == GPE_TYPE_F32) {
            j.it[i].act = x;
            j.it[i].act_row_bytes = (size_t)j.n_cols * sizeof(float);
            continue;
        }
        int c;
        for (c = 0; c < j.n_cvt; c++)
            if (gpe_vec_dot_type(j.cvt_type[c]) == vt)
                break;
        if (c == j.n_cvt) {
            if (c == 2) {
                /* Three distinct non-F32 vec_dot types among q/k/v cannot
                 * happen with two buffers; split the call instead. */
                matmul_multi(f, pool, x, n_tok, i, ws, outs);
                matmul_multi(f, pool, x, n_tok, n - i, ws + i, outs + i);
                return;
            }
            j.cvt_type[c] = w->type;
            j.cvt_dst[c] = bufs[c];
            j.cvt_row_bytes[c] = gpe_row_size(vt, j.n_cols);
            j.n_cvt++;
        }
        j.it[i].act = j.cvt_dst[c];
        j.it[i].act_row_bytes = j.cvt_row_bytes[c];
    }
    if (j.n_cvt > 0)
        gpe_pool_run_n(pool, nth_for(pool, (double)n_tok * (double)j.n_cols * 64.0), cvt_fn,
                       &j);
    gpe_pool_run_n(pool, nth_for(pool, work), mm_fn, &j);
}

void gpe_model_matmul(gpe_fwd *f, gpe_pool *pool, const float *x, int n_tok, int n,
                      const gpe_weight *const *ws, float *const *outs)
{
    matmul_multi(f, pool, x, n_tok, n, ws, outs);
}

int gpe_model_nth(gpe_pool *pool, double work)
{
    return nth_for(pool, work);
}

static void matmul(gpe_fwd *f, gpe_pool *pool, const float *x, int n_tok, const gpe_weight *w,
                   float *out)
{
    const gpe_weight *ws[1] = { w };
    float *outs[1] = { out };
    matmul_multi(f, pool, x, n_tok, 1, ws, outs);
}

/* ---- RMSNorm (as ggml: sum of squares in double, scale in float) ---- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++)
        out[i] = (x[i] * scale) * w[i];
}

/* ---- RoPE on q and k, then store k and v into the cache ---- */

typedef struct rope_job {
    const gpe_llama *m;
    gpe_fwd *f;
    gpe_kv *kv;
    const int *pos, *seq;
    int n_tok;
    int layer;
} rope_job;

/* Rotates the first n_rot dims of each of n_heads heads: adjacent pairs
 * (llama.cpp's "normal" RoPE) or pairs half a rotation apart (NEOX). cs
 * holds cos/sin per pair. */
static void rope_apply(float *x, int n_heads, int hd, int n_rot, bool neox, const float *cs)
{
    const int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * (size_t)hd;
        for (int i = 0; i < n_rot; i += 2) {
            const float c = cs[i], s = cs[i + 1];
            float *p0 = neox ? v + i / 2 : v + i;
            float *p1 = neox ? v + i / 2 + half : v + i + 1;
            const float x0 = *p0, x1 = *p1;
            *p0 = x0 * c - x1 * s;
            *p1 = x0 * s + x1 * c;
        }
    }
}

static void add_bias(float *x, const float *b, size_t n)
{
    if (b)
        for (size_t i = 0; i < n; i++)
            x[i] += b[i];
}

/* RMS norm of each head (qwen3, gemma3: before RoPE). */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps);
static void head_norm(float *x, int n_heads, int hd, const float *w, float eps)
{
    if (!w)
        return;
    for (int h = 0; h < n_heads; h++)
        rmsnorm(x + (size_t)h * hd, x + (size_t)h * hd, w, hd, eps);
}

static void rope_fn(void *arg, int ith, int nth)
{
    rope_job *j = arg;
    const gpe_hparams *hp = &j->m->hp;
    const gpe_layer *L = &j->m->layers[j->layer];
    const int hd = hp->head_dim, n_rot = hp->n_rot;
    const size_t qd = (size_t)hp->n_head * hd, kvd = (size_t)hp->n_head_kv * hd;
    /* theta_i = pos * base^(-2i/n_rot), computed by repeated multiplication
     * in float like ggml's rope cache so that angles round the same way. */
    const float theta_scale = powf(L->rope_base, -2.0f / (float)n_rot);
    float csp[GPE_MAX_ROT];   /* cos, sin per pair; n_rot <= GPE_MAX_ROT (checked at load) */
    int64_t lo, hi;
    gpe_pool_split(j->n_tok, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float theta = (float)j->pos[t];
        for (int i = 0; i < n_rot; i += 2) {
            float th = theta;
            if (j->m->rope_freqs)
                th = th / j->m->rope_freqs[i / 2];
            th *= L->rope_freq_scale;
            csp[i] = cosf(th);
            csp[i + 1] = sinf(th);
            theta *= theta_scale;
        }
        float *q = j->f->q + (size_t)t * qd;
        float *k = j->f->k + (size_t)t * kvd;
        float *v = j->f->v + (size_t)t * kvd;
        add_bias(q, L->bq, qd);
        add_bias(k, L->bk, kvd);
        add_bias(v, L->bv, kvd);
        head_norm(q, hp->n_head, hd, L->q_norm, hp->rms_eps);
        head_norm(k, hp->n_head_kv, hd, L->k_norm, hp->rms_eps);
        rope_apply(q, hp->n_head, hd, n_rot, hp->rope_neox, csp);
        rope_apply(k, hp->n_head_kv, hd, n_rot, hp->rope_neox, csp);
        gpe_kv_put(j->kv, j->layer, j->seq[t], j->pos[t], k, v);
    }
}

/* ---- gated FFN activation: gate = act(gate) * up ---- */

typedef struct swiglu_job {
    float *gate;
    const float *up;
    int64_t n;
    bool gelu;
} swiglu_job;

/* GELU, tanh approximation, evaluated as llama.cpp's CPU backend does:
 * through F16 (input rounded to F16, result rounded to F16), with the
 * tails taken exactly. */
static float gelu_of_f16(uint16_t h)
{
    const float xr = gpe_fp16_to_fp32(h);
    const float y = 0.5f * xr *
                    (1.0f + tanhf(0.79788456080286535587989211986876f * xr *
                                  (1.0f + 0.044715f * xr * xr)));
    return gpe_fp16_to_fp32(gpe_fp32_to_fp16(y));
}

/* The input is rounded to F16 first, so GELU has only 65536 possible
 * results: a table of them (256 KB, filled once) gives the same values as
 * evaluating tanhf, which was more than half of an encoder's time. */
static float gelu_table[65536];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_fill(void)
{
    for (uint32_t h = 0; h < 65536; h++)
        gelu_table[h] = gelu_of_f16((uint16_t)h);
}

static void gelu_init(void)
{
    pthread_once(&gelu_once, gelu_table_fill);
}

void gpe_model_gelu_row(float *x, int64_t n)
{
    /* Filled here, not only when a file is loaded: the CUDA self-test and
     * any caller that builds a model in memory reach this without
     * gpe_llama_load (an empty table made GELU 0: gemma's CPU reference
     * was wrong). After the first call this is one load and a branch. */
    gelu_init();
    /* the F16 rounding of a chunk at once (vectorised where the CPU has
     * it; the same round-to-nearest-even as gpe_fp32_to_fp16), then the
     * table */
    uint16_t h[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        const int64_t m = n - i0 < 256 ? n - i0 : 256;
        float *v = x + i0;
        gpe_quantize_row(GPE_TYPE_F16, v, h, m);
        for (int64_t i = 0; i < m; i++)
            v[i] = v[i] <= -10.0f ? 0.0f : v[i] >= 10.0f ? v[i] : gelu_table[h[i]];
    }
}

void gpe_model_silu_mul_row(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        gate[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

static void swiglu_fn(void *arg, int ith, int nth)
{
    swiglu_job *j = arg;
    int64_t lo, hi;
    gpe_pool_split(j->n, ith, nth, &lo, &hi);
    if (j->gelu) {
        gpe_model_gelu_row(j->gate + lo, hi - lo);
        for (int64_t i = lo; i < hi; i++)
            j->gate[i] *= j->up[i];
        return;
    }
    gpe_model_silu_mul_row(j->gate + lo, j->up + lo, hi - lo);
}

/* out[n_tok][n_embd] = w_down(act(w_gate x) * w_up x), the dense FFN; uses
 * f->gate and f->up. */
static void ffn_dense(gpe_fwd *f, gpe_pool *pool, const gpe_hparams *hp, const float *x,
                      int n, const gpe_weight *wg, const gpe_weight *wu, const gpe_weight *wd,
                      float *out)
{
    const gpe_weight *ws[2] = { wg, wu };
    float *outs[2] = { f->gate, f->up };
    matmul_multi(f, pool, x, n, 2, ws, outs);
    swiglu_job sj = { f->gate, f->up, (int64_t)n * hp->n_ff, hp->gelu };
    gpe_pool_run_n(pool, nth_for(pool, (double)sj.n * (hp->gelu ? 32.0 : 16.0)), swiglu_fn,
                   &sj);
    matmul(f, pool, f->gate, n, wd, out);
}

/* Mixture of experts (Mixtral's scheme, as llama.cpp computes it): per
 * token, p = softmax(router logits) over all experts, the n_expert_used
 * largest (lowest index first on ties) with weights p / sum(chosen p); each
 * expert runs once over the tokens routed to it; a token's outputs are
 * summed in rank order (best expert first). xn holds the normed inputs;
 * the result goes to out. */
static void ffn_moe(gpe_fwd *f, gpe_pool *pool, const gpe_hparams *hp, const gpe_layer *L,
                    const float *xn, int n, float *out)
{
    const int X = hp->n_expert, K = hp->n_expert_used, E = hp->n_embd;
    matmul(f, pool, xn, n, &L->w_router, f->router);
    for (int t = 0; t < n; t++) {
        float *p = f->router + (size_t)t * X;
        float mx = -INFINITY;
        for (int e = 0; e < X; e++)
            if (p[e] > mx)
                mx = p[e];
        double sum = 0.0;
        for (int e = 0; e < X; e++) {
            p[e] = expf(p[e] - mx);
            sum += (double)p[e];
        }
        const float inv = (float)(1.0 / sum);
        for (int e = 0; e < X; e++)
            p[e] *= inv;
        int *sel = f->moe_sel + (size_t)t * K;
        float *w = f->moe_w + (size_t)t * K;
        float wsum = 0.0f;
        for (int r = 0; r < K; r++) {
            int best = -1;
            for (int e = 0; e < X; e++) {
                bool taken = false;
                for (int q = 0; q < r; q++)
                    taken |= sel[q] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            sel[r] = best;
            w[r] = p[best];
            wsum += w[r];
        }
        for (int r = 0; r < K; r++)
            w[r] /= wsum;
    }
    for (int e = 0; e < X; e++) {
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int r = 0; r < K; r++)
                if (f->moe_sel[(size_t)t * K + r] == e) {
                    f->moe_tok[m] = t;
                    f->moe_rank[m] = r;
                    memcpy(f->moe_x + (size_t)m * E, xn + (size_t)t * E, (size_t)E * sizeof(float));
                    m++;
                }
        if (m == 0)
            continue;
        ffn_dense(f, pool, hp, f->moe_x, m, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e],
                  f->moe_y);
        for (int i = 0; i < m; i++) {
            const int t = f->moe_tok[i], r = f->moe_rank[i];
            const float w = f->moe_w[(size_t)t * K + r];
            const float *y = f->moe_y + (size_t)i * E;
            float *o = f->moe_out + ((size_t)t * K + r) * E;
            for (int d = 0; d < E; d++)
                o[d] = y[d] * w;
        }
    }
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * E;
        const float *y = f->moe_out + (size_t)t * K * E;
        memcpy(o, y, (size_t)E * sizeof(float));
        for (int r = 1; r < K; r++)
            for (int d = 0; d < E; d++)
                o[d] += y[(size_t)r * E + d];
    }
}

/* x += (norm ? rmsnorm(y) * norm : y) for n rows (gemma's post-norms). */
static void add_residual(float *x, float *y, const float *norm, int n, int E, float eps)
{
    for (int t = 0; t < n; t++) {
        float *yr = y + (size_t)t * E;
        if (norm)
            rmsnorm(yr, yr, norm, E, eps);
        float *xr = x + (size_t)t * E;
        for (int i = 0; i < E; i++)
            xr[i] += yr[i];
    }
}

/* ============================================================== forward */

/* Embedding rows and every layer: leaves the residual stream of the n
 * tokens in f->x (before the output norm). */
static void run_layers(const gpe_llama *m, gpe_fwd *f, gpe_kv *kv, gpe_pool *pool,
                       const int32_t *tokens, const int *pos, const int *seq, int n)
{
    const gpe_hparams *hp = &m->hp;
    const int E = hp->n_embd;
    const size_t qd = (size_t)hp->n_head * hp->head_dim;

    /* Embedding rows (gemma scales them by sqrt(n_embd)). */
    for (int t = 0; t < n; t++) {
        float *xr = f->x + (size_t)t * E;
        gpe_dequantize_row(m->tok_embd.type,
                           (const char *)m->tok_embd.data +
                               (size_t)tokens[t] * m->tok_embd.row_bytes,
                           xr, E);
        if (hp->embd_scale != 1.0f)
            for (int i = 0; i < E; i++)
                xr[i] *= hp->embd_scale;
    }

    for (int l = 0; l < hp->n_layer; l++) {
        const gpe_layer *L = &m->layers[l];

        /* Attention block. */
        for (int t = 0; t < n; t++)
            rmsnorm(f->xn + (size_t)t * E, f->x + (size_t)t * E, L->attn_norm, E, hp->rms_eps);
        {
            const gpe_weight *ws[3] = { &L->wq, &L->wk, &L->wv };
            float *outs[3] = { f->q, f->k, f->v };
            matmul_multi(f, pool, f->xn, n, 3, ws, outs);
        }
        rope_job rj = { m, f, kv, pos, seq, n, l };
        gpe_pool_run_n(pool, nth_for(pool, (double)n * (double)(qd * 8)), rope_fn, &rj);

        double attn_work = 0.0;
        for (int t = 0; t < n; t++)
            attn_work += (double)(pos[t] + 1) * (double)qd * 2.0;
        const gpe_attn_args aa = {
            .kv = kv, .layer = l, .q = f->q, .out = f->att, .pos = pos, .seq = seq, .n_tok = n,
            .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .scale = hp->attn_scale, .softcap = hp->attn_softcap,
            .window = L->swa ? hp->n_swa : 0,
        };
        gpe_attn_run(&f->attn, pool, nth_for(pool, attn_work), &aa);

        /* x += Wo att; the matmul writes into xn, then a plain add. */
        matmul(f, pool, f->att, n, &L->wo, f->xn);
        if (L->bo)
            for (int t = 0; t < n; t++)
                add_bias(f->xn + (size_t)t * E, L->bo, (size_t)E);
        add_residual(f->x, f->xn, L->post_attn_norm, n, E, hp->rms_eps);

        /* Feed-forward block. */
        for (int t = 0; t < n; t++)
            rmsnorm(f->xn + (size_t)t * E, f->x + (size_t)t * E, L->ffn_norm, E, hp->rms_eps);
        if (hp->n_expert > 0)
            ffn_moe(f, pool, hp, L, f->xn, n, f->xn);
        else
            ffn_dense(f, pool, hp, f->xn, n, &L->w_gate, &L->w_up, &L->w_down, f->xn);
        add_residual(f->x, f->xn, L->post_ffn_norm, n, E, hp->rms_eps);
    }
}

int gpe_llama_forward(const gpe_llama *m, gpe_fwd *f, gpe_kv *kv, gpe_pool *pool,
                      const int32_t *tokens, const int *pos, const int *seq, const bool *want,
                      int n, float *logits)
{
    const gpe_hparams *hp = &m->hp;
    const int E = hp->n_embd;
    run_layers(m, f, kv, pool, tokens, pos, seq, n);

    /* Output: final norm and logits only for the entries that asked. */
    int n_out = 0;
    for (int t = 0; t < n; t++) {
        if (!want[t])
            continue;
        rmsnorm(f->xn + (size_t)n_out * E, f->x + (size_t)t * E, m->output_norm, E,
                hp->rms_eps);
        n_out++;
    }
    if (n_out > 0)
        matmul(f, pool, f->xn, n_out, &m->output, logits);
    if (hp->final_softcap > 0.0f) {
        const float cap = hp->final_softcap, inv = 1.0f / cap;
        for (size_t i = 0; i < (size_t)n_out * (size_t)hp->n_vocab; i++)
            logits[i] = cap * tanhf(logits[i] * inv);
    }
    return n_out;
}

void gpe_llama_hidden(const gpe_llama *m, gpe_fwd *f, gpe_kv *kv, gpe_pool *pool,
                      const int32_t *tokens, const int *pos, const int *seq, int n,
                      float *hidden)
{
    const gpe_hparams *hp = &m->hp;
    const int E = hp->n_embd;
    if (hp->encoder) {
        gpe_encoder_hidden(m, f, pool, tokens, pos, seq, n, hidden);
        return;
    }
    run_layers(m, f, kv, pool, tokens, pos, seq, n);
    for (int t = 0; t < n; t++)
        rmsnorm(hidden + (size_t)t * E, f->x + (size_t)t * E, m->output_norm, E, hp->rms_eps);
}
