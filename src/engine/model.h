/*
 * model: the transformer families this engine runs (llama, mistral and
 * Llama-3 files, Mixtral-style MoE, qwen2, qwen3, phi3, gemma2, gemma3):
 * hyper-parameters read from GGUF metadata, weights as pointers into the
 * file's mapping, and the CPU forward pass over a batch of tokens of one or
 * more sequences.
 *
 * BERT-style encoders (bert, nomic-bert: embeddings only) share the loader,
 * the weights' layout and the matmuls; their forward pass is encoder.c's
 * (hp.encoder; post-norm blocks, bidirectional attention, no KV cache).
 *
 * Architecture (llama.cpp's conventions for GGUF files), with the parts that
 * only some families have in [brackets]:
 *
 *   x = token_embd[tok]  [* sqrt(n_embd): gemma]          [n_embd]
 *   for each layer l:
 *     h  = rmsnorm(x) * attn_norm
 *     q  = attn_q h [+ bq], k = attn_k h [+ bk], v = attn_v h [+ bv]
 *          (phi3: one fused attn_qkv, bound as three row views)
 *     [q, k: rmsnorm per head * attn_q_norm / attn_k_norm: qwen3, gemma3]
 *     q, k rotated by RoPE: "normal" (llama: pairs x[2i], x[2i+1]) or NEOX
 *          (the others: pairs x[i], x[i + n_rot/2]) over the first n_rot
 *          dims, theta_i = pos * freq_scale * base^(-2i/n_rot), divided by
 *          rope_freqs[i] when the file has that tensor; gemma3's local layers
 *          use their own base and no scaling
 *     k, v appended to the KV cache of the token's sequence
 *     s  = q k^T * attn_scale [softcap: cap * tanh(s / cap): gemma2]
 *          causal, [sliding window on some layers: a query at p sees keys
 *          p - n_swa + 1 .. p: gemma2 even layers, gemma3 5 of 6]
 *     a  = softmax(s) v  per head; head h reads KV head h / (n_head / n_head_kv)
 *     o  = attn_output a  [rmsnorm(o) * post_attention_norm: gemma]; x += o
 *     h  = rmsnorm(x) * ffn_norm
 *     f  = ffn_down (act(ffn_gate h) * ffn_up h), act = SiLU, [GELU-tanh:
 *          gemma]; (phi3: gate and up fused in one ffn_up, two row views)
 *          [MoE: router p = softmax(ffn_gate_inp h); the n_expert_used
 *          largest, weights renormalised to sum 1; f = sum w_e f_e(h) with
 *          expert e's slices of the 3-D ffn_{gate,up,down}_exps]
 *     [rmsnorm(f) * post_ffw_norm: gemma]; x += f
 *   logits = output (rmsnorm(x) * output_norm)            output = token_embd when absent (tied)
 *   [logits = cap * tanh(logits / cap): gemma2]
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

#include "engine/attn.h"
#include "engine/gguf.h"
#include "engine/kv.h"
#include "engine/quant.h"
#include "engine/threadpool.h"

/* Architecture families (general.architecture; Mixtral is "llama" with
 * experts). */
typedef enum gpe_arch_kind {
    GPE_ARCH_LLAMA = 0,
    GPE_ARCH_QWEN2,
    GPE_ARCH_QWEN3,
    GPE_ARCH_PHI3,
    GPE_ARCH_GEMMA2,
    GPE_ARCH_GEMMA3,
    GPE_ARCH_BERT,        /* encoder: absolute positions, GELU FFN with biases */
    GPE_ARCH_NOMIC_BERT,  /* encoder: RoPE (NEOX), fused qkv, SwiGLU FFN */
} gpe_arch_kind;

/* Hyper-parameters (Config). */
typedef struct gpe_hparams {
    char arch[32];        /* general.architecture */
    gpe_arch_kind kind;
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
    bool rope_neox;       /* NEOX pairs (x[i], x[i + n_rot/2]) instead of (x[2i], x[2i+1]) */
    float rope_base_swa;  /* gemma3 local layers: their base (rope.freq_base_swa, 10000) */
    int n_swa;            /* sliding window (attention.sliding_window); 0 = none */
    int swa_pattern;      /* layer l is windowed when l % swa_pattern < swa_pattern - 1 */
    float attn_scale;     /* query scale, 1/sqrt(head_dim) except the gemma 27B sizes */
    float attn_softcap;   /* gemma2 attn_logit_softcapping; 0 = none */
    float final_softcap;  /* gemma2 final_logit_softcapping; 0 = none */
    float embd_scale;     /* gemma: sqrt(n_embd); else 1 */
    bool gelu;            /* FFN activation GELU-tanh (gemma) instead of SiLU */
    int n_expert;         /* expert_count; 0 = dense FFN */
    int n_expert_used;    /* expert_used_count */
    bool encoder;         /* BERT-style: bidirectional attention, post-LayerNorm
                           * blocks, no output head (embeddings only) */
    float norm_eps;       /* encoder LayerNorm eps (attention.layer_norm_epsilon) */
    int n_token_types;    /* encoder: rows of token_types (tokenizer.ggml.token_type_count) */
} gpe_hparams;

/* A 2-D weight: n_rows rows of n_cols elements of one type, row-major. */
typedef struct gpe_weight {
    const void *data;     /* row 0, inside the mapping */
    const void *packed;   /* row-interleaved copy (quant.h gpe_pack_rows) or NULL */
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
    const float *bq, *bk, *bv, *bo; /* attention biases or NULL (qwen2 has q/k/v) */
    const float *q_norm;      /* [head_dim] per-head RMS norm of q, or NULL (qwen3, gemma3) */
    const float *k_norm;      /* [head_dim] same for k */
    const float *post_attn_norm; /* [n_embd] or NULL (gemma) */
    const float *ffn_norm;    /* [n_embd] */
    gpe_weight w_gate;        /* [n_ff][n_embd] (dense layers) */
    gpe_weight w_up;          /* [n_ff][n_embd] */
    gpe_weight w_down;        /* [n_embd][n_ff] */
    const float *post_ffn_norm; /* [n_embd] or NULL (gemma) */
    gpe_weight w_router;      /* MoE: [n_expert][n_embd] (ffn_gate_inp) */
    gpe_weight *exp_gate;     /* MoE: [n_expert] views of ffn_gate_exps, else NULL */
    gpe_weight *exp_up;       /* MoE: ffn_up_exps */
    gpe_weight *exp_down;     /* MoE: ffn_down_exps */
    bool swa;                 /* sliding-window layer */
    float rope_base;          /* this layer's RoPE base and position scale */
    float rope_freq_scale;
    /* encoder (post-norm) blocks: LayerNorm weight + bias after the
     * attention residual and after the FFN residual, and FFN biases */
    const float *attn_out_norm, *attn_out_norm_b;
    const float *out_norm, *out_norm_b;
    const float *b_up, *b_down;
} gpe_layer;

/* Weights (read-only after load; shared by every context). */
typedef struct gpe_llama {
    gpe_hparams hp;
    gpe_weight tok_embd;      /* [n_vocab][n_embd] */
    const float *output_norm; /* [n_embd] */
    gpe_weight output;        /* [n_vocab][n_embd]; == tok_embd when tied */
    bool tied_output;
    const float *rope_freqs;  /* [n_rot/2] or NULL */
    gpe_weight type_embd;     /* encoder: [n_token_types][n_embd]; row 0 added (data NULL: none) */
    gpe_weight pos_embd;      /* bert: [n_ctx_train][n_embd] absolute positions (data NULL: none) */
    const float *tok_norm, *tok_norm_b; /* encoder: LayerNorm of the embedding sum */
    gpe_layer *layers;        /* [n_layer] */
    gpe_weight *experts;      /* MoE: the views of every layer (one allocation) */
    uint64_t n_params;
    void *packed;             /* gpe_llama_pack's copies (one allocation) or NULL */
    size_t packed_bytes;
} gpe_llama;

/* Read hyper-parameters and bind weights from an open GGUF. Refuses an
 * architecture it does not run (GPE_ERR_UNSUPPORTED, naming it and listing
 * the supported ones), a missing or misshapen tensor (GPE_ERR_FORMAT,
 * naming it), a tensor type without a dot product and a tensor the forward
 * pass would not use (an unimplemented feature: GPE_ERR_UNSUPPORTED, naming
 * the tensor), each as one line in err. */
gpe_status gpe_llama_load(gpe_llama *m, const gpe_gguf *g, char *err, size_t errlen);
void gpe_llama_free(gpe_llama *m);
/* For the CPU backend: row-interleaved copies of the matmul weights whose
 * type has a packed form (Q4_0), in one allocation the model owns (about
 * the size of those weights; the mapped file is no longer read for them).
 * Returns false, leaving the model as it was, when the memory is not
 * there: the matmuls then read the rows as before. */
bool gpe_llama_pack(gpe_llama *m);

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
    float *moe_x;    /* MoE: [n_batch][n_embd] inputs gathered for one expert */
    float *moe_y;    /* MoE: [n_batch][n_embd] that expert's outputs */
    float *moe_out;  /* MoE: [n_batch][n_expert_used][n_embd] weighted outputs by rank */
    float *router;   /* MoE: [n_batch][n_expert] router probabilities */
    int *moe_sel;    /* MoE: [n_batch][n_expert_used] chosen experts, best first */
    float *moe_w;    /* MoE: [n_batch][n_expert_used] their renormalised weights */
    int *moe_tok;    /* MoE: [n_batch] tokens routed to the current expert */
    int *moe_rank;   /* MoE: [n_batch] rank of that expert for each of them */
    void *act;       /* converted activations, act_bytes */
    size_t act_bytes;
    void *act2;      /* second conversion buffer (matmuls of two vec_dot types) */
    gpe_attn_ws attn; /* attention scratch */
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
/* The same pass without the output matrix: the final hidden state of every
 * one of the n tokens after the output norm (what embeddings pool), as n
 * consecutive rows of n_embd floats at hidden. Cannot fail. */
void gpe_llama_hidden(const gpe_llama *m, gpe_fwd *f, gpe_kv *kv, gpe_pool *pool,
                      const int32_t *tokens, const int *pos, const int *seq, int n,
                      float *hidden);

/* Encoder models (hp.encoder; encoder.c): the final hidden state of the n
 * tokens, each attending to every token of its own sequence (whole
 * sequences only: a sequence's tokens are consecutive in the batch and all
 * of them are in this call; no KV cache). Same layout as gpe_llama_hidden,
 * which calls it for encoders. Cannot fail. */
void gpe_encoder_hidden(const gpe_llama *m, gpe_fwd *f, gpe_pool *pool, const int32_t *tokens,
                        const int *pos, const int *seq, int n, float *hidden);

/* Shared with encoder.c (model.c's kernels): out_i = x W_i^T for n <= 3
 * weights of the same width, the worker count for `work` multiply-adds,
 * and x[i] = GELU-tanh(x[i]) for n values evaluated through F16 as
 * llama.cpp's CPU backend does. */
void gpe_model_matmul(gpe_fwd *f, gpe_pool *pool, const float *x, int n_tok, int n,
                      const gpe_weight *const *ws, float *const *outs);
int gpe_model_nth(gpe_pool *pool, double work);
void gpe_model_gelu_row(float *x, int64_t n);
/* gate[i] = SiLU(gate[i]) * up[i]: SwiGLU's activation, decoder and encoder
 * alike */
void gpe_model_silu_mul_row(float *gate, const float *up, int64_t n);

/* engine.c, for chat_model.c too: the text of a special token (BOS/EOS)
 * for templates that write it literally, malloc'd ("" when id < 0 or it
 * renders as nothing); NULL when memory ran out. Any length: a fixed
 * buffer rendered a longer one as "", the prompt then without it. */
char *gpe_special_text(const gpe_model *m, int32_t id);

#endif
