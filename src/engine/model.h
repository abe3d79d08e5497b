/*
 * model: the llama-family transformer: hyper-parameters read from GGUF
 * metadata, weights as pointers into the file's mapping, and the CPU forward
 * pass over a batch of tokens of one or more sequences.
 *
 * Architecture (llama.cpp's conventions for GGUF "llama" files):
 *
 *   x = token_embd[tok]                                   [n_embd]
 *   for each layer l:
 *     h  = rmsnorm(x) * attn_norm
 *     q  = attn_q h,  k = attn_k h,  v = attn_v h         [n_head*hd], [n_head_kv*hd] x2
 *     q, k rotated by RoPE "normal": adjacent pairs (x[2i], x[2i+1]) of the
 *          first n_rot dims, theta_i = pos * freq_scale * base^(-2i/n_rot)
 *          (divided by rope_freqs[i] when the file has that tensor)
 *     k, v appended to the KV cache of the token's sequence
 *     a  = softmax(q k^T / sqrt(hd), causal) v  per head; head h reads KV
 *          head h / (n_head / n_head_kv) (grouped-query attention)
 *     x += attn_output a
 *     h  = rmsnorm(x) * ffn_norm
 *     x += ffn_down (silu(ffn_gate h) * ffn_up h)         (SwiGLU)
 *   logits = output (rmsnorm(x) * output_norm)            output = token_embd when absent (tied)
 *
 * Matmuls follow llama.cpp's scheme so that its quantized references are
 * matched closely: each activation row is converted once per matmul to the
 * weight type's vec_dot type (quant.h), then output rows are split across
 * the thread pool. Every output element is computed by exactly one thread
 * with the same code whatever the thread count or batch composition, so the
 * results are bitwise identical for 1, 2 or N threads and for a sequence
 * decoded alone or together with others.
 *
 * Internal to the engine.
 */
#ifndef GPE_MODEL_H
#define GPE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"
#include "engine/kv.h"
#include "engine/quant.h"
#include "engine/threadpool.h"

/* Hyper-parameters (Config). */
typedef struct gpe_hparams {
    char arch[32];        /* general.architecture */
    int n_vocab;
    int n_ctx_train;
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;         /* n_embd / n_head (llama.attention.key_length when present) */
    int n_ff;
    int n_rot;            /* rope.dimension_count, default head_dim */
    float rope_base;      /* rope.freq_base, default 10000 */
    float rope_freq_scale; /* 1 / rope.scaling.factor for linear scaling, else 1 */
    float rms_eps;        /* attention.layer_norm_rms_epsilon */
} gpe_hparams;

/* A 2-D weight: n_rows rows of n_cols elements of one type, row-major. */
typedef struct gpe_weight {
    const void *data;     /* row 0, inside the mapping */
    gpe_type type;
    int64_t n_cols;       /* elements per row (GGUF ne[0]) */
    int64_t n_rows;       /* GGUF ne[1] */
    size_t row_bytes;
} gpe_weight;

typedef struct gpe_layer {
    const float *attn_norm;   /* [n_embd] (F32) */
    gpe_weight wq;            /* [n_head*hd rows][n_embd] */
    gpe_weight wk;            /* [n_head_kv*hd][n_embd] */
    gpe_weight wv;            /* [n_head_kv*hd][n_embd] */
    gpe_weight wo;            /* [n_embd][n_head*hd] */
    const float *ffn_norm;    /* [n_embd] */
    gpe_weight w_gate;        /* [n_ff][n_embd] */
    gpe_weight w_up;          /* [n_ff][n_embd] */
    gpe_weight w_down;        /* [n_embd][n_ff] */
} gpe_layer;

/* Weights (read-only after load; shared by every context). */
typedef struct gpe_llama {
    gpe_hparams hp;
    gpe_weight tok_embd;      /* [n_vocab][n_embd] */
    const float *output_norm; /* [n_embd] */
    gpe_weight output;        /* [n_vocab][n_embd]; == tok_embd when tied */
    bool tied_output;
    const float *rope_freqs;  /* [n_rot/2] or NULL */
    gpe_layer *layers;        /* [n_layer] */
    uint64_t n_params;
} gpe_llama;

/* Read hyper-parameters and bind weights from an open GGUF. Refuses an
 * architecture other than the llama family (GPE_ERR_UNSUPPORTED, naming
 * it), a missing or misshapen tensor (GPE_ERR_FORMAT, naming it) and a
 * tensor type without a dot product (GPE_ERR_UNSUPPORTED). */
gpe_status gpe_llama_load(gpe_llama *m, const gpe_gguf *g, char *err, size_t errlen);
void gpe_llama_free(gpe_llama *m);

/* Scratch for one context (RunState), sized for n_batch tokens. */
typedef struct gpe_fwd {
    int n_batch;
    int n_ctx;
    int n_threads;
    float *x;        /* [n_batch][n_embd] residual stream */
    float *xn;       /* [n_batch][n_embd] normed */
    float *q;        /* [n_batch][n_head*hd] */
    float *k;        /* [n_batch][kv_dim] */
    float *v;        /* [n_batch][kv_dim] */
    float *att;      /* [n_batch][n_head*hd] attention output */
    float *gate;     /* [n_batch][n_ff] */
    float *up;       /* [n_batch][n_ff] */
    void *act;       /* converted activations, act_bytes */
    size_t act_bytes;
    void *act2;      /* second conversion buffer (matmuls of two vec_dot types) */
    float *scores;   /* [n_threads][n_ctx] attention scores */
    float *logits;   /* [logits_cap][n_vocab]: rows of the entries that asked */
    int logits_cap;  /* rows allocated (grown by gpe_fwd_reserve_logits) */
} gpe_fwd;

int gpe_fwd_init(gpe_fwd *f, const gpe_llama *m, int n_batch, int n_ctx, int n_threads);
void gpe_fwd_free(gpe_fwd *f);
/* Make room for n_out rows of logits (called before forward, which cannot
 * fail). Returns 0 or -1 when memory is short. */
int gpe_fwd_reserve_logits(gpe_fwd *f, const gpe_llama *m, int n_out);

/* Run the model on n <= n_batch tokens (tokens[i] of sequence seq[i] at
 * position pos[i]; already validated by the caller: ids in range, every
 * earlier position of each sequence already in the cache or earlier in this
 * call, positions inside n_ctx). Writes K/V rows into the cache (the caller
 * commits the lengths) and the logits of the entries with want[i], in batch
 * order, as consecutive rows of n_vocab floats at logits. Returns the number
 * of rows written. Cannot fail. */
int gpe_llama_forward(const gpe_llama *m, gpe_fwd *f, gpe_kv *kv, gpe_pool *pool,
                      const int32_t *tokens, const int *pos, const int *seq, const bool *want,
                      int n, float *logits);

#endif
