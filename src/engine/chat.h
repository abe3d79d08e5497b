/*
 * chat: chat-template families, internal helpers for gpe_chat_apply.
 *
 * engine.h declares the public part (gpe_chat_detect, gpe_chat_apply_format;
 * implemented in chat.c). gpe_chat_apply, which needs the model, lives with
 * the model code and is expected to be:
 *
 *   const char *fam = gpe_chat_detect(tmpl);               // once, at load
 *   return gpe_chat_apply_format(fam, bos_text, eos_text, msgs, n, add, err, errlen);
 *
 * where bos_text/eos_text are the pieces of the model's BOS/EOS tokens (NULL
 * lets chat.c use the family's usual texts, gpe_chat_default_bos/eos).
 *
 * Tokenizing the rendered prompt: families that write the BOS text
 * themselves (gpe_chat_writes_bos) must be tokenized with add_special =
 * false and parse_special = true, or the prompt starts with two BOS tokens;
 * the others with add_special = true (BOS as the model's metadata asks) and
 * parse_special = true. docs/chat-templates.md shows each family's output.
 */
#ifndef GPE_CHAT_H
#define GPE_CHAT_H

#include <stdbool.h>

/* Canonical family name for a name or alias ("llama2" -> "llama-2",
 * "phi3" -> "phi-3", NULL -> "fallback"), or NULL when unknown. The result
 * is a static string, comparable by pointer to gpe_chat_detect's. */
const char *gpe_chat_family_name(const char *name);
/* Usual BOS/EOS texts of a family ("" when the family has none). */
const char *gpe_chat_default_bos(const char *family);
const char *gpe_chat_default_eos(const char *family);
/* Does the rendered prompt start with the BOS text? */
bool gpe_chat_writes_bos(const char *family);
/* Text that ends an assistant turn in this family ("<|im_end|>",
 * "<|eot_id|>", ...; for llama-2/mistral/zephyr the EOS text "</s>"), or ""
 * for the fallback. Useful as an extra stop string when the end token is
 * not marked as end-of-generation in the vocabulary. */
const char *gpe_chat_end_of_turn(const char *family);
/* Does the family have a tools format (chatml, llama-3, mistral)? Whether a
 * given model uses it depends on its template text:
 * gpe_chat_template_supports_tools (engine.h). */
bool gpe_chat_format_has_tools(const char *family);

#endif
