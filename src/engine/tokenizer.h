/*
 * tokenizer: the vocabulary of a GGUF model and its tokenizers,
 * SentencePiece-style ("llama", spm), GPT-2 byte-level BPE ("gpt2") and BERT
 * WordPiece ("bert", wpm), giving the same ids as llama.cpp on its test
 * vectors.
 *
 * Metadata read (GGUF keys, all under "tokenizer.ggml."):
 *   model            "llama" | "gpt2" | "bert" (anything else is refused)
 *   pre              BPE pre-tokenizer name ("gpt-2", "llama-bpe", "qwen2",
 *                    "deepseek-coder", ...). Unknown names fall back to the
 *                    gpt-2 split with a warning (gpe_tokenizer_warning).
 *   tokens           string[n_vocab]
 *   scores           f32[n_vocab] (spm merge priorities; optional)
 *   token_type       i32[n_vocab]: 1 normal, 2 unknown, 3 control,
 *                    4 user-defined, 5 unused, 6 byte (optional: all normal)
 *   merges           string[] "left right" (bpe; rank = index)
 *   bos_token_id, eos_token_id, unknown_token_id, eot_token_id, eom_token_id
 *   add_bos_token, add_eos_token, add_space_prefix
 *   Defaults when absent follow llama.cpp: spm adds BOS and a space prefix,
 *   bpe adds BOS only for the llama-3 pre-tokenizer, bert adds [CLS] (bos /
 *   cls_token_id) before and [SEP] (seperator_token_id) after.
 *
 * Usage (the model code wraps these as gpe_tokenize & co):
 *
 *   gpe_tokenizer *t = gpe_tokenizer_load(g, err, sizeof err);
 *   int32_t ids[64];
 *   int n = gpe_tokenizer_encode(t, "Hello", 5, true, false, ids, 64);
 *   if (n < 0) { ...grow to -n and retry... }
 *   char piece[64];
 *   int k = gpe_tokenizer_piece(t, ids[0], piece, sizeof piece, false);
 *   gpe_tokenizer_free(t);
 *
 * Ownership: the tokenizer copies what it needs from the gpe_gguf, which may
 * be closed right after load. Strings returned are owned by the tokenizer.
 * Threading: immutable after load; every function is thread-safe.
 */
#ifndef GPUPOOL_ENGINE_TOKENIZER_H
#define GPUPOOL_ENGINE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"

typedef struct gpe_tokenizer gpe_tokenizer;

/* Token types (tokenizer.ggml.token_type values). */
enum {
    GPE_TOKTYPE_UNDEFINED = 0,
    GPE_TOKTYPE_NORMAL = 1,
    GPE_TOKTYPE_UNKNOWN = 2,
    GPE_TOKTYPE_CONTROL = 3,
    GPE_TOKTYPE_USER_DEFINED = 4,
    GPE_TOKTYPE_UNUSED = 5,
    GPE_TOKTYPE_BYTE = 6,
};

/* Build the tokenizer from a GGUF's metadata. NULL with err set on a
 * missing/malformed vocabulary or an unsupported tokenizer.ggml.model. */
gpe_tokenizer *gpe_tokenizer_load(const gpe_gguf *g, char *err, size_t errlen);
/* The same with why in *st (st may be NULL): GPE_OK; GPE_ERR_NOMEM, an
 * allocation failed (err says "out of memory ...": not the file's fault, a
 * retry may pass); GPE_ERR_FORMAT, a missing or malformed vocabulary or an
 * unsupported tokenizer.ggml.model; GPE_ERR_ARG, g NULL. */
gpe_tokenizer *gpe_tokenizer_load_status(const gpe_gguf *g, char *err, size_t errlen,
                                         gpe_status *st);
void gpe_tokenizer_free(gpe_tokenizer *t);   /* NULL is fine */

/* Non-fatal remark from load (e.g. "unknown pre-tokenizer 'x', using
 * gpt-2"), or NULL when there is none. */
const char *gpe_tokenizer_warning(const gpe_tokenizer *t);

/* Tokenize len bytes of text (need not be NUL-terminated; any bytes are
 * accepted, invalid UTF-8 included). add_special: add BOS/EOS as the
 * metadata asks. parse_special: text of control tokens ("<s>",
 * "<|im_start|>") becomes their id; user-defined tokens are always matched.
 * Returns the number of ids written to out, -(needed) when max is too small
 * (out then holds the first max ids), or INT32_MIN when memory runs out or
 * the count would not fit an int. */
int gpe_tokenizer_encode(const gpe_tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, int32_t *out, int max);

/* Text of token id for output: byte tokens give their byte, spm/wpm "▁"
 * becomes a space, bpe byte-level characters are decoded to bytes. Control
 * and unknown tokens give "" unless special is true. Returns the bytes
 * written (no NUL is added), -(needed) when len is too small, 0 for an id
 * out of range. */
int gpe_tokenizer_piece(const gpe_tokenizer *t, int32_t id, char *buf, size_t len, bool special);

/* End of generation: EOS, EOT, EOM and tokens such as <|im_end|>,
 * <|eot_id|>, <|end|>, <end_of_turn>, <|endoftext|>. */
bool gpe_tokenizer_is_eog(const gpe_tokenizer *t, int32_t id);

int gpe_tokenizer_n_vocab(const gpe_tokenizer *t);
/* BOS/EOS ids: the metadata's, else llama.cpp's defaults (spm 1/2, bpe
 * 11/11, bert [CLS] 101 / none); -1 when that id is not in the vocabulary. */
int32_t gpe_tokenizer_bos(const gpe_tokenizer *t);
int32_t gpe_tokenizer_eos(const gpe_tokenizer *t);
bool gpe_tokenizer_add_bos(const gpe_tokenizer *t);
bool gpe_tokenizer_add_eos(const gpe_tokenizer *t);
/* "llama" (spm), "gpt2" (bpe) or "bert" (wpm): tokenizer.ggml.model. */
const char *gpe_tokenizer_kind(const gpe_tokenizer *t);
/* Pre-tokenizer in use ("default" for spm, else the bpe split's name). */
const char *gpe_tokenizer_pre(const gpe_tokenizer *t);

/* Raw vocabulary text of id, as stored in the GGUF (e.g. "<s>", "▁the",
 * "Ġthe"); NULL when id is out of range. *len (optional) gets the length. */
const char *gpe_tokenizer_token_text(const gpe_tokenizer *t, int32_t id, size_t *len);
/* GPE_TOKTYPE_* of id (GPE_TOKTYPE_UNDEFINED when out of range). */
int gpe_tokenizer_token_type(const gpe_tokenizer *t, int32_t id);

/* Tests/benchmarks only (not thread-safe: call before sharing t): turn off
 * the cutting of long texts into independently merged chunks, to check that
 * it changes no id. On by default. */
void gpe_tokenizer_set_chunking(gpe_tokenizer *t, bool on);

/* Exposed for tests and tools: split text the way the BPE pre-tokenizer pre
 * (a tokenizer.ggml.pre name; unknown names use gpt-2) does, before the
 * byte-level mapping. Invalid UTF-8 bytes become U+FFFD as in llama.cpp.
 * Returns a malloc'd buffer (caller frees) of *n pieces stored one after the
 * other, each NUL-terminated, or NULL when out of memory. */
char *gpe_pretok_split(const char *pre, const char *text, size_t len, size_t *n);

#endif
