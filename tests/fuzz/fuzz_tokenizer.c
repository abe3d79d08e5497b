/*
 * libFuzzer target: the engine's tokenizers on arbitrary bytes, with real
 * vocabularies loaded once: the bundled stories260K (SentencePiece), GPT-2
 * (byte-level BPE) and bert-bge (WordPiece) from tests/data/vocab.
 *
 * Input: byte 0 picks the vocabulary (and whether special-token text is
 * parsed); the rest is the text, not NUL-terminated (ASan sees any read
 * past it).
 * Checked, beyond no crash:
 *   - every id is in the vocabulary and its piece can be rendered;
 *   - cutting long texts into chunks (the default) changes no id;
 *   - for valid UTF-8 with special-token parsing off, decoding gives the
 *     text back: exactly for byte-level BPE, after the one space the
 *     SentencePiece vocabulary prefixes (add_space_prefix) for spm, unless
 *     the text holds spm's space mark U+2581 itself. WordPiece
 *     normalises (lower case, accents, spaces), so it has no such property.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

enum { V_SPM, V_BPE, V_WPM, NV };
static const char *const vocab_files[NV] = {
    GP_SOURCE_DIR "/models/stories260K.gguf",
    GP_TEST_DATA "/vocab/ggml-vocab-gpt-2.gguf",
    GP_TEST_DATA "/vocab/ggml-vocab-bert-bge.gguf",
};
static gpe_tokenizer *tok[NV];      /* chunking on (the default) */
static gpe_tokenizer *tok_nc[NV];   /* chunking off */

static gpe_tokenizer *load(const char *path)
{
    char err[256];
    gpe_gguf *g = NULL;
    if (gpe_gguf_open(path, &g, err, sizeof err) != GPE_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        exit(1);
    }
    gpe_tokenizer *t = gpe_tokenizer_load(g, err, sizeof err);
    gpe_gguf_close(g);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        exit(1);
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    for (int i = 0; i < NV; i++) {
        tok[i] = load(vocab_files[i]);
        tok_nc[i] = load(vocab_files[i]);
        gpe_tokenizer_set_chunking(tok_nc[i], false);
    }
    return 0;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static bool utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + k >= n)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k + 1;
    }
    return true;
}

static int32_t *encode(const gpe_tokenizer *t, const char *text, size_t len, bool special,
                       int *n)
{
    int max = (int)len + 8;
    int32_t *ids = malloc(sizeof *ids * (size_t)max);
    if (!ids)
        abort();
    int k = gpe_tokenizer_encode(t, text, len, special, special, ids, max);
    if (k < 0 && k != INT32_MIN) {
        /* an invalid byte can cost several ids (U+FFFD as byte tokens) */
        max = -k;
        ids = realloc(ids, sizeof *ids * (size_t)max);
        if (!ids)
            abort();
        k = gpe_tokenizer_encode(t, text, len, special, special, ids, max);
        if (k != max)
            abort(); /* the count asked for must be the count given */
    }
    if (k < 0)
        abort();
    *n = k;
    return ids;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const int v = data[0] % NV;
    const bool special = (data[0] / NV) & 1;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const gpe_tokenizer *t = tok[v];

    int n, n2;
    int32_t *ids = encode(t, text, len, special, &n);
    int32_t *ids2 = encode(tok_nc[v], text, len, special, &n2);
    if (n != n2 || memcmp(ids, ids2, sizeof *ids * (size_t)n) != 0)
        abort(); /* chunking changed the ids */
    free(ids2);

    const int nv = gpe_tokenizer_n_vocab(t);
    size_t cap = len * 8 + 64, out_len = 0;
    char *out = malloc(cap);
    if (!out)
        abort();
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= nv)
            abort();
        char piece[256];
        int k = gpe_tokenizer_piece(t, ids[i], piece, sizeof piece, false);
        if (k < 0)
            abort(); /* no piece of these vocabularies is that long */
        if (out_len + (size_t)k > cap)
            abort(); /* decoding grew the text more than 8x */
        memcpy(out + out_len, piece, (size_t)k);
        out_len += (size_t)k;
    }
    /* spm decodes its space mark U+2581 as a space (as SentencePiece
     * does), so a text holding that character cannot come back as it was. */
    bool roundtrip = !special && v != V_WPM && utf8_valid((const uint8_t *)text, len) &&
                     !(v == V_SPM && memmem(text, len, "\xe2\x96\x81", 3));
    if (roundtrip) {
        const char *o = out;
        size_t ol = out_len;
        if (v == V_SPM && ol > 0 && o[0] == ' ') { /* the space prefix */
            o++;
            ol--;
        }
        if (ol != len || memcmp(o, text, len) != 0)
            abort();
    }
    free(out);
    free(ids);
    return 0;
}
