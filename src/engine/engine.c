/*
 * engine: the public API of libgpupool-engine (include/gpupool/engine.h)
 * over the internal modules: gguf (file), model (weights, forward pass),
 * kv (cache), tokenizer, chat, threadpool.
 *
 * Sections: status names, model (load, info, metadata, tensors),
 * tokenizer and chat glue, batches, contexts and decode, system.
 *
 * Compute goes through a backend's table of operations (backend.h): the
 * CPU backend, or the CUDA plugin. This file knows no backend's insides.
 */
#include "gpupool/engine.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/quant.h"
#include "engine/tokenizer.h"

struct gpe_model {
    gpe_gguf *g;              /* owns the mapping every weight points into */
    gpe_llama llama;          /* weights (unset when vocab_only) */
    bool has_weights;
    gpe_tokenizer *tok;       /* NULL when the file has no vocabulary */
    char *name;               /* general.name or the file's base name */
    char quant[16];           /* dominant weight type */
    const char *chat_format;  /* static string from gpe_chat_detect */
    uint64_t weight_bytes;
    gpe_model_info info;
    const gpe_backend_ops *ops; /* where contexts of this model run */
    gpe_bplace place;         /* its devices (GPU backends) */
};

struct gpe_batch {
    int cap;
    int n;
    int32_t *tok;
    int *pos;
    int *seq;
    bool *logits;
};

struct gpe_ctx {
    gpe_model *m;
    const gpe_backend_ops *ops;
    gpe_bctx *b;              /* the backend's state: weights, K/V, scratch */
    int n_ctx, n_seq, n_batch;
    int *len;                 /* [n_seq] positions each sequence holds */
    int *next_pos;            /* [n_seq] validation scratch */
    int *row_of;              /* [row_cap] batch index -> logits row or -1 */
    int row_cap;
    float *logits;            /* [logits_cap][n_vocab] */
    int logits_cap;
    int last_n;               /* entries of the last decoded batch */
    int n_decodes;            /* gpe_decode calls that reached the backend */
    int fault_at;             /* GPUPOOL_ENGINE_FAULT: fail this decode (1-based), 0 = off */
    gpe_status fault_status;
    char *broken;             /* why the context is unusable, NULL while it is fine */
};

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

/* ========================================================= status names */

const char *gpe_status_name(gpe_status s)
{
    switch (s) {
    case GPE_OK: return "OK";
    case GPE_ERR_IO: return "IO";
    case GPE_ERR_FORMAT: return "FORMAT";
    case GPE_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case GPE_ERR_NOMEM: return "NOMEM";
    case GPE_ERR_ARG: return "ARG";
    case GPE_ERR_CTX_FULL: return "CTX_FULL";
    case GPE_ERR_INSUFFICIENT_VRAM: return "INSUFFICIENT_VRAM";
    case GPE_ERR_BACKEND: return "BACKEND";
    }
    return "UNKNOWN";
}

/* ================================================================ model */

gpe_model_params gpe_model_default_params(void)
{
    gpe_model_params p;
    memset(&p, 0, sizeof p);
    p.backend = GPE_BACKEND_CPU;
    return p;
}

/* Dominant weight type: the type holding the most bytes among 2-D tensors
 * (norm vectors are F32 in every file and would say nothing). */
static void find_quant(gpe_model *m)
{
    uint64_t bytes[GPE_TYPE_COUNT];
    memset(bytes, 0, sizeof bytes);
    for (int64_t i = 0; i < gpe_gguf_n_tensors(m->g); i++) {
        const gpe_gguf_tensor *t = gpe_gguf_tensor_at(m->g, i);
        m->weight_bytes += t->nbytes;
        if (t->n_dims >= 2 && (unsigned)t->type < GPE_TYPE_COUNT)
            bytes[t->type] += t->nbytes;
    }
    int best = -1;
    for (int t = 0; t < GPE_TYPE_COUNT; t++)
        if (bytes[t] > 0 && (best < 0 || bytes[t] > bytes[best]))
            best = t;
    snprintf(m->quant, sizeof m->quant, "%s", best >= 0 ? gpe_type_name((uint32_t)best) : "none");
}

static char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && strcmp(b + n - 5, ".gguf") == 0)
        n -= 5;
    return strndup(b, n);
}

static int32_t meta_token(const gpe_gguf *g, const char *key, int n_vocab)
{
    uint32_t v;
    if (!gpe_gguf_get_u32(g, key, &v) || (int64_t)v >= n_vocab)
        return -1;
    return (int32_t)v;
}

static void fill_info(gpe_model *m)
{
    gpe_model_info *in = &m->info;
    const gpe_gguf *g = m->g;
    memset(in, 0, sizeof *in);
    in->arch = gpe_gguf_get_str(g, "general.architecture", NULL);
    if (!in->arch)
        in->arch = "unknown";
    in->name = m->name;
    in->quant = m->quant;
    in->tokenizer = gpe_gguf_get_str(g, "tokenizer.ggml.model", NULL);
    in->chat_template = gpe_gguf_get_str(g, "tokenizer.chat_template", NULL);
    in->chat_format = m->chat_format;
    in->file_bytes = gpe_gguf_file_size(g);
    in->weight_bytes = m->weight_bytes;
    int n_vocab = m->tok ? gpe_tokenizer_n_vocab(m->tok) : 0;
    if (m->has_weights) {
        const gpe_hparams *hp = &m->llama.hp;
        in->n_ctx_train = hp->n_ctx_train;
        n_vocab = hp->n_vocab;
        in->n_embd = hp->n_embd;
        in->n_layer = hp->n_layer;
        in->n_head = hp->n_head;
        in->n_head_kv = hp->n_head_kv;
        in->n_ff = hp->n_ff;
        in->n_params = m->llama.n_params;
    }
    in->n_vocab = n_vocab;
    in->bos = meta_token(g, "tokenizer.ggml.bos_token_id", n_vocab);
    in->eos = meta_token(g, "tokenizer.ggml.eos_token_id", n_vocab);
}

/* The backend and placement of a model's contexts, from its params: the
 * CUDA plugin must load and see every device named. */
static gpe_status choose_backend(const gpe_model_params *p, gpe_model *m, char *err,
                                 size_t errlen)
{
    if (p->backend == GPE_BACKEND_CPU) {
        m->ops = gpe_backend_cpu();
        return GPE_OK;
    }
    if (p->backend != GPE_BACKEND_CUDA) {
        seterr(err, errlen, "unknown backend %d", (int)p->backend);
        return GPE_ERR_ARG;
    }
    if (p->n_devices < 0 || p->n_devices > GPE_MAX_DEVICES) {
        seterr(err, errlen, "n_devices %d out of range [0, %d]", p->n_devices, GPE_MAX_DEVICES);
        return GPE_ERR_ARG;
    }
    char why[512] = "";
    const gpe_backend_ops *ops = gpe_backend_cuda(why, sizeof why);
    int n_dev = ops ? ops->device_count(why, sizeof why) : 0;
    if (n_dev <= 0) {
        seterr(err, errlen, "CUDA backend unavailable: %s", why);
        return GPE_ERR_BACKEND;
    }
    gpe_bplace *pl = &m->place;
    memset(pl, 0, sizeof *pl);
    if (p->n_devices == 0) {
        pl->n = 1;
        pl->device[0] = p->gpu_device;
    } else {
        pl->n = p->n_devices;
        for (int i = 0; i < pl->n; i++) {
            pl->device[i] = p->devices[i];
            pl->split[i] = p->split[i];
            if (!(p->split[i] >= 0.0f) || p->split[i] > 1e9f) {
                seterr(err, errlen, "split[%d] = %g: shares must be >= 0", i,
                       (double)p->split[i]);
                return GPE_ERR_ARG;
            }
        }
    }
    for (int i = 0; i < pl->n; i++)
        if (pl->device[i] < 0 || pl->device[i] >= n_dev) {
            seterr(err, errlen, "CUDA device %d does not exist (%d visible)", pl->device[i],
                   n_dev);
            return GPE_ERR_ARG;
        }
    m->ops = ops;
    return GPE_OK;
}

gpe_status gpe_model_load(const char *path, const gpe_model_params *params, gpe_model **out,
                          char *err, size_t errlen)
{
    gpe_status st;
    gpe_model *m = NULL;
    gpe_model_params p = params ? *params : gpe_model_default_params();

    if (!out) {
        seterr(err, errlen, "out is NULL");
        return GPE_ERR_ARG;
    }
    *out = NULL;
    if (!path || !*path) {
        seterr(err, errlen, "no model path given");
        return GPE_ERR_ARG;
    }
    m = calloc(1, sizeof *m);
    if (!m) {
        seterr(err, errlen, "out of memory");
        return GPE_ERR_NOMEM;
    }
    if ((st = choose_backend(&p, m, err, errlen)))
        goto fail;
    char sub[256];
    if ((st = gpe_gguf_open(path, &m->g, sub, sizeof sub))) {
        seterr(err, errlen, "%s: %s", path, sub);
        goto fail;
    }
    if (!p.vocab_only) {
        if ((st = gpe_llama_load(&m->llama, m->g, sub, sizeof sub))) {
            seterr(err, errlen, "%s: %s", path, sub);
            goto fail;
        }
        m->has_weights = true;
        /* Encoders run on the CPU backend whatever was asked: the GPU
         * backends have no bidirectional attention or LayerNorm, and these
         * models are small (tens to hundreds of MB). */
        if (m->llama.hp.encoder && m->ops->gpu) {
            m->ops = gpe_backend_cpu();
            memset(&m->place, 0, sizeof m->place);
        }
        /* the CPU matmuls read row-interleaved copies where a type has
         * them; without the memory they read the rows (same results) */
        if (!m->ops->gpu)
            gpe_llama_pack(&m->llama);
    }
    /* The tokenizer is required: a model whose text cannot be read or
     * written is of no use to any caller of this API. */
    m->tok = gpe_tokenizer_load_status(m->g, sub, sizeof sub, &st);
    if (!m->tok) {
        /* its status, not FORMAT: out of memory is no damaged file */
        seterr(err, errlen, "%s: tokenizer: %s", path, sub);
        goto fail;
    }
    if (m->has_weights && gpe_tokenizer_n_vocab(m->tok) > m->llama.hp.n_vocab) {
        seterr(err, errlen, "%s: vocabulary has %d tokens but token_embd.weight only %d rows",
               path, gpe_tokenizer_n_vocab(m->tok), m->llama.hp.n_vocab);
        st = GPE_ERR_FORMAT;
        goto fail;
    }
    const char *gname = gpe_gguf_get_str(m->g, "general.name", NULL);
    m->name = gname && *gname ? strdup(gname) : base_name(path);
    if (!m->name) {
        seterr(err, errlen, "out of memory");
        st = GPE_ERR_NOMEM;
        goto fail;
    }
    find_quant(m);
    const char *tmpl = gpe_gguf_get_str(m->g, "tokenizer.chat_template", NULL);
    m->chat_format = gpe_chat_detect(tmpl ? tmpl : "");
    fill_info(m);
    *out = m;
    return GPE_OK;

fail:
    gpe_model_free(m);
    return st;
}

void gpe_model_free(gpe_model *m)
{
    if (!m)
        return;
    gpe_tokenizer_free(m->tok);
    gpe_llama_free(&m->llama);
    gpe_gguf_close(m->g);
    free(m->name);
    free(m);
}

void gpe_model_get_info(const gpe_model *m, gpe_model_info *out)
{
    if (m && out)
        *out = m->info;
}

int gpe_model_n_vocab(const gpe_model *m)
{
    return m ? m->info.n_vocab : 0;
}

bool gpe_model_meta_str(const gpe_model *m, const char *key, char *buf, size_t buflen)
{
    if (!m || !key)
        return false;
    int64_t i = gpe_gguf_find_key(m->g, key);
    if (i < 0)
        return false;
    if (buf && buflen > 0)
        gpe_gguf_kv_render(m->g, i, buf, buflen, 8);
    return true;
}

int gpe_model_meta_count(const gpe_model *m)
{
    return m ? (int)gpe_gguf_n_kv(m->g) : 0;
}

const char *gpe_model_meta_key(const gpe_model *m, int i)
{
    return m ? gpe_gguf_key(m->g, i) : NULL;
}

int gpe_model_tensor_count(const gpe_model *m)
{
    return m ? (int)gpe_gguf_n_tensors(m->g) : 0;
}

bool gpe_model_tensor_info(const gpe_model *m, int i, const char **name, const char **type,
                           int64_t dims[4], int *n_dims, uint64_t *bytes)
{
    if (!m)
        return false;
    const gpe_gguf_tensor *t = gpe_gguf_tensor_at(m->g, i);
    if (!t)
        return false;
    if (name)
        *name = t->name;
    if (type)
        *type = gpe_type_name(t->type);
    if (dims)
        for (int d = 0; d < 4; d++)
            dims[d] = t->ne[d];
    if (n_dims)
        *n_dims = t->n_dims;
    if (bytes)
        *bytes = t->nbytes;
    return true;
}

/* ==================================================== tokenizer and chat */

int gpe_tokenize(const gpe_model *m, const char *text, size_t len, bool add_special,
                 bool parse_special, int32_t *out, int max)
{
    if (!m || !m->tok || (!text && len > 0) || max < 0 || (!out && max > 0))
        return INT32_MIN;
    return gpe_tokenizer_encode(m->tok, text ? text : "", len, add_special, parse_special, out, max);
}

int gpe_token_to_piece(const gpe_model *m, int32_t token, char *buf, size_t buflen,
                       bool special)
{
    if (!m || !m->tok)
        return 0;
    return gpe_tokenizer_piece(m->tok, token, buf, buflen, special);
}

bool gpe_token_is_eog(const gpe_model *m, int32_t token)
{
    return m && m->tok && gpe_tokenizer_is_eog(m->tok, token);
}

char *gpe_special_text(const gpe_model *m, int32_t id)
{
    /* sized first: an empty buffer gets -(needed) */
    int n = id < 0 ? 0 : gpe_token_to_piece(m, id, NULL, 0, true);
    if (n == INT32_MIN)   /* the tokenizer's scratch could not be had */
        return NULL;
    size_t len = n < 0 ? (size_t)-(int64_t)n : 0;
    char *s = malloc(len + 1);
    if (!s)
        return NULL;
    if (len > 0 && gpe_token_to_piece(m, id, s, len, true) != (int)len) {
        free(s);
        return NULL;
    }
    s[len] = '\0';
    return s;
}

char *gpe_chat_apply_status(const gpe_model *m, const gpe_chat_msg *msgs, size_t n,
                            bool add_assistant, char *err, size_t errlen, gpe_status *st)
{
    if (!m) {
        seterr(err, errlen, "no model");
        if (st)
            *st = GPE_ERR_ARG;
        return NULL;
    }
    char *bos = gpe_special_text(m, m->info.bos), *eos = gpe_special_text(m, m->info.eos);
    char *out = NULL;
    if (!bos || !eos) {
        seterr(err, errlen, "chat: out of memory rendering the prompt");
        if (st)
            *st = GPE_ERR_NOMEM;
    } else {
        out = gpe_chat_apply_format_status(m->chat_format, bos, eos, msgs, n, add_assistant, err,
                                           errlen, st);
    }
    free(bos);
    free(eos);
    return out;
}

char *gpe_chat_apply(const gpe_model *m, const gpe_chat_msg *msgs, size_t n, bool add_assistant,
                     char *err, size_t errlen)
{
    return gpe_chat_apply_status(m, msgs, n, add_assistant, err, errlen, NULL);
}

/* ============================================================== batches */

gpe_batch *gpe_batch_init(int capacity)
{
    if (capacity <= 0)
        return NULL;
    gpe_batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->cap = capacity;
    b->tok = malloc((size_t)capacity * sizeof *b->tok);
    b->pos = malloc((size_t)capacity * sizeof *b->pos);
    b->seq = malloc((size_t)capacity * sizeof *b->seq);
    b->logits = malloc((size_t)capacity * sizeof *b->logits);
    if (!b->tok || !b->pos || !b->seq || !b->logits) {
        gpe_batch_free(b);
        return NULL;
    }
    return b;
}

void gpe_batch_free(gpe_batch *b)
{
    if (!b)
        return;
    free(b->tok);
    free(b->pos);
    free(b->seq);
    free(b->logits);
    free(b);
}

void gpe_batch_clear(gpe_batch *b)
{
    if (b)
        b->n = 0;
}

int gpe_batch_add(gpe_batch *b, int32_t token, int pos, int seq, bool want_logits)
{
    if (!b || b->n >= b->cap)
        return -1;
    int i = b->n++;
    b->tok[i] = token;
    b->pos[i] = pos;
    b->seq[i] = seq;
    b->logits[i] = want_logits;
    return i;
}

int gpe_batch_size(const gpe_batch *b)
{
    return b ? b->n : 0;
}

/* ============================================================= contexts */

gpe_ctx_params gpe_ctx_default_params(void)
{
    gpe_ctx_params p;
    memset(&p, 0, sizeof p);
    p.n_ctx = 0;
    p.n_seq = 1;
    p.n_threads = 0;
    p.n_batch = 512;
    p.kv_f16 = false;
    return p;
}

/* Validated, defaulted sizes of a context. */
static gpe_status ctx_sizes(const gpe_model *m, const gpe_ctx_params *params, gpe_bsizes *sz,
                            char *err, size_t errlen)
{
    gpe_ctx_params p = params ? *params : gpe_ctx_default_params();
    if (!m || !m->has_weights) {
        seterr(err, errlen, "model has no weights (loaded vocab-only?)");
        return GPE_ERR_ARG;
    }
    if (p.n_ctx == 0)
        p.n_ctx = m->llama.hp.n_ctx_train;
    if (p.n_seq == 0)
        p.n_seq = 1;
    if (p.n_batch == 0)
        p.n_batch = 512;
    if (p.n_ctx < 0 || p.n_ctx > (1 << 22)) {
        seterr(err, errlen, "n_ctx %d out of range [1, %d]", p.n_ctx, 1 << 22);
        return GPE_ERR_ARG;
    }
    if (p.n_seq < 0 || p.n_seq > 4096) {
        seterr(err, errlen, "n_seq %d out of range [1, 4096]", p.n_seq);
        return GPE_ERR_ARG;
    }
    if (p.n_batch < 0 || p.n_batch > 65536) {
        seterr(err, errlen, "n_batch %d out of range [1, 65536]", p.n_batch);
        return GPE_ERR_ARG;
    }
    if (p.n_threads < 0 || p.n_threads > 512) {
        seterr(err, errlen, "n_threads %d out of range [0, 512]", p.n_threads);
        return GPE_ERR_ARG;
    }
    /* Encoders: positions beyond the trained length have no embedding row
     * (bert) or were never trained; and one sequence must fit one forward
     * pass (bidirectional attention sees it whole), so n_batch >= n_ctx. */
    if (m->llama.hp.encoder) {
        if (p.n_ctx > m->llama.hp.n_ctx_train)
            p.n_ctx = m->llama.hp.n_ctx_train;
        if (p.n_batch < p.n_ctx)
            p.n_batch = p.n_ctx;
    }
    sz->n_ctx = p.n_ctx;
    sz->n_seq = p.n_seq;
    sz->n_batch = p.n_batch;
    sz->n_threads = p.n_threads;
    sz->kv_f16 = p.kv_f16;
    return GPE_OK;
}

/* GPUPOOL_ENGINE_FAULT (docs/engine.md): "init" fails gpe_ctx_init;
 * "decode:N[:STATUS]" fails the N-th gpe_decode of the context (STATUS a
 * gpe_status_name, default BACKEND). Read once per context creation.
 * Returns false when the value asks init to fail. */
static bool fault_setup(gpe_ctx *c, char *err, size_t errlen)
{
    const char *f = getenv("GPUPOOL_ENGINE_FAULT");
    if (!f || !*f)
        return true;
    if (strcmp(f, "init") == 0) {
        seterr(err, errlen, "injected fault: context creation (GPUPOOL_ENGINE_FAULT=init)");
        return false;
    }
    if (strncmp(f, "decode:", 7) != 0)
        return true;   /* unknown hook: ignored, as the variable is for tests */
    char *end;
    long n = strtol(f + 7, &end, 10);
    if (end == f + 7 || n < 1 || n > 1000000000L)
        return true;
    c->fault_at = (int)n;
    c->fault_status = GPE_ERR_BACKEND;
    if (*end == ':')
        for (int s = GPE_ERR_IO; s <= GPE_ERR_BACKEND; s++)
            if (strcmp(end + 1, gpe_status_name((gpe_status)s)) == 0)
                c->fault_status = (gpe_status)s;
    return true;
}

gpe_status gpe_ctx_init(gpe_model *m, const gpe_ctx_params *params, gpe_ctx **out, char *err,
                        size_t errlen)
{
    gpe_bsizes sz;
    gpe_ctx *c = NULL;
    gpe_status st;

    if (!out) {
        seterr(err, errlen, "out is NULL");
        return GPE_ERR_ARG;
    }
    *out = NULL;
    if ((st = ctx_sizes(m, params, &sz, err, errlen)))
        return st;
    c = calloc(1, sizeof *c);
    if (!c)
        goto nomem;
    c->m = m;
    c->ops = m->ops;
    c->n_ctx = sz.n_ctx;
    c->n_seq = sz.n_seq;
    c->n_batch = sz.n_batch;
    if (!fault_setup(c, err, errlen)) {
        gpe_ctx_free(c);
        return GPE_ERR_BACKEND;
    }
    c->len = calloc((size_t)sz.n_seq, sizeof *c->len);
    c->next_pos = calloc((size_t)sz.n_seq, sizeof *c->next_pos);
    if (!c->len || !c->next_pos)
        goto nomem;
    /* GPU backends: weights, K/V and scratch go to the devices (preflight
     * inside: a model that does not fit is GPE_ERR_INSUFFICIENT_VRAM before
     * anything is allocated). */
    if ((st = c->ops->ctx_create(&m->llama, &m->place, &sz, &c->b, err, errlen))) {
        gpe_ctx_free(c);
        return st;
    }
    *out = c;
    return GPE_OK;

nomem:
    seterr(err, errlen, "out of memory");
    gpe_ctx_free(c);
    return GPE_ERR_NOMEM;
}

void gpe_ctx_free(gpe_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->b)
        ctx->ops->ctx_free(ctx->b);
    free(ctx->len);
    free(ctx->next_pos);
    free(ctx->row_of);
    free(ctx->logits);
    free(ctx->broken);
    free(ctx);
}

int gpe_ctx_n_ctx(const gpe_ctx *ctx)
{
    return ctx ? ctx->n_ctx : 0;
}

gpe_status gpe_ctx_vram_estimate(const gpe_model *m, const gpe_ctx_params *p,
                                 gpe_vram_need out[GPE_MAX_DEVICES], int *n_out, char *err,
                                 size_t errlen)
{
    gpe_bsizes sz;
    gpe_status st;
    if (n_out)
        *n_out = 0;
    if (!out || !n_out) {
        seterr(err, errlen, "out or n_out is NULL");
        return GPE_ERR_ARG;
    }
    if ((st = ctx_sizes(m, p, &sz, err, errlen)))
        return st;
    return m->ops->budget(&m->llama, &m->place, &sz, out, n_out, err, errlen);
}

const char *gpe_ctx_backend_name(const gpe_ctx *ctx)
{
    return ctx ? ctx->ops->name : "none";
}

int gpe_ctx_devices(const gpe_ctx *ctx, gpe_vram_need out[GPE_MAX_DEVICES])
{
    if (!ctx || !out || !ctx->b)
        return 0;
    return ctx->ops->devices(ctx->b, out);
}

void gpe_seq_clear(gpe_ctx *ctx, int seq)
{
    if (!ctx || seq < 0 || seq >= ctx->n_seq)
        return;
    ctx->len[seq] = 0;
    if (ctx->b && !ctx->broken)
        ctx->ops->seq_clear(ctx->b, seq);
}

void gpe_seq_truncate(gpe_ctx *ctx, int seq, int n)
{
    if (!ctx || seq < 0 || seq >= ctx->n_seq)
        return;
    if (n <= 0) {
        gpe_seq_clear(ctx, seq);
        return;
    }
    /* Backends read K/V by position (i <= pos) and take the positions from
     * the batch: the length is the whole state; rows past it are
     * overwritten by the next decode before they are read. */
    if (n < ctx->len[seq])
        ctx->len[seq] = n;
}

int gpe_seq_len(const gpe_ctx *ctx, int seq)
{
    if (!ctx || seq < 0 || seq >= ctx->n_seq)
        return 0;
    return ctx->len[seq];
}

/* Checks every entry before anything is computed, so that a rejected batch
 * leaves the cache untouched. */
static gpe_status validate_batch(gpe_ctx *c, const gpe_batch *b, char *err, size_t errlen)
{
    const int n_vocab = c->m->llama.hp.n_vocab;
    for (int s = 0; s < c->n_seq; s++)
        c->next_pos[s] = c->len[s];
    for (int i = 0; i < b->n; i++) {
        const int s = b->seq[i];
        if (s < 0 || s >= c->n_seq) {
            seterr(err, errlen, "batch entry %d: sequence %d out of range [0, %d)", i, s,
                   c->n_seq);
            return GPE_ERR_ARG;
        }
        if (b->tok[i] < 0 || b->tok[i] >= n_vocab) {
            seterr(err, errlen, "batch entry %d: token %d out of range [0, %d)", i,
                   (int)b->tok[i], n_vocab);
            return GPE_ERR_ARG;
        }
        if (b->pos[i] != c->next_pos[s]) {
            seterr(err, errlen,
                   "batch entry %d: sequence %d expects position %d next, got %d", i, s,
                   c->next_pos[s], b->pos[i]);
            return GPE_ERR_ARG;
        }
        if (b->pos[i] >= c->n_ctx) {
            seterr(err, errlen, "sequence %d is full: position %d exceeds the context length %d",
                   s, b->pos[i], c->n_ctx);
            return GPE_ERR_CTX_FULL;
        }
        c->next_pos[s]++;
    }
    return GPE_OK;
}

/* Room for the batch's row map and n_out rows of logits. */
static int reserve(gpe_ctx *ctx, int n, int n_out)
{
    if (n > ctx->row_cap) {
        int *r = realloc(ctx->row_of, (size_t)n * sizeof *r);
        if (!r)
            return -1;
        ctx->row_of = r;
        ctx->row_cap = n;
    }
    if (n_out > ctx->logits_cap) {
        const size_t V = (size_t)ctx->m->llama.hp.n_vocab;
        float *l = realloc(ctx->logits, (size_t)n_out * V * sizeof *l);
        if (!l)
            return -1;
        ctx->logits = l;
        ctx->logits_cap = n_out;
    }
    return 0;
}

/* Marks the context unusable after a device fault (real or injected). */
static gpe_status breakdown(gpe_ctx *ctx, gpe_status st, const char *msg, char *err,
                            size_t errlen)
{
    if (!ctx->broken)
        ctx->broken = strdup(msg && *msg ? msg : gpe_status_name(st));
    seterr(err, errlen, "%s", msg);
    return st;
}

gpe_status gpe_decode(gpe_ctx *ctx, const gpe_batch *b, char *err, size_t errlen)
{
    gpe_status st;
    char msg[512];
    if (!ctx || !b) {
        seterr(err, errlen, "ctx or batch is NULL");
        return GPE_ERR_ARG;
    }
    ctx->last_n = 0;
    if (gpe_model_embeddings_only(ctx->m)) {
        seterr(err, errlen, "'%s' is an encoder (embeddings only): it does not generate text",
               ctx->m->info.arch);
        return GPE_ERR_UNSUPPORTED;
    }
    if (ctx->broken) {
        seterr(err, errlen, "context unusable after a device fault (%s): free it and create "
               "a new one", ctx->broken);
        return GPE_ERR_BACKEND;
    }
    if (b->n == 0) {
        seterr(err, errlen, "empty batch");
        return GPE_ERR_ARG;
    }
    if ((st = validate_batch(ctx, b, err, errlen)))
        return st;
    if (++ctx->n_decodes == ctx->fault_at) {
        snprintf(msg, sizeof msg, "injected fault: decode %d (GPUPOOL_ENGINE_FAULT)",
                 ctx->n_decodes);
        return breakdown(ctx, ctx->fault_status, msg, err, errlen);
    }

    int n_out = 0;
    for (int i = 0; i < b->n; i++)
        n_out += b->logits[i] ? 1 : 0;
    if (reserve(ctx, b->n, n_out) != 0) {
        seterr(err, errlen, "out of memory");
        return GPE_ERR_NOMEM;
    }

    /* Batches larger than n_batch run in chunks; a later chunk sees the
     * earlier chunks' K/V rows because attention reads the cache by
     * position, not by committed length. */
    const int n_vocab = ctx->m->llama.hp.n_vocab;
    int row = 0;
    for (int c0 = 0; c0 < b->n; c0 += ctx->n_batch) {
        int cn = b->n - c0 < ctx->n_batch ? b->n - c0 : ctx->n_batch;
        for (int i = c0; i < c0 + cn; i++)
            ctx->row_of[i] = b->logits[i] ? row++ : -1;
        int base = row;
        for (int i = c0; i < c0 + cn; i++)
            if (b->logits[i]) {
                base = ctx->row_of[i];
                break;
            }
        float *lg = ctx->logits ? ctx->logits + (size_t)base * (size_t)n_vocab : NULL;
        /* A failure leaves partial K/V rows at this batch's positions; the
         * lengths are not committed, so the sequences are as before. A
         * device failure also leaves the backend context unusable. */
        msg[0] = '\0';
        st = ctx->ops->forward(ctx->b, b->tok + c0, b->pos + c0, b->seq + c0, b->logits + c0,
                               cn, lg, msg, sizeof msg);
        if (st == GPE_ERR_BACKEND || st == GPE_ERR_INSUFFICIENT_VRAM)
            return breakdown(ctx, st, msg, err, errlen);
        if (st != GPE_OK) {
            seterr(err, errlen, "%s", msg);
            return st;
        }
    }
    for (int i = 0; i < b->n; i++)
        if (b->pos[i] + 1 > ctx->len[b->seq[i]])
            ctx->len[b->seq[i]] = b->pos[i] + 1;
    ctx->last_n = b->n;
    return GPE_OK;
}

const float *gpe_get_logits(const gpe_ctx *ctx, int i)
{
    if (!ctx || i < 0 || i >= ctx->last_n || ctx->row_of[i] < 0)
        return NULL;
    return ctx->logits + (size_t)ctx->row_of[i] * (size_t)ctx->m->llama.hp.n_vocab;
}

/* =========================================================== embeddings */

int gpe_model_pooling(const gpe_model *m)
{
    char key[64];
    int64_t v;
    if (!m)
        return -1;
    snprintf(key, sizeof key, "%s.pooling_type", m->info.arch);
    if (!gpe_gguf_get_i64(m->g, key, &v) || v == 0)
        return GPE_POOLING_LAST;
    return v >= GPE_POOLING_MEAN && v <= GPE_POOLING_LAST ? (int)v : -1;
}

bool gpe_model_embeddings_only(const gpe_model *m)
{
    return m && m->has_weights && m->llama.hp.encoder;
}

int gpe_model_embedding_dim(const gpe_model *m)
{
    return m && m->has_weights ? m->llama.hp.n_embd : 0;
}

/* Scratch of one gpe_embed_batch call: a chunk of at most n_batch tokens
 * of several inputs, their hidden rows, and where each row pools to. */
typedef struct embed_run {
    gpe_ctx *ctx;
    int pooling, E, cap, n;
    int32_t *tok;
    int *pos, *seq, *input;
    float *hidden;
    float *out;
    const int *n_tokens;
} embed_run;

/* Runs the chunk and folds its rows into the outputs of their inputs. */
static gpe_status embed_flush(embed_run *r, char *err, size_t errlen)
{
    char msg[512] = "";
    gpe_ctx *ctx = r->ctx;
    if (r->n == 0)
        return GPE_OK;
    if (++ctx->n_decodes == ctx->fault_at) {
        snprintf(msg, sizeof msg, "injected fault: decode %d (GPUPOOL_ENGINE_FAULT)",
                 ctx->n_decodes);
        return breakdown(ctx, ctx->fault_status, msg, err, errlen);
    }
    gpe_status st = ctx->ops->hidden(ctx->b, r->tok, r->pos, r->seq, r->n, r->hidden, msg,
                                     sizeof msg);
    if (st == GPE_ERR_BACKEND || st == GPE_ERR_INSUFFICIENT_VRAM)
        return breakdown(ctx, st, msg, err, errlen);
    if (st != GPE_OK) {
        seterr(err, errlen, "%s", msg);
        return st;
    }
    for (int t = 0; t < r->n; t++) {
        const float *h = r->hidden + (size_t)t * r->E;
        float *o = r->out + (size_t)r->input[t] * r->E;
        bool take = r->pooling == GPE_POOLING_MEAN ||
                    (r->pooling == GPE_POOLING_CLS && r->pos[t] == 0) ||
                    (r->pooling == GPE_POOLING_LAST && r->pos[t] == r->n_tokens[r->input[t]] - 1);
        if (take)
            for (int i = 0; i < r->E; i++)
                o[i] += h[i];
    }
    r->n = 0;
    return GPE_OK;
}

static void embed_finish(float *o, int E, int pooling, int n_tok)
{
    double ss = 0.0;
    if (pooling == GPE_POOLING_MEAN)
        for (int i = 0; i < E; i++)
            o[i] /= (float)n_tok;
    for (int i = 0; i < E; i++)
        ss += (double)o[i] * o[i];
    /* An all-zero state stays zero rather than dividing by zero. */
    float inv = ss > 0.0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
    for (int i = 0; i < E; i++)
        o[i] *= inv;
}

static gpe_status embed_check(gpe_ctx *ctx, const int32_t *const *tokens, const int *n_tokens,
                              int n_inputs, const float *out, int dim, char *err,
                              size_t errlen)
{
    if (!ctx || !tokens || !n_tokens || !out || n_inputs < 0) {
        seterr(err, errlen, "bad arguments");
        return GPE_ERR_ARG;
    }
    if (ctx->broken) {
        seterr(err, errlen, "context unusable after a device fault (%s): free it and create "
               "a new one", ctx->broken);
        return GPE_ERR_BACKEND;
    }
    if (!ctx->ops->hidden) {
        seterr(err, errlen, "the %s backend does not compute embeddings", ctx->ops->name);
        return GPE_ERR_UNSUPPORTED;
    }
    if (gpe_model_pooling(ctx->m) < 0) {
        seterr(err, errlen, "%s.pooling_type: unsupported pooling (1 mean, 2 cls, 3 last)",
               ctx->m->info.arch);
        return GPE_ERR_UNSUPPORTED;
    }
    if (dim != ctx->m->llama.hp.n_embd) {
        seterr(err, errlen, "dim %d is not the model's embedding length %d", dim,
               ctx->m->llama.hp.n_embd);
        return GPE_ERR_ARG;
    }
    for (int i = 0; i < n_inputs; i++) {
        if (n_tokens[i] < 1 || n_tokens[i] > ctx->n_ctx || !tokens[i]) {
            seterr(err, errlen, "input %d has %d tokens (1 to the context length %d)", i,
                   n_tokens[i], ctx->n_ctx);
            return n_tokens[i] > ctx->n_ctx ? GPE_ERR_CTX_FULL : GPE_ERR_ARG;
        }
        for (int j = 0; j < n_tokens[i]; j++)
            if (tokens[i][j] < 0 || tokens[i][j] >= ctx->m->llama.hp.n_vocab) {
                seterr(err, errlen, "input %d: token %d at %d is out of the vocabulary", i,
                       (int)tokens[i][j], j);
                return GPE_ERR_ARG;
            }
    }
    return GPE_OK;
}

gpe_status gpe_embed_batch(gpe_ctx *ctx, const int32_t *const *tokens, const int *n_tokens,
                           int n_inputs, float *out, int dim, char *err, size_t errlen)
{
    gpe_status st = embed_check(ctx, tokens, n_tokens, n_inputs, out, dim, err, errlen);
    if (st != GPE_OK)
        return st;
    embed_run r = { .ctx = ctx, .pooling = gpe_model_pooling(ctx->m), .E = dim,
                    .cap = ctx->n_batch, .out = out, .n_tokens = n_tokens };
    r.tok = malloc((size_t)r.cap * sizeof *r.tok);
    r.pos = malloc((size_t)r.cap * sizeof *r.pos);
    r.seq = malloc((size_t)r.cap * sizeof *r.seq);
    r.input = malloc((size_t)r.cap * sizeof *r.input);
    r.hidden = malloc((size_t)r.cap * (size_t)dim * sizeof *r.hidden);
    if (!r.tok || !r.pos || !r.seq || !r.input || !r.hidden) {
        seterr(err, errlen, "out of memory");
        st = GPE_ERR_NOMEM;
        goto done;
    }
    memset(out, 0, (size_t)n_inputs * (size_t)dim * sizeof *out);
    /* Up to n_seq inputs at a time, one sequence each, their tokens in
     * order so that every chunk follows what its sequences already hold. */
    for (int g0 = 0; g0 < n_inputs && st == GPE_OK; g0 += ctx->n_seq) {
        int g1 = g0 + ctx->n_seq < n_inputs ? g0 + ctx->n_seq : n_inputs;
        for (int s = 0; s < ctx->n_seq; s++)
            gpe_seq_clear(ctx, s);
        for (int i = g0; i < g1 && st == GPE_OK; i++) {
            /* an encoder's input must be whole in one chunk (it attends
             * both ways); n_batch >= n_ctx >= its length (ctx_sizes) */
            if (ctx->m->llama.hp.encoder && r.n + n_tokens[i] > r.cap)
                st = embed_flush(&r, err, errlen);
            for (int j = 0; j < n_tokens[i] && st == GPE_OK; j++) {
                r.tok[r.n] = tokens[i][j];
                r.pos[r.n] = j;
                r.seq[r.n] = i - g0;
                r.input[r.n] = i;
                if (++r.n == r.cap)
                    st = embed_flush(&r, err, errlen);
            }
        }
        if (st == GPE_OK)
            st = embed_flush(&r, err, errlen);
        for (int i = g0; i < g1 && st == GPE_OK; i++)
            embed_finish(out + (size_t)i * dim, dim, r.pooling, n_tokens[i]);
    }
    for (int s = 0; s < ctx->n_seq; s++)
        gpe_seq_clear(ctx, s);
done:
    free(r.tok);
    free(r.pos);
    free(r.seq);
    free(r.input);
    free(r.hidden);
    return st;
}

gpe_status gpe_embed(gpe_ctx *ctx, const int32_t *tokens, int n, float *out, int dim, char *err,
                     size_t errlen)
{
    return gpe_embed_batch(ctx, &tokens, &n, 1, out, dim, err, errlen);
}

/* =============================================================== system */

int gpe_gpu_count(char *why, size_t whylen)
{
    char w[512] = "";
    const gpe_backend_ops *ops = gpe_backend_cuda(w, sizeof w);
    int n = ops ? ops->device_count(w, sizeof w) : 0;
    if (n <= 0) {
        seterr(why, whylen, "%s", w);
        return 0;
    }
    return n;
}

gpe_status gpe_gpu_info_get(int device, gpe_gpu_info *out, char *err, size_t errlen)
{
    char w[512] = "";
    if (!out) {
        seterr(err, errlen, "out is NULL");
        return GPE_ERR_ARG;
    }
    memset(out, 0, sizeof *out);
    const gpe_backend_ops *ops = gpe_backend_cuda(w, sizeof w);
    if (!ops) {
        seterr(err, errlen, "%s", w);
        return GPE_ERR_BACKEND;
    }
    return ops->device_info(device, out, err, errlen);
}

const char *gpe_cuda_plugin_path(void)
{
    return gpe_backend_cuda_path();
}

bool gpe_cuda_available(void)
{
    return gpe_gpu_count(NULL, 0) > 0;
}

gpe_status gpe_cuda_selftest(char *err, size_t errlen)
{
    char w[512] = "";
    const gpe_backend_ops *ops = gpe_backend_cuda(w, sizeof w);
    if (ops && ops->device_count(w, sizeof w) > 0)
        return ops->selftest(err, errlen);
    seterr(err, errlen, "%s", w);
    return GPE_ERR_BACKEND;
}
