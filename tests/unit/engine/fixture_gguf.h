/*
 * fixture_gguf: a copy of a GGUF model file (the test models under
 * models/) with a piece of its metadata rewritten, for engine tests that
 * need the model with something it does not have: a token list with
 * tokens longer than the engine's old fixed buffers, a chat template with
 * a tools format. The tensors are copied as they are.
 *
 * Used by test_backend_gguf_oom.c and test_run_long_token.c. Failures are
 * cmocka assertions (the caller's test stops there).
 */
#ifndef FIXTURE_GGUF_H
#define FIXTURE_GGUF_H

#include <stdint.h>

/* src copied to dst with its tokens (tokenizer.ggml.tokens) from[k]
 * spelled to[k] instead, for k < nr; ids[k] is from[k]'s id. Each from[k]
 * must be in the vocabulary (asserted). */
void fixture_gguf_with_tokens(const char *src, const char *dst, const char *const *from,
                              const char *const *to, int32_t *ids, int nr);

/* src copied to dst with tokenizer.chat_template set to tmpl and
 * llama.context_length to ctx (both replaced, or added). */
void fixture_gguf_with_template(const char *src, const char *dst, const char *tmpl,
                                uint32_t ctx);

/* A new empty file named after path, a template ending "XXXXXX.gguf"
 * (mkstemps): path is its name. */
void fixture_gguf_tmp(char *path);

#endif
