/*
 * libgpupool-engine: embedded LLM inference on GGUF files (llama family).
 *
 * This header is the library's whole public interface. It depends on nothing
 * but the C standard library; the server and agent use the engine only
 * through it.
 *
 * Usage:
 *
 *   char err[256];
 *   gpe_model *m = NULL;
 *   gpe_model_params mp = gpe_model_default_params();
 *   if (gpe_model_load("stories260K.gguf", &mp, &m, err, sizeof err) != GPE_OK) { ... }
 *
 *   gpe_ctx_params cp = gpe_ctx_default_params();
 *   cp.n_ctx = 512; cp.n_seq = 4; cp.n_threads = 2;
 *   gpe_ctx *ctx = NULL;
 *   gpe_ctx_init(m, &cp, &ctx, err, sizeof err);
 *
 *   int32_t toks[512];
 *   int n = gpe_tokenize(m, "Once upon a time", 16, true, false, toks, 512);
 *
 *   // prefill sequence 0, logits only for the last prompt token
 *   gpe_batch *b = gpe_batch_init(512);
 *   for (int i = 0; i < n; i++) gpe_batch_add(b, toks[i], i, 0, i == n - 1);
 *   gpe_decode(ctx, b);
 *   const float *logits = gpe_get_logits(ctx, n - 1);   // index into the batch
 *
 *   gpe_sampler *s = gpe_sampler_init(&(gpe_sampler_params){ .temperature = 0 });
 *   int32_t next = gpe_sampler_sample(s, logits, gpe_model_n_vocab(m));
 *   gpe_sampler_accept(s, next);
 *   ...
 *   gpe_sampler_free(s); gpe_batch_free(b); gpe_ctx_free(ctx); gpe_model_free(m);
 *
 * Threading: a gpe_model is immutable after load and may be shared by
 * several contexts. A gpe_ctx is used by one thread at a time; it owns a
 * thread pool that splits the matrix work of each gpe_decode.
 *
 * Errors: functions return gpe_status and write a message to the caller's
 * err buffer; the library never prints, never exits, never aborts on bad
 * input (only on a broken internal invariant).
 */
#ifndef GPUPOOL_ENGINE_H
#define GPUPOOL_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gpe_status {
    GPE_OK = 0,
    GPE_ERR_IO,                 /* cannot open/read/mmap the file */
    GPE_ERR_FORMAT,             /* malformed or hostile file */
    GPE_ERR_UNSUPPORTED,        /* valid file, but an architecture/type we do not support */
    GPE_ERR_NOMEM,
    GPE_ERR_ARG,                /* bad argument from the caller */
    GPE_ERR_CTX_FULL,           /* sequence would exceed the context length */
    GPE_ERR_INSUFFICIENT_VRAM,  /* GPU backend preflight failed */
    GPE_ERR_BACKEND,            /* backend (e.g. CUDA) failure */
} gpe_status;

/* Stable upper-case name of a status ("FORMAT", "INSUFFICIENT_VRAM", ...). */
const char *gpe_status_name(gpe_status s);

/* ------------------------------------------------------------------ model */

typedef struct gpe_model gpe_model;

typedef enum gpe_backend_kind { GPE_BACKEND_CPU = 0, GPE_BACKEND_CUDA = 1 } gpe_backend_kind;

#define GPE_MAX_DEVICES 16

typedef struct gpe_model_params {
    gpe_backend_kind backend;   /* default CPU */
    int gpu_device;             /* CUDA device when n_devices == 0 */
    int n_devices;              /* >= 2: layers split over devices[0..n_devices-1] in order
                                   (llama.cpp's --split-mode layer); the same index may repeat
                                   (tests split over one GPU); 0 or 1: one device (devices[0]
                                   when n_devices == 1, else gpu_device) */
    int devices[GPE_MAX_DEVICES];
    float split[GPE_MAX_DEVICES]; /* share of the layers per device; all 0 = in proportion to
                                     each device's free VRAM at context creation */
    bool vocab_only;            /* load metadata + tokenizer only (no weights needed) */
} gpe_model_params;

gpe_model_params gpe_model_default_params(void);
gpe_status gpe_model_load(const char *path, const gpe_model_params *params, gpe_model **out,
                          char *err, size_t errlen);
void gpe_model_free(gpe_model *m);

typedef struct gpe_model_info {
    const char *arch;            /* general.architecture, e.g. "llama" */
    const char *name;            /* general.name or the file's base name */
    const char *quant;           /* dominant tensor type, e.g. "Q4_K", "F32" */
    const char *tokenizer;       /* "llama" (spm) or "gpt2" (bpe) */
    const char *chat_template;   /* tokenizer.chat_template or NULL */
    const char *chat_format;     /* detected family: "chatml", "llama-2", ... or "fallback" */
    int n_ctx_train;
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff;
    uint64_t n_params;
    uint64_t file_bytes;
    uint64_t weight_bytes;       /* bytes of tensor data */
    int32_t bos, eos;            /* -1 when absent */
} gpe_model_info;

/* Pointers inside stay valid for the model's lifetime. */
void gpe_model_get_info(const gpe_model *m, gpe_model_info *out);
int gpe_model_n_vocab(const gpe_model *m);
/* Metadata lookup for tools: value rendered as text into buf (arrays
 * abbreviated). Returns false when the key is absent. */
bool gpe_model_meta_str(const gpe_model *m, const char *key, char *buf, size_t buflen);
/* Iterate metadata keys: index 0..count-1. */
int gpe_model_meta_count(const gpe_model *m);
const char *gpe_model_meta_key(const gpe_model *m, int i);
/* Iterate tensors: name, type name, dims (up to 4), bytes. */
int gpe_model_tensor_count(const gpe_model *m);
bool gpe_model_tensor_info(const gpe_model *m, int i, const char **name, const char **type,
                           int64_t dims[4], int *n_dims, uint64_t *bytes);

/* -------------------------------------------------------------- tokenizer */

/* Tokenize text (len bytes, need not be NUL-terminated). add_special adds
 * BOS (and EOS) as the model's metadata asks; parse_special turns special
 * token text such as "<|im_start|>" into its id. Returns the number of
 * tokens written, or -(needed) when max is too small, or INT32_MIN on error. */
int gpe_tokenize(const gpe_model *m, const char *text, size_t len, bool add_special,
                 bool parse_special, int32_t *out, int max);
/* Text of one token for output (byte-fallback tokens give their byte; the
 * SentencePiece "▁" becomes a space). Returns bytes written (may be 0), or
 * -(needed) when buflen is too small. special: render control tokens too. */
int gpe_token_to_piece(const gpe_model *m, int32_t token, char *buf, size_t buflen,
                       bool special);
bool gpe_token_is_eog(const gpe_model *m, int32_t token);   /* EOS, EOT, <|im_end|>, ... */

/* ---------------------------------------------------------- chat template */

typedef struct gpe_chat_msg {
    const char *role;      /* "system", "user", "assistant" (others passed through) */
    const char *content;
} gpe_chat_msg;

/* Render messages with the model's chat template family (detected from
 * tokenizer.chat_template; see docs/chat-templates.md for each family and
 * the fallback). When
 * add_assistant is true the prompt ends where the assistant's reply starts.
 * Returns a malloc'd string (caller frees) or NULL with err set. */
char *gpe_chat_apply(const gpe_model *m, const gpe_chat_msg *msgs, size_t n, bool add_assistant,
                     char *err, size_t errlen);
/* Same, with an explicit family name ("chatml", "llama-2", "llama-3",
 * "mistral", "zephyr", "gemma", "phi-3", "fallback"); bos/eos are the texts
 * of those tokens for templates that write them. */
char *gpe_chat_apply_format(const char *family, const char *bos, const char *eos,
                            const gpe_chat_msg *msgs, size_t n, bool add_assistant, char *err,
                            size_t errlen);
/* The chat renderers' _status forms (here and below, with tools) are the
 * same, with why there is no prompt in *st (st may be NULL): GPE_OK with
 * the prompt; GPE_ERR_NOMEM, memory ran out (err "chat: out of memory
 * rendering the prompt": not the messages' fault, a retry may pass);
 * GPE_ERR_ARG, the caller's input refused (err says what: no model, an
 * unknown family, a message without a role, a tool or a tool call without
 * a name). */
char *gpe_chat_apply_status(const gpe_model *m, const gpe_chat_msg *msgs, size_t n,
                            bool add_assistant, char *err, size_t errlen, gpe_status *st);
char *gpe_chat_apply_format_status(const char *family, const char *bos, const char *eos,
                                   const gpe_chat_msg *msgs, size_t n, bool add_assistant,
                                   char *err, size_t errlen, gpe_status *st);
/* Family name detected from a Jinja template text ("fallback" when unknown). */
const char *gpe_chat_detect(const char *template_text);

/* Tools (OpenAI function calling) in chat templates. See
 * docs/chat-templates.md "Tools". The engine renders tools and tool messages
 * into the prompt in the format of the model's tool-capable template
 * (chatml/Qwen Hermes-style, llama-3.1, mistral v0.3); gpe_toolparse_* reads
 * the calls back out of the output. JSON texts given here (parameters,
 * arguments) may be in any spacing: they are re-spaced the way the
 * templates' tojson (Python json.dumps) writes them; invalid JSON is
 * written as given. */
typedef struct gpe_chat_tool {
    const char *name;          /* function name (required) */
    const char *description;   /* NULL = none */
    const char *parameters;    /* JSON text of the parameters schema; NULL = none */
} gpe_chat_tool;

typedef struct gpe_chat_tool_call {
    const char *id;            /* call id ("call_..."); NULL = none */
    const char *name;          /* function name */
    const char *arguments;     /* JSON text of the arguments object; NULL = "{}" */
} gpe_chat_tool_call;

/* Tool parts of one message, parallel to a gpe_chat_msg array (index i
 * belongs to msgs[i]). An assistant message with n_tool_calls > 0 is a tool
 * call (its content may be NULL); a "tool" message answers tool_call_id. */
typedef struct gpe_chat_msg_tools {
    const gpe_chat_tool_call *tool_calls;
    size_t n_tool_calls;
    const char *tool_call_id;  /* for role "tool"; NULL = none */
} gpe_chat_msg_tools;

/* Does this template text support tools? True when it is of a family with
 * a tools format and references tools the way that family's tool-capable
 * templates do (chatml: "tools" and "<tool_call>"; llama-3: "tools" and
 * "ipython"; mistral: "[AVAILABLE_TOOLS]"). NULL -> false. */
bool gpe_chat_template_supports_tools(const char *template_text);
/* Does the model's tokenizer.chat_template support tools? */
bool gpe_chat_supports_tools(const gpe_model *m);
/* gpe_chat_apply with tools and tool messages. extra may be NULL (no tool
 * parts); tools may be NULL when n_tools is 0. When the model's template
 * supports tools, the template's tool format is used (tools, tool calls,
 * tool results); otherwise tools are ignored and tool calls/results are
 * rendered as plain text ("Tool call: name(args)", "Tool result: ...") in
 * user/assistant turns of the model's family. */
char *gpe_chat_apply_tools(const gpe_model *m, const gpe_chat_tool *tools, size_t n_tools,
                           const gpe_chat_msg *msgs, const gpe_chat_msg_tools *extra, size_t n,
                           bool add_assistant, char *err, size_t errlen);
/* Same with an explicit family. tool_format: render with the family's tool
 * format (only chatml, llama-3 and mistral have one; for the others, or
 * when false, tools are ignored and tool messages become plain text). */
char *gpe_chat_apply_format_tools(const char *family, const char *bos, const char *eos,
                                  bool tool_format, const gpe_chat_tool *tools, size_t n_tools,
                                  const gpe_chat_msg *msgs, const gpe_chat_msg_tools *extra,
                                  size_t n, bool add_assistant, char *err, size_t errlen);
/* _status forms: see gpe_chat_apply_status. */
char *gpe_chat_apply_tools_status(const gpe_model *m, const gpe_chat_tool *tools,
                                  size_t n_tools, const gpe_chat_msg *msgs,
                                  const gpe_chat_msg_tools *extra, size_t n, bool add_assistant,
                                  char *err, size_t errlen, gpe_status *st);
char *gpe_chat_apply_format_tools_status(const char *family, const char *bos, const char *eos,
                                         bool tool_format, const gpe_chat_tool *tools,
                                         size_t n_tools, const gpe_chat_msg *msgs,
                                         const gpe_chat_msg_tools *extra, size_t n,
                                         bool add_assistant, char *err, size_t errlen,
                                         gpe_status *st);

/* Tool calls in the generated text, read in the format of the family that
 * rendered the tools (chatml <tool_call> blocks, llama-3's whole-message
 * JSON object, mistral's [TOOL_CALLS] array). Feed the generated text as it
 * comes: the parser holds back text that could start a call and what is
 * inside one, and gives back the rest as content. A call that does not
 * parse (bad JSON, no name) comes back as text. One parser per generation.
 *
 *   gpe_toolparse *tp = gpe_toolparse_new(info.chat_format);  // NULL: no format
 *   each piece: gpe_toolparse_feed(tp, piece, n, &emit, &elen); send emit;
 *               new calls: gpe_toolparse_n_calls / gpe_toolparse_call
 *   at the end: gpe_toolparse_finish(tp, &emit, &elen); send emit; calls */
typedef struct gpe_toolparse gpe_toolparse;
/* NULL when the family has no tools format (or out of memory). */
gpe_toolparse *gpe_toolparse_new(const char *family);
void gpe_toolparse_free(gpe_toolparse *p);
/* *emit (borrowed until the next call) receives the content text safe to
 * send now. GPE_ERR_NOMEM when memory ran out (text or a call may be lost):
 * nothing is emitted with it (*emit "", *emit_len 0), and every later
 * feed (emitting nothing) and the finish say GPE_ERR_NOMEM too. */
gpe_status gpe_toolparse_feed(gpe_toolparse *p, const char *text, size_t len,
                              const char **emit, size_t *emit_len);
/* End of generation: a call without its closer is parsed as it stands;
 * whatever else was held is content. The calls of llama-3 and mistral
 * (no closer) are all read here. GPE_ERR_NOMEM when memory ran out, here
 * or in an earlier feed (a call or text may be lost: the generation's
 * calls are not whole); GPE_OK otherwise. */
gpe_status gpe_toolparse_finish(gpe_toolparse *p, const char **emit, size_t *emit_len);
/* Calls found so far, in order; name and arguments (compact JSON text)
 * borrowed from the parser. */
size_t gpe_toolparse_n_calls(const gpe_toolparse *p);
bool gpe_toolparse_call(const gpe_toolparse *p, size_t i, const char **name,
                        const char **arguments);
/* Text that starts a call in this family's format, for a forced call
 * (tool_choice "required" or a named function): appended to the prompt,
 * the model then writes the call's JSON. "" for llama-3 (the JSON is the
 * message), NULL without a tools format. */
const char *gpe_toolparse_forced_prefix(const char *family);
/* Text that starts a call in the model's own output ("<tool_call>",
 * "[TOOL_CALLS]"; "" for llama-3, whose call is the whole message), NULL
 * without a tools format. */
const char *gpe_toolparse_opener(const char *family);

/* ---------------------------------------------------------------- context */

typedef struct gpe_ctx gpe_ctx;

typedef struct gpe_ctx_params {
    int n_ctx;        /* positions per sequence; 0 = the model's training length */
    int n_seq;        /* sequences held in the KV cache (agent slots); default 1 */
    int n_threads;    /* 0 = number of online CPUs */
    int n_batch;      /* max tokens per gpe_decode; default 512 */
    bool kv_f16;      /* KV cache in F16 (half the memory; llama.cpp's default and
                         its rounding) instead of F32; default false. CPU and CUDA. */
} gpe_ctx_params;

gpe_ctx_params gpe_ctx_default_params(void);
/* Creates a context on the model's backend. CUDA: weights, K/V and scratch
 * are uploaded to the model's device(s) after a VRAM preflight per device
 * (GPE_ERR_INSUFFICIENT_VRAM naming the device and the numbers). */
gpe_status gpe_ctx_init(gpe_model *m, const gpe_ctx_params *params, gpe_ctx **out, char *err,
                        size_t errlen);
void gpe_ctx_free(gpe_ctx *ctx);
int gpe_ctx_n_ctx(const gpe_ctx *ctx);

/* What a context with these params would need on each device of the
 * model's placement, without allocating anything (CPU models: GPE_ERR_ARG).
 * out[i] is for the i-th device of the placement (devices[] order, or
 * gpu_device alone); *n_out receives how many. */
typedef struct gpe_vram_need {
    int device;
    int layer_begin, layer_end;         /* layers [begin, end) on this device */
    uint64_t weights, kv, scratch, reserve, total;
    uint64_t free_bytes;                /* free on that device now */
} gpe_vram_need;
gpe_status gpe_ctx_vram_estimate(const gpe_model *m, const gpe_ctx_params *p,
                                 gpe_vram_need out[GPE_MAX_DEVICES], int *n_out,
                                 char *err, size_t errlen);

/* After gpe_ctx_init: the backend a context runs on ("cpu", "cuda") and,
 * for GPU contexts, its devices and the bytes it holds on each (returns how
 * many entries were written; 0 for CPU contexts; free_bytes filled at the
 * call). */
const char *gpe_ctx_backend_name(const gpe_ctx *ctx);
int gpe_ctx_devices(const gpe_ctx *ctx, gpe_vram_need out[GPE_MAX_DEVICES]);
/* Forget everything sequence seq holds (its positions restart at 0). */
void gpe_seq_clear(gpe_ctx *ctx, int seq);
/* Keep the first n positions of sequence seq and forget the rest (n >=
 * what it holds: no change; n <= 0: as gpe_seq_clear). The sequence's next
 * token goes at position n. This is how a prompt that shares a prefix with
 * what a sequence holds reuses that prefix's K/V: truncate to the common
 * length, then decode only the rest (keep at least the last prompt token
 * to decode, since logits come only from a decode). K/V rows depend only on
 * the tokens at and before their position, so the result equals a fresh
 * prefill up to float rounding of the batch shapes. */
void gpe_seq_truncate(gpe_ctx *ctx, int seq, int n);
/* Number of positions sequence seq currently holds. */
int gpe_seq_len(const gpe_ctx *ctx, int seq);

/* A batch: tokens of one or more sequences decoded in one step. Tokens of a
 * sequence must be at consecutive positions following what the sequence
 * already holds. */
typedef struct gpe_batch gpe_batch;
gpe_batch *gpe_batch_init(int capacity);
void gpe_batch_free(gpe_batch *b);
void gpe_batch_clear(gpe_batch *b);
/* Returns the token's index in the batch, or -1 when full. */
int gpe_batch_add(gpe_batch *b, int32_t token, int pos, int seq, bool want_logits);
int gpe_batch_size(const gpe_batch *b);

/* Run the model on a batch. Prompt tokens of a sequence are processed
 * together (prefill); single tokens of several sequences share one pass over
 * the weights (decode). On error nothing is appended to the KV cache.
 * A device failure (any CUDA error, device lost, out of memory) returns
 * GPE_ERR_BACKEND (GPE_ERR_INSUFFICIENT_VRAM for out-of-memory) with a
 * message starting "CUDA device N: "; the context is then unusable (every
 * later decode fails): free it and create a new one. Test hook:
 * GPUPOOL_ENGINE_FAULT (docs/engine.md) injects such a failure on any
 * backend. */
gpe_status gpe_decode(gpe_ctx *ctx, const gpe_batch *b, char *err, size_t errlen);
/* Logits (n_vocab floats) of batch entry i from the last gpe_decode, or NULL
 * when that entry did not ask for logits. Valid until the next decode. */
const float *gpe_get_logits(const gpe_ctx *ctx, int i);

/* ------------------------------------------------------------- embeddings */

/* Pooled embeddings: each input runs through the model (no sampling); the
 * final hidden state after the output norm (n_embd floats per token) is
 * pooled as the model says and L2-normalised. Pooling comes from the GGUF's
 * <arch>.pooling_type: 1 mean, 2 cls (first token), 3 last token. A file
 * without the key, or with 0 (none: llama.cpp then gives one vector per
 * token, which no single-vector API can carry), pools the last token: in a
 * causal decoder it is the only position that has seen the whole input
 * (Qwen3-embedding-style files declare 3 for this reason). Other values
 * (4 rank) are GPE_ERR_UNSUPPORTED. */
typedef enum gpe_pooling {
    GPE_POOLING_MEAN = 1,
    GPE_POOLING_CLS = 2,
    GPE_POOLING_LAST = 3,
} gpe_pooling;

/* The pooling gpe_embed uses for this model, or -1 when unsupported. */
int gpe_model_pooling(const gpe_model *m);
/* True for an encoder-only model (bert, nomic-bert): it computes
 * embeddings only; gpe_decode refuses it (GPE_ERR_UNSUPPORTED). */
bool gpe_model_embeddings_only(const gpe_model *m);
/* Length of one embedding (n_embd); 0 for a vocab-only model. */
int gpe_model_embedding_dim(const gpe_model *m);
/* Embed one input: tokens[0..n) (1 <= n <= the context length) into out
 * (dim floats; dim must equal gpe_model_embedding_dim). Uses the context's
 * sequences as scratch: every sequence is cleared before and after, so call
 * it on a context that holds nothing the caller still needs. A backend
 * without embeddings gives GPE_ERR_UNSUPPORTED (the CPU and CUDA backends
 * both have them). */
gpe_status gpe_embed(gpe_ctx *ctx, const int32_t *tokens, int n, float *out, int dim, char *err,
                     size_t errlen);
/* Embed n_inputs inputs (tokens[i], n_tokens[i]) into out (n_inputs rows of
 * dim floats). Up to n_seq inputs at a time share each pass over the
 * weights (their tokens go into the same batches, n_batch tokens a pass);
 * each result equals gpe_embed of that input up to float rounding. Same
 * scratch rule as gpe_embed. */
gpe_status gpe_embed_batch(gpe_ctx *ctx, const int32_t *const *tokens, const int *n_tokens,
                           int n_inputs, float *out, int dim, char *err, size_t errlen);

/* ---------------------------------------------------------------- sampler */

/* Sampling runs in this fixed order: penalties (over the last repeat_last_n
 * accepted tokens: repetition as llama.cpp, logit > 0 ? l / r : l * r;
 * frequency/presence as OpenAI, l -= count * f + (count > 0) * p) ->
 * greedy if temperature < 1e-5 -> top-k -> temperature -> top-p -> min-p ->
 * one draw from a xoshiro256** generator seeded with seed. Out-of-range
 * values mean "off" (top_k <= 0, top_p <= 0 or >= 1, min_p <= 0,
 * repeat_penalty <= 0 or 1, repeat_last_n 0; -1 = all accepted tokens), so
 * a zero-initialised struct is greedy. Results do not depend on the
 * context's thread count. gpe_sampler_reset reseeds. Each
 * gpe_sampler_sample call that returns a token takes exactly one draw from
 * the generator (greedy calls too), so a sampler's whole state is its
 * parameters, the accepted tokens and the number of tokens sampled: see
 * gpe_sampler_advance. */
typedef struct gpe_sampler_params {
    float temperature;        /* 0 = greedy (argmax, lowest id on ties) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repeat_penalty;     /* 1 = off; applied to the last repeat_last_n tokens */
    int repeat_last_n;        /* default 64 */
    float frequency_penalty;  /* 0 = off */
    float presence_penalty;   /* 0 = off */
    uint64_t seed;            /* same seed + prompt + model -> same tokens */
} gpe_sampler_params;

typedef struct gpe_sampler gpe_sampler;
gpe_sampler_params gpe_sampler_default_params(void);
gpe_sampler *gpe_sampler_init(const gpe_sampler_params *p);
void gpe_sampler_free(gpe_sampler *s);
/* Choose the next token from logits (not modified). -1 (no draw taken) for
 * bad arguments or when memory ran out: for the sampler's scratch, or for
 * a token gpe_sampler_accept had to keep (the penalties would count another
 * window than the text's; every call says -1 then, until
 * gpe_sampler_reset). */
int32_t gpe_sampler_sample(gpe_sampler *s, const float *logits, int n_vocab);
/* Record a token (prompt or generated) for the penalties; kept only when a
 * penalty is on (nothing to remember, and no memory used, otherwise). */
void gpe_sampler_accept(gpe_sampler *s, int32_t token);
/* Move the generator forward as n_sampled gpe_sampler_sample calls would.
 * A sampler made with the same params, given the same accepted tokens
 * (prompt and generated, in order) and advanced by the number of tokens
 * the first one sampled, samples exactly what the first one would have
 * next (resuming a generation elsewhere). */
void gpe_sampler_advance(gpe_sampler *s, uint64_t n_sampled);
void gpe_sampler_reset(gpe_sampler *s);

/* Stop strings over the streamed text. Feed each piece; the matcher holds
 * back text that could be the start of a stop string so that a stop string
 * never reaches the client, and an incomplete UTF-8 character at the end
 * (emitted text is whole characters when the pieces are valid UTF-8). */
typedef struct gpe_stop gpe_stop;
gpe_stop *gpe_stop_init(const char *const *stops, size_t n);
void gpe_stop_free(gpe_stop *st);
/* Append piece; *emit and *emit_len receive text safe to send now (borrowed,
 * valid until the next call). Returns true when a stop string matched (the
 * text before it has been emitted; generation should end). */
bool gpe_stop_feed(gpe_stop *st, const char *piece, size_t len, const char **emit,
                   size_t *emit_len);
/* The same, and *status (may be NULL) GPE_ERR_NOMEM when memory ran out
 * holding the piece back: nothing is emitted (*emit "", *emit_len 0), the
 * piece is lost, and the matcher is spent: every later feed and flush says
 * GPE_ERR_NOMEM again and emits nothing (the text would have a hole; end
 * the generation as out of memory). GPE_OK otherwise. gpe_stop_feed is
 * this form with the status unread: a matcher that ran out of memory then
 * emits nothing more, unreported. */
bool gpe_stop_feed_status(gpe_stop *st, const char *piece, size_t len, const char **emit,
                          size_t *emit_len, gpe_status *status);
/* After gpe_stop_feed returned true: the index (in the init list) of the
 * stop string that matched (the earliest in the text); -1 before a match. */
int gpe_stop_which(const gpe_stop *st);
/* At the end of generation: whatever is still held back. */
void gpe_stop_flush(gpe_stop *st, const char **emit, size_t *emit_len);
/* The same; *status (may be NULL) GPE_ERR_NOMEM, nothing emitted, when an
 * earlier feed ran out of memory (see gpe_stop_feed_status). */
void gpe_stop_flush_status(gpe_stop *st, const char **emit, size_t *emit_len,
                           gpe_status *status);
/* Resume a stream: take held (len bytes) as text fed earlier and still
 * held back, without emitting it (the generated text of a previous
 * matcher that it had not emitted yet). The next gpe_stop_feed then
 * behaves exactly as that matcher's would, so a stop string that started
 * in the held text is still found. 0, or -1 on ENOMEM / bad arguments /
 * a spent matcher (nothing taken then). */
int gpe_stop_prime(gpe_stop *st, const char *held, size_t len);

/* ------------------------------------------------------ structured output */

/* JSON-Schema-constrained sampling (docs/api.md "Structured outputs" lists
 * the keywords enforced; any other keyword is refused, naming it). The
 * output is compact JSON (no whitespace), object properties in the order
 * the schema declares them. Per sequence: one gpe_grammar per generation.
 *
 *   gpe_grammar *g; gpe_grammar_init(m, schema_text, &g, err, sizeof err);
 *   each step: const float *l = gpe_grammar_mask(g, logits, n_vocab, left);
 *              tok = gpe_sampler_sample(s, l, n_vocab); gpe_grammar_accept(g, tok);
 *              stop when gpe_token_is_eog(tok) or gpe_grammar_done(g) */
typedef struct gpe_grammar gpe_grammar;

/* Check a schema (JSON text) without a model: GPE_OK, GPE_ERR_ARG (not
 * JSON), GPE_ERR_UNSUPPORTED (err names the keyword or the problem: the
 * client's fault) or GPE_ERR_NOMEM (out of memory, err says so: not the
 * schema's fault, a retry may pass). NULL or "" is the json_object mode:
 * any JSON object. */
gpe_status gpe_schema_check(const char *schema, char *err, size_t errlen);
gpe_status gpe_grammar_init(const gpe_model *m, const char *schema, gpe_grammar **out,
                            char *err, size_t errlen);
void gpe_grammar_free(gpe_grammar *g);
/* The per-model part (each token's bytes, grouped for the mask: a pass
 * over the vocabulary, milliseconds for 100k tokens), to build once and
 * share: read-only, so grammars on several threads may use one. It must
 * outlive the grammars made from it. gpe_grammar_init builds its own. */
typedef struct gpe_grammar_vocab gpe_grammar_vocab;
gpe_status gpe_grammar_vocab_init(const gpe_model *m, gpe_grammar_vocab **out);
void gpe_grammar_vocab_free(gpe_grammar_vocab *v);
gpe_status gpe_grammar_init_vocab(const gpe_grammar_vocab *v, const char *schema,
                                  gpe_grammar **out, char *err, size_t errlen);
/* Logits with every token the schema does not allow next set to -inf (a
 * buffer of g's, valid until the next call; logits is not modified). left:
 * tokens the generation may still produce, this one included (<= 0:
 * unbounded); tokens that would leave the value unfinishable in that many
 * are masked too, so the value closes before the budget ends. End-of-
 * generation tokens are allowed only where the value is complete. */
const float *gpe_grammar_mask(gpe_grammar *g, const float *logits, int n_vocab, int left);
/* Advance by the sampled token. GPE_ERR_ARG when the schema does not allow
 * it (the state is then unchanged). */
gpe_status gpe_grammar_accept(gpe_grammar *g, int32_t token);
/* Advance by text written earlier (a continuation after a failover). */
gpe_status gpe_grammar_accept_text(gpe_grammar *g, const char *text, size_t len);
/* The value is closed: nothing more may follow (stop the generation). */
bool gpe_grammar_done(const gpe_grammar *g);
/* The value may end here (a closed value, or a number that may also go on). */
bool gpe_grammar_complete(const gpe_grammar *g);

/* ------------------------------------------------ JSON under memory pressure */

/* The engine reads and writes JSON (schemas, values to validate, tool
 * calls and their arguments) with jansson, whose 2.14 release does not
 * always notice an allocation it could not make: a load can drop a byte
 * from a string or report a syntax error for valid text, a dump can leave
 * out an object's key, and each still "succeeds". The engine does not
 * install an allocator of its own (jansson has one per process, the
 * host's); a host that gives jansson a counting one (json_set_alloc_funcs)
 * hands the engine its counter here, and every load and dump the engine
 * makes is then believed only when the count did not move during it:
 * otherwise the call fails as out of memory (GPE_ERR_NOMEM, "out of
 * memory", or the API's own way of saying so).
 *
 * count() returns how many of jansson's allocations have failed on the
 * calling thread (per thread: the engine reads it before and after an
 * operation on one thread, and another thread's failures must not show
 * there). It never goes down (wrapping past ULONG_MAX is fine: only
 * equality is compared), it is cheap, and it neither calls jansson nor
 * allocates. Register it once at start-up, before any thread uses the
 * engine, and after the counting allocator is in place; NULL goes back to
 * the default.
 *
 * Without a counter the engine guards itself: a load is believed only
 * when a second load agrees with it (or repeats its refusal), and a dump
 * only when its text reads back as the value it was made from. The dump's
 * check is complete; the load's misses a shortage that fails the same
 * allocation in both loads, so a host that can count should register. */
typedef unsigned long (*gpe_json_alloc_failures_fn)(void);
void gpe_set_json_alloc_failures(gpe_json_alloc_failures_fn count);

/* The host's JSON loader, for every text the engine reads (schemas,
 * values to validate, tool calls and their arguments) in place of
 * jansson's json_loadb. jansson 2.14's loader can crash when an
 * allocation fails while it reads a string (it loses the byte it could
 * not save, a closing quote or an escape's letter, and reads and writes
 * past its buffer, or aborts): no counter can undo that, so a host with a
 * loader of its own that does not run jansson's (gpupool's:
 * gp_json_load_checked) hands it over here.
 *
 * load(p, n, flags, err) reads the n bytes at p as json_loadb(p, n, flags,
 * err) does, for every load flag the engine passes (JSON_DECODE_ANY,
 * JSON_ALLOW_NUL, JSON_DECODE_INT_AS_REAL, JSON_REJECT_DUPLICATES): the
 * same tree (a new reference), or NULL with err saying why. Out of memory
 * anywhere in it is NULL with json_error_code(err) ==
 * json_error_out_of_memory (the engine's GPE_ERR_NOMEM, "out of memory"),
 * never a tree that differs from the text. err may be NULL. The engine
 * believes its answer as it stands (no counter, no second load). Register
 * it once at start-up, before any thread uses the engine; NULL goes back
 * to jansson's loader, judged as above. */
struct json_t;
struct json_error_t;
typedef struct json_t *(*gpe_json_load_fn)(const char *p, size_t n, size_t flags,
                                           struct json_error_t *err);
void gpe_set_json_loader(gpe_json_load_fn load);

/* ----------------------------------------------------------------- system */

/* Which SIMD path the CPU backend chose at run time ("avx512", "avx2", "scalar"). */
const char *gpe_cpu_features(void);
/* GPUs the CUDA backend sees. Loads the backend on first use (it is a
 * plugin, libgpupool-cuda.so, loaded at run time: a machine without the CUDA
 * runtime or driver simply has 0 devices; docs/cuda.md says where it is
 * looked for). Returns the number of devices (0 when none); when 0, `why`
 * (may be NULL) says why in one line. */
int gpe_gpu_count(char *why, size_t whylen);

typedef struct gpe_gpu_info {
    int index;
    char name[96];              /* "NVIDIA H100 80GB HBM3" */
    char pci_bus_id[32];
    int cc_major, cc_minor;
    uint64_t total_bytes, free_bytes;   /* cudaMemGetInfo at the time of the call */
} gpe_gpu_info;
gpe_status gpe_gpu_info_get(int device, gpe_gpu_info *out, char *err, size_t errlen);

/* Path of the CUDA plugin the engine loaded (after gpe_gpu_count or any
 * other first GPU use), NULL when none is loaded. For logs. */
const char *gpe_cuda_plugin_path(void);

/* Is the CUDA backend loadable, and are devices visible? (gpe_gpu_count > 0) */
bool gpe_cuda_available(void);
/* CUDA backend self-test (kernels vs the CPU reference); message in err. */
gpe_status gpe_cuda_selftest(char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
