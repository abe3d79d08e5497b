/*
 * tokenizer: vocabulary and the SentencePiece-style, GPT-2 byte-level BPE
 * and BERT WordPiece tokenizers (see tokenizer.h).
 *
 * The behaviour reproduces llama.cpp's (llama-vocab.cpp, unicode.cpp) so that
 * ids match its test vectors; everything here is written from the described
 * behaviour, not from its code. Sections, low level to high level:
 *   growable vectors, FNV hashing, 4-ary heap of merge candidates
 *   text -> id and merge -> rank maps, cover trie (safe cut points)
 *   byte-level (GPT-2 bytes_to_unicode) mapping
 *   pre-tokenizer matchers and the split driver
 *   spm / bpe word merging, wpm longest-match
 *   special-token partition (trie, longest tokens first)
 *   encode, piece, accessors, load
 *
 * Costs: merging is O(k log k) per chunk of k characters; long texts are cut
 * into chunks at points no merge can cross (cover trie), so 1 MB of ordinary
 * text takes about 0.1-0.25 s. A 1 MB run of one character has no such
 * points and is merged as one chunk (0.3-0.9 s): still O(n log n).
 */
#include "engine/tokenizer.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/unicode.h"

/* ================================================================ helpers */

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Growable arrays. grow() doubles capacity; returns false on overflow/OOM. */
static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem)
            return false;
        nc *= 2;
    }
    void *q = realloc(*p, nc * elem);
    if (!q)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

typedef struct ivec { int32_t *v; size_t n, cap; bool oom; } ivec;

static void ivec_push(ivec *a, int32_t x)
{
    if (a->oom)
        return;
    if (!grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) {
        a->oom = true;
        return;
    }
    a->v[a->n++] = x;
}

typedef struct bvec { char *v; size_t n, cap; bool oom; } bvec;

static void bvec_put(bvec *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (n > SIZE_MAX - b->n - 1 || !grow((void **)&b->v, &b->cap, b->n + n + 1, 1)) {
        b->oom = true;
        return;
    }
    memcpy(b->v + b->n, p, n);
    b->n += n;
    b->v[b->n] = 0;
}

/* FNV-1a, fed in pieces so that "left right" keys need no concatenation. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

/* ============================================================ 4-ary heap */

/* A candidate merge of symbols left and right. key orders the heap, lowest
 * first: (priority << 32) | left, so that equal priorities go leftmost
 * first as in llama.cpp's priority queues (spm priority: the score, made an
 * ordered integer, highest first; bpe: the merge rank). size is the merged
 * byte length when pushed; a popped entry whose symbols changed since is
 * stale and skipped. A 4-ary heap: one cache line holds the four children,
 * which matters when a long text makes the heap large. */
typedef struct bigram {
    uint64_t key;
    int32_t right;
    uint32_t size;
} bigram;

typedef struct heap { bigram *v; size_t n, cap; bool oom; } heap;

static uint64_t bg_key(uint32_t prio, int32_t left) { return ((uint64_t)prio << 32) | (uint32_t)left; }
static int32_t bg_left(const bigram *b) { return (int32_t)(uint32_t)b->key; }

/* Ordered integer for "higher score first". */
static uint32_t score_prio(float score)
{
    uint32_t u;
    memcpy(&u, &score, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);   /* ascending with score */
    return ~u;                                            /* descending */
}

static void heap_push(heap *h, bigram b)
{
    if (h->oom)
        return;
    if (!grow((void **)&h->v, &h->cap, h->n + 1, sizeof *h->v)) {
        h->oom = true;
        return;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (b.key >= h->v[p].key)
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = b;
}

static bigram heap_pop(heap *h)
{
    bigram top = h->v[0];
    bigram last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n)
            break;
        size_t best = c, end = c + 4 < n ? c + 4 : n;
        for (size_t k = c + 1; k < end; k++)
            if (h->v[k].key < h->v[best].key)
                best = k;
        if (h->v[best].key >= last.key)
            break;
        h->v[i] = h->v[best];
        i = best;
    }
    if (n)
        h->v[i] = last;
    return top;
}

/* ============================================================ tokenizer */

enum { KIND_SPM, KIND_BPE, KIND_WPM };

/* BPE pre-tokenizers (the regex families of llama.cpp's pre types). */
enum pre_kind {
    PRE_DEFAULT,        /* llama.cpp's default list (pre "default" or absent) */
    PRE_GPT2,
    PRE_LLAMA3,
    PRE_QWEN2,
    PRE_DEEPSEEK_LLM,
    PRE_DEEPSEEK_CODER,
    PRE_FALCON,
    PRE_STARCODER,
};

/* tokenizer.ggml.pre names per family (facts from llama.cpp's
 * llama-vocab.cpp pre-type table). */
static const struct { const char *name; enum pre_kind kind; } k_pre_names[] = {
    {"default", PRE_DEFAULT},
    {"gpt-2", PRE_GPT2}, {"phi-2", PRE_GPT2}, {"jina-es", PRE_GPT2}, {"jina-de", PRE_GPT2},
    {"gigachat", PRE_GPT2}, {"jina-v1-en", PRE_GPT2}, {"jina-v2-es", PRE_GPT2},
    {"jina-v2-de", PRE_GPT2}, {"jina-v2-code", PRE_GPT2}, {"roberta-bpe", PRE_GPT2},
    {"mpt", PRE_GPT2}, {"olmo", PRE_GPT2}, {"jais", PRE_GPT2}, {"trillion", PRE_GPT2},
    {"llama3", PRE_LLAMA3}, {"llama-v3", PRE_LLAMA3}, {"llama-bpe", PRE_LLAMA3},
    {"falcon3", PRE_LLAMA3}, {"pixtral", PRE_LLAMA3}, {"dbrx", PRE_LLAMA3},
    {"smaug-bpe", PRE_LLAMA3}, {"chatglm-bpe", PRE_LLAMA3},
    {"qwen2", PRE_QWEN2}, {"deepseek-r1-qwen", PRE_QWEN2}, {"stablelm2", PRE_QWEN2},
    {"megrez", PRE_QWEN2}, {"hunyuan", PRE_QWEN2},
    {"deepseek-llm", PRE_DEEPSEEK_LLM},
    {"deepseek-coder", PRE_DEEPSEEK_CODER},
    {"falcon", PRE_FALCON},
    {"starcoder", PRE_STARCODER}, {"refact", PRE_STARCODER}, {"command-r", PRE_STARCODER},
    {"smollm", PRE_STARCODER}, {"codeshell", PRE_STARCODER}, {"exaone", PRE_STARCODER},
    {"minerva-7b", PRE_STARCODER},
};

/* Per-token attribute byte: type in the low 3 bits, then flags. */
#define ATTR_TYPE 0x07
#define ATTR_EOG 0x08
#define ATTR_LSTRIP 0x10
#define ATTR_RSTRIP 0x20

/* Trie of special-token texts, for the partition. */
typedef struct trie_node {
    int32_t child;     /* first child, -1 none */
    int32_t sibling;   /* next sibling, -1 none */
    int32_t token;     /* token ending here, -1 none */
    unsigned char byte;
} trie_node;

/* Cover trie (see its section below). */
typedef struct cover {
    uint32_t *keys;   /* (node << 8 | byte) + 1, 0 = empty */
    uint32_t *vals;   /* child node | COVER_END when a string ends there */
    uint64_t mask;
    uint32_t n_nodes;
} cover;

struct gpe_tokenizer {
    int kind;
    enum pre_kind pre;
    const char *pre_name;
    int32_t n_vocab;

    char *pool;                 /* token texts, each NUL-terminated */
    uint64_t *tok_off;          /* [n_vocab] offset into pool */
    uint32_t *tok_len;          /* [n_vocab] */
    float *scores;              /* [n_vocab] */
    unsigned char *attr;        /* [n_vocab] ATTR_* */

    uint32_t *tok_slots;        /* text -> id+1, open addressing */
    uint64_t tok_mask;

    /* bpe merges: "left right" texts (in mpool) -> rank */
    char *mpool;
    uint64_t *m_off;
    uint32_t *m_len, *m_llen;   /* whole length, left length */
    uint32_t *m_slots;          /* rank+1 */
    uint64_t m_mask;
    int32_t n_merges;

    int32_t bos, eos, unk, eot, eom, sep;
    uint32_t max_tok_len;       /* longest token text (wpm) */
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t byte_tok[256];      /* spm <0xXX> tokens, -1 absent */

    trie_node *trie;            /* specials: control, user-defined, unknown */
    int32_t n_trie;
    int32_t trie_root[256];
    uint32_t *spec_lens;        /* distinct special lengths, descending */
    size_t n_spec_lens;

    cover cov;                  /* see cover trie; empty when not built */
    bool no_chunking;           /* gpe_tokenizer_set_chunking(t, false) */

    char warning[160];
};

/* ------------------------------------------------------- text -> id map */

static const char *tok_text(const gpe_tokenizer *t, int32_t id) { return t->pool + t->tok_off[id]; }

static int32_t tok_find(const gpe_tokenizer *t, const char *s, size_t n)
{
    uint64_t h = fnv(FNV_INIT, s, n);
    for (uint64_t i = h & t->tok_mask;; i = (i + 1) & t->tok_mask) {
        uint32_t v = t->tok_slots[i];
        if (!v)
            return -1;
        int32_t id = (int32_t)(v - 1);
        if (t->tok_len[id] == n && memcmp(tok_text(t, id), s, n) == 0)
            return id;
    }
}

static int32_t merge_rank(const gpe_tokenizer *t, const char *l, size_t ln, const char *r,
                          size_t rn)
{
    if (!t->m_slots)
        return -1;
    uint64_t h = fnv(fnv(fnv(FNV_INIT, l, ln), " ", 1), r, rn);
    for (uint64_t i = h & t->m_mask;; i = (i + 1) & t->m_mask) {
        uint32_t v = t->m_slots[i];
        if (!v)
            return -1;
        int32_t k = (int32_t)(v - 1);
        const char *s = t->mpool + t->m_off[k];
        if (t->m_llen[k] == ln && t->m_len[k] == ln + 1 + rn && memcmp(s, l, ln) == 0 &&
            memcmp(s + ln + 1, r, rn) == 0)
            return k;
    }
}

/* ----------------------------------------------------- cover trie */

/*
 * A trie over the strings a merge can produce (spm: every vocabulary text;
 * bpe: every merge's left+right), as a hash map (node, byte) -> child.
 * Its use: a merged symbol is always one of those strings, sitting where it
 * occurs in the text, so a symbol boundary that no occurrence straddles can
 * never be merged across. Cutting a long text at such boundaries and running
 * the merges per chunk gives exactly the single global run (merges on
 * either side never compete: they are independent), with small heaps
 * instead of one heap over the whole text.
 */

#define COVER_END 0x80000000u
#define COVER_MAX_NODES 0x00FFFFFFu

static uint64_t cover_hash(uint32_t key) { return (key * 0x9E3779B97F4A7C15ULL) >> 20; }

static uint32_t *cover_slot(const cover *c, uint32_t key)
{
    for (uint64_t i = cover_hash(key) & c->mask;; i = (i + 1) & c->mask)
        if (c->keys[i] == key || c->keys[i] == 0)
            return &c->keys[i];
}

/* Double the table (load stays <= 1/2). */
static bool cover_grow(cover *c)
{
    uint64_t size = (c->mask + 1) * 2;
    cover nc = {calloc(size, sizeof *nc.keys), calloc(size, sizeof *nc.vals), size - 1,
                c->n_nodes};
    if (!nc.keys || !nc.vals) {
        free(nc.keys);
        free(nc.vals);
        return false;
    }
    for (uint64_t i = 0; i <= c->mask; i++) {
        if (!c->keys[i])
            continue;
        uint32_t *k = cover_slot(&nc, c->keys[i]);
        *k = c->keys[i];
        nc.vals[k - nc.keys] = c->vals[i];
    }
    free(c->keys);
    free(c->vals);
    *c = nc;
    return true;
}

/* Add s[0..n). false when out of memory or nodes (then the trie is dropped:
 * chunking is only an optimisation). */
static bool cover_add(cover *c, const char *s, size_t n)
{
    uint32_t node = 0;
    for (size_t d = 0; d < n; d++) {
        if (c->n_nodes >= COVER_MAX_NODES)
            return false;
        if ((uint64_t)(c->n_nodes + 1) * 2 > c->mask + 1 && !cover_grow(c))
            return false;
        uint32_t key = ((node << 8) | (unsigned char)s[d]) + 1;
        uint32_t *k = cover_slot(c, key);
        uint32_t *v = &c->vals[k - c->keys];
        if (*k == 0) {
            *k = key;
            *v = ++c->n_nodes;
        }
        if (d + 1 == n)
            *v |= COVER_END;
        node = *v & ~COVER_END;
    }
    return true;
}

/* Length of the longest string of the trie that starts s[0..n). */
static size_t cover_longest(const cover *c, const char *s, size_t n)
{
    uint32_t node = 0;
    size_t best = 0;
    for (size_t d = 0; d < n; d++) {
        uint32_t key = ((node << 8) | (unsigned char)s[d]) + 1;
        const uint32_t *k = cover_slot(c, key);
        if (*k == 0)
            break;
        uint32_t v = c->vals[k - c->keys];
        if (v & COVER_END)
            best = d + 1;
        node = v & ~COVER_END;
    }
    return best;
}

static void cover_free(cover *c)
{
    free(c->keys);
    free(c->vals);
    memset(c, 0, sizeof *c);
}

/* Sized for about expect_nodes nodes (it grows as needed). */
static bool cover_init(cover *c, uint64_t expect_nodes)
{
    uint64_t size = 1024;
    while (size < expect_nodes * 2)
        size *= 2;
    c->keys = calloc(size, sizeof *c->keys);
    c->vals = calloc(size, sizeof *c->vals);
    c->mask = size - 1;
    c->n_nodes = 0;
    if (!c->keys || !c->vals) {
        cover_free(c);
        return false;
    }
    return true;
}

/* ============================================== byte-level (GPT-2) mapping */

/* GPT-2's bytes_to_unicode: printable bytes ('!'..'~', 0xA1..0xAC,
 * 0xAE..0xFF) stand for themselves; the other 68 bytes (0x00..0x20,
 * 0x7F..0xA0, 0xAD) map in order to U+0100, U+0101, ... so that every byte
 * has a visible character. */
static uint32_t byte_to_cpt(unsigned char c)
{
    if (c <= 0x20)
        return 256u + c;
    if (c >= 0x7F && c <= 0xA0)
        return 256u + 33 + (c - 0x7Fu);
    if (c == 0xAD)
        return 256u + 67;
    return c;
}

/* Inverse: code point -> byte, or -1 when cpt is not a byte-level char. */
static int cpt_to_byte(uint32_t cpt)
{
    if ((cpt >= 0x21 && cpt <= 0x7E) || (cpt >= 0xA1 && cpt <= 0xAC) || (cpt >= 0xAE && cpt <= 0xFF))
        return (int)cpt;
    if (cpt >= 256 && cpt < 256 + 33)
        return (int)(cpt - 256);
    if (cpt >= 256 + 33 && cpt < 256 + 67)
        return (int)(cpt - 256 - 33 + 0x7F);
    if (cpt == 256 + 67)
        return 0xAD;
    return -1;
}

/* ================================================== pre-tokenizer matchers */

/*
 * The BPE pre-tokenizers are lists of regexes applied one after the other:
 * each regex splits every piece from the previous step into its matches
 * and the unmatched runs between them. The regexes are public facts
 * (llama.cpp llama-vocab.cpp, from each model's tokenizer.json):
 *
 *   gpt2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   llama3:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   qwen2:   as llama3 with \p{N} instead of \p{N}{1,3}
 *   deepseek-coder: [\r\n] ; \s?\p{L}+ ; \s?\p{P}+ ; [一-龥ࠀ-一가-퟿]+ ; \p{N}
 *   deepseek-llm:   [\r\n] ; \s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+ ; \s?[!-/:-~！-／：-～‘-‟　-。]+ ;
 *                   \s+$ ; [一-龥ࠀ-一가-퟿]+ ; \p{N}+
 *   falcon:  [\p{P}\$\+<=>\^~\|`]+ ; gpt2 ; [0-9][0-9][0-9]
 *   starcoder (refact, command-r, ...): \p{N} ; gpt2
 *   default: [\p{P}\$\+<=>\^~\|]+ ; gpt2 ; \p{N}+ ; [0-9][0-9][0-9]
 *
 * Each regex is a hand-written matcher: given a position it returns the
 * length of the match that an ECMAScript (leftmost, first alternative)
 * engine finds starting exactly there, or 0. \s is the White_Space property
 * (llama.cpp maps non-ASCII white space to \v before running std::regex, so
 * \s never matches anything else, and never matches inside literal classes).
 */

typedef struct cptext {
    const uint32_t *c;
    const unsigned char *cat;   /* gpe_ucat of each code point */
    const unsigned char *ws;    /* gpe_uspace of each code point */
} cptext;

#define IS_L(x, i) ((x)->cat[i] == GPE_UCAT_L)
#define IS_N(x, i) ((x)->cat[i] == GPE_UCAT_N)
#define IS_WS(x, i) ((x)->ws[i])
/* [^\s\p{L}\p{N}] */
#define IS_OTHER(x, i) (!(x)->ws[i] && (x)->cat[i] != GPE_UCAT_L && (x)->cat[i] != GPE_UCAT_N)

/* Match length at pos (> 0), or 0 for no match here. A negative value -k
 * means that no match starts at pos .. pos+k-1 (lets a matcher skip a run it
 * has already examined). */
typedef long (*matcher)(const cptext *x, size_t pos, size_t end);

static size_t run_ws(const cptext *x, size_t pos, size_t end)
{
    size_t k = pos;
    while (k < end && IS_WS(x, k))
        k++;
    return k - pos;
}

static uint32_t lower_ascii(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d, case-folded (ASCII) when icase. */
static long m_contraction(const cptext *x, size_t pos, size_t end, bool icase)
{
    if (x->c[pos] != '\'' || pos + 1 >= end)
        return 0;
    uint32_t a = x->c[pos + 1], b = pos + 2 < end ? x->c[pos + 2] : 0;
    if (icase) {
        a = lower_ascii(a);
        b = lower_ascii(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S) then \s+ : a white-space run, leaving its last character for the
 * next piece when something non-white follows. */
static long m_ws_tail(const cptext *x, size_t pos, size_t end)
{
    size_t k = run_ws(x, pos, end);
    if (k == 0)
        return 0;
    if (pos + k < end && k > 1)
        return (long)(k - 1);
    return (long)k;
}

static long m_gpt2(const cptext *x, size_t pos, size_t end)
{
    long m = m_contraction(x, pos, end, false);
    if (m)
        return m;
    /* " ?X+" for X in \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional space (U+0020
     * only) then a run of one class. */
    size_t s = (x->c[pos] == ' ' && pos + 1 < end) ? pos + 1 : pos;
    for (int pass = 0; pass < 2; pass++) {
        size_t k = s;
        if (IS_L(x, k)) {
            while (k < end && IS_L(x, k))
                k++;
        } else if (IS_N(x, k)) {
            while (k < end && IS_N(x, k))
                k++;
        } else if (IS_OTHER(x, k)) {
            while (k < end && IS_OTHER(x, k))
                k++;
        }
        if (k > s)
            return (long)(k - pos);
        if (s == pos)
            break;
        s = pos;   /* the space did not lead a run: try without it */
    }
    return m_ws_tail(x, pos, end);
}

static long m_llama3_like(const cptext *x, size_t pos, size_t end, size_t max_digits)
{
    long m = m_contraction(x, pos, end, true);
    if (m)
        return m;
    uint32_t c = x->c[pos];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    size_t s = pos;
    if (!IS_L(x, pos) && c != '\r' && c != '\n' && !IS_N(x, pos) && pos + 1 < end &&
        IS_L(x, pos + 1))
        s = pos + 1;
    if (IS_L(x, s)) {
        size_t k = s;
        while (k < end && IS_L(x, k))
            k++;
        return (long)(k - pos);
    }
    /* \p{N}{1,max} */
    if (IS_N(x, pos)) {
        size_t k = pos;
        while (k < end && k - pos < max_digits && IS_N(x, k))
            k++;
        return (long)(k - pos);
    }
    /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
    s = (c == ' ' && pos + 1 < end && IS_OTHER(x, pos + 1)) ? pos + 1 : pos;
    if (IS_OTHER(x, s)) {
        size_t k = s;
        while (k < end && IS_OTHER(x, k))
            k++;
        while (k < end && (x->c[k] == '\r' || x->c[k] == '\n'))
            k++;
        return (long)(k - pos);
    }
    /* \s*[\r\n]+ : up to the last CR/LF of the white-space run */
    size_t k = run_ws(x, pos, end), last = 0;
    for (size_t i = pos; i < pos + k; i++)
        if (x->c[i] == '\r' || x->c[i] == '\n')
            last = i + 1;
    if (last)
        return (long)(last - pos);
    return m_ws_tail(x, pos, end);
}

static long m_llama3(const cptext *x, size_t pos, size_t end) { return m_llama3_like(x, pos, end, 3); }
static long m_qwen2(const cptext *x, size_t pos, size_t end) { return m_llama3_like(x, pos, end, 1); }

/* [\r\n] */
static long m_crlf(const cptext *x, size_t pos, size_t end)
{
    return x->c[pos] == '\r' || x->c[pos] == '\n';
}

/* \s?X+ where X is a predicate on position i. */
#define WS_OPT_RUN(NAME, PRED)                                              \
    static long NAME(const cptext *x, size_t pos, size_t end)               \
    {                                                                       \
        size_t s = pos;                                                     \
        if (IS_WS(x, pos) && pos + 1 < end && (PRED(x, pos + 1)))           \
            s = pos + 1;                                                    \
        size_t k = s;                                                       \
        while (k < end && (PRED(x, k)))                                     \
            k++;                                                            \
        return k > s ? (long)(k - pos) : 0;                                 \
    }

#define IS_P(x, i) ((x)->cat[i] == GPE_UCAT_P)
#define IN_CLASS(x, i, tab) (!(x)->ws[i] && gpe_urange_has(tab, tab##_n, (x)->c[i]))
#define IS_DS_LETTER(x, i) IN_CLASS(x, i, gpe_uclass_dsllm_letter)
#define IS_DS_PUNCT(x, i) IN_CLASS(x, i, gpe_uclass_dsllm_punct)
#define IS_CJK(x, i) IN_CLASS(x, i, gpe_uclass_cjk)

WS_OPT_RUN(m_ws_letters, IS_L)             /* \s?\p{L}+ */
WS_OPT_RUN(m_ws_punct, IS_P)               /* \s?\p{P}+ */
WS_OPT_RUN(m_ws_ds_letters, IS_DS_LETTER)  /* \s?[A-Za-zµÀ-Ö...]+ */
WS_OPT_RUN(m_ws_ds_punct, IS_DS_PUNCT)     /* \s?[!-/:-~...]+ */

/* [一-龥ࠀ-一가-퟿]+ */
static long m_cjk(const cptext *x, size_t pos, size_t end)
{
    size_t k = pos;
    while (k < end && IS_CJK(x, k))
        k++;
    return (long)(k - pos);
}

/* \s+$ (end of the piece being split) */
static long m_ws_end(const cptext *x, size_t pos, size_t end)
{
    size_t k = run_ws(x, pos, end);
    if (k == 0)
        return 0;
    if (pos + k == end)
        return (long)k;
    return -(long)k;   /* nothing inside this run reaches the end either */
}

static long m_digit(const cptext *x, size_t pos, size_t end) { return IS_N(x, pos); }

static long m_digits(const cptext *x, size_t pos, size_t end)
{
    size_t k = pos;
    while (k < end && IS_N(x, k))
        k++;
    return (long)(k - pos);
}

/* [0-9][0-9][0-9] */
static long m_3ascii_digits(const cptext *x, size_t pos, size_t end)
{
    if (pos + 3 > end)
        return 0;
    for (size_t i = pos; i < pos + 3; i++)
        if (x->c[i] < '0' || x->c[i] > '9')
            return 0;
    return 3;
}

/* [\p{P}\$\+<=>\^~\|`]+ (falcon, with the backtick) and without it (default) */
static bool falcon_punct(const cptext *x, size_t i, bool backtick)
{
    uint32_t c = x->c[i];
    return IS_P(x, i) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
           c == '~' || c == '|' || (backtick && c == '`');
}

static long m_punct_run_bt(const cptext *x, size_t pos, size_t end)
{
    size_t k = pos;
    while (k < end && falcon_punct(x, k, true))
        k++;
    return (long)(k - pos);
}

static long m_punct_run(const cptext *x, size_t pos, size_t end)
{
    size_t k = pos;
    while (k < end && falcon_punct(x, k, false))
        k++;
    return (long)(k - pos);
}

#define MAX_STAGES 6

static size_t pre_stages(enum pre_kind p, matcher st[MAX_STAGES])
{
    size_t n = 0;
    switch (p) {
    case PRE_GPT2:
        st[n++] = m_gpt2;
        break;
    case PRE_LLAMA3:
        st[n++] = m_llama3;
        break;
    case PRE_QWEN2:
        st[n++] = m_qwen2;
        break;
    case PRE_DEEPSEEK_LLM:
        st[n++] = m_crlf;
        st[n++] = m_ws_ds_letters;
        st[n++] = m_ws_ds_punct;
        st[n++] = m_ws_end;
        st[n++] = m_cjk;
        st[n++] = m_digits;
        break;
    case PRE_DEEPSEEK_CODER:
        st[n++] = m_crlf;
        st[n++] = m_ws_letters;
        st[n++] = m_ws_punct;
        st[n++] = m_cjk;
        st[n++] = m_digit;
        break;
    case PRE_FALCON:
        st[n++] = m_punct_run_bt;
        st[n++] = m_gpt2;
        st[n++] = m_3ascii_digits;
        break;
    case PRE_STARCODER:
        st[n++] = m_digit;
        st[n++] = m_gpt2;
        break;
    case PRE_DEFAULT:
        st[n++] = m_punct_run;
        st[n++] = m_gpt2;
        st[n++] = m_digits;
        st[n++] = m_3ascii_digits;
        break;
    }
    return n;
}

typedef struct svec { size_t *v; size_t n, cap; bool oom; } svec;

static void svec_push(svec *a, size_t x)
{
    if (a->oom)
        return;
    if (!grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) {
        a->oom = true;
        return;
    }
    a->v[a->n++] = x;
}

/* Split [0, n) by the stages; out receives piece lengths (code points).
 * Returns false on OOM. */
static bool pre_split(enum pre_kind p, const cptext *x, size_t n, svec *out)
{
    matcher st[MAX_STAGES];
    size_t ns = pre_stages(p, st);
    svec a = {0}, b = {0};
    if (n)
        svec_push(&a, n);
    for (size_t s = 0; s < ns; s++) {
        b.n = 0;
        size_t start = 0;
        for (size_t i = 0; i < a.n; i++) {
            size_t end = start + a.v[i], gap = start, pos = start;
            while (pos < end) {
                long m = st[s](x, pos, end);
                if (m > 0) {
                    if (pos > gap)
                        svec_push(&b, pos - gap);
                    svec_push(&b, (size_t)m);
                    pos += (size_t)m;
                    gap = pos;
                } else {
                    pos += m < 0 ? (size_t)-m : 1;
                }
            }
            if (end > gap)
                svec_push(&b, end - gap);
            start = end;
        }
        svec tmp = a;
        a = b;
        b = tmp;
        if (a.oom || b.oom)
            break;
    }
    bool ok = !a.oom && !b.oom;
    free(b.v);
    if (ok) {
        free(out->v);
        *out = a;
    } else {
        free(a.v);
    }
    return ok;
}

/* Decode bytes to code points (llama.cpp-compatible substitution of bad
 * UTF-8) with their category and white-space flags. */
typedef struct cpbuf {
    uint32_t *c;
    unsigned char *cat, *ws;
    size_t n;
} cpbuf;

static void cpbuf_free(cpbuf *b)
{
    free(b->c);
    free(b->cat);
    free(b->ws);
    memset(b, 0, sizeof *b);
}

static bool cpbuf_decode(cpbuf *b, const char *text, size_t len)
{
    size_t cap = len ? len : 1;
    b->c = malloc(cap * sizeof *b->c);
    b->cat = malloc(cap);
    b->ws = malloc(cap);
    b->n = 0;
    if (!b->c || !b->cat || !b->ws) {
        cpbuf_free(b);
        return false;
    }
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        size_t adv;
        uint32_t c = gpe_utf8_decode(s + i, len - i, &adv);
        i += adv;
        b->c[b->n] = c;
        b->cat[b->n] = (unsigned char)gpe_ucat(c);
        b->ws[b->n] = gpe_uspace(c);
        b->n++;
    }
    return true;
}

char *gpe_pretok_split(const char *pre, const char *text, size_t len, size_t *n)
{
    enum pre_kind p = PRE_GPT2;
    for (size_t i = 0; pre && i < sizeof k_pre_names / sizeof k_pre_names[0]; i++)
        if (strcmp(pre, k_pre_names[i].name) == 0)
            p = k_pre_names[i].kind;
    cpbuf cb;
    svec pieces = {0};
    bvec out = {0};
    *n = 0;
    if (!cpbuf_decode(&cb, text ? text : "", text ? len : 0))
        return NULL;
    cptext x = {cb.c, cb.cat, cb.ws};
    if (!pre_split(p, &x, cb.n, &pieces))
        goto fail;
    bvec_put(&out, "", 0);
    size_t at = 0;
    for (size_t i = 0; i < pieces.n; i++) {
        for (size_t k = at; k < at + pieces.v[i]; k++) {
            char u[4];
            bvec_put(&out, u, gpe_utf8_encode(cb.c[k], u));
        }
        bvec_put(&out, "", 1);
        at += pieces.v[i];
    }
    if (out.oom)
        goto fail;
    *n = pieces.n;
    free(pieces.v);
    cpbuf_free(&cb);
    return out.v;
fail:
    free(pieces.v);
    free(out.v);
    cpbuf_free(&cb);
    return NULL;
}

/* ===================================================== word tokenizers */

/* A symbol of the word being merged: bytes [off, off+n) of the word, in a
 * doubly linked list (n == 0 once merged into its left neighbour). */
typedef struct sym {
    uint32_t off, n;
    int32_t prev, next;
} sym;

typedef struct work {
    sym *s;
    size_t n, cap;
    heap h;
    bvec word;
    bool oom;
} work;

static void work_free(work *w)
{
    free(w->s);
    free(w->h.v);
    free(w->word.v);
}

/* Cut word into characters by lead byte (llama.cpp's rule: a lead byte
 * claims its length even when the bytes that follow are not continuations;
 * clipped at the end of the word). */
static bool split_chars(work *w, const char *word, size_t len)
{
    w->n = 0;
    if (!grow((void **)&w->s, &w->cap, len ? len : 1, sizeof *w->s))
        return false;
    for (size_t off = 0; off < len;) {
        size_t cl = gpe_utf8_len_lead((unsigned char)word[off]);
        if (cl > len - off)
            cl = len - off;
        sym *s = &w->s[w->n];
        s->off = (uint32_t)off;
        s->n = (uint32_t)cl;
        s->prev = (int32_t)w->n - 1;
        off += cl;
        s->next = off == len ? -1 : (int32_t)w->n + 1;
        w->n++;
    }
    return true;
}

static void merge_into_left(work *w, int32_t l, int32_t r)
{
    w->s[l].n += w->s[r].n;
    w->s[r].n = 0;
    w->s[l].next = w->s[r].next;
    if (w->s[r].next >= 0)
        w->s[w->s[r].next].prev = l;
}

/* ---- spm: merge the adjacent pair whose concatenation is the vocabulary
 * token of highest score, leftmost first, until none is left; then emit
 * each symbol's token, or its bytes as <0xXX> tokens. */

static void spm_try_pair(const gpe_tokenizer *t, work *w, const char *word, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    size_t n = (size_t)w->s[l].n + w->s[r].n;
    int32_t id = tok_find(t, word + w->s[l].off, n);
    if (id < 0)
        return;
    heap_push(&w->h, (bigram){bg_key(score_prio(t->scores[id]), l), r, (uint32_t)n});
}

static void spm_byte_fallback(const gpe_tokenizer *t, const char *s, size_t n, ivec *out)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[(unsigned char)s[i]];
        if (id < 0)
            id = tok_find(t, s + i, 1);
        if (id < 0)
            id = t->unk;
        if (id >= 0)
            ivec_push(out, id);
    }
}

static bool spm_word(const gpe_tokenizer *t, work *w, const char *word, size_t len, ivec *out)
{
    if (!split_chars(w, word, len))
        return false;
    w->h.n = 0;
    for (size_t i = 1; i < w->n; i++)
        spm_try_pair(t, w, word, (int32_t)i - 1, (int32_t)i);
    while (w->h.n && !w->h.oom) {
        bigram b = heap_pop(&w->h);
        int32_t left = bg_left(&b);
        sym *l = &w->s[left], *r = &w->s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue;   /* stale: one side changed since */
        merge_into_left(w, left, b.right);
        spm_try_pair(t, w, word, w->s[left].prev, left);
        spm_try_pair(t, w, word, left, w->s[left].next);
    }
    if (w->h.oom)
        return false;
    /* Merged symbols are always vocabulary tokens; only single characters
     * can be missing, and those fall back to bytes. */
    for (int32_t i = w->n ? 0 : -1; i >= 0; i = w->s[i].next) {
        const char *s = word + w->s[i].off;
        int32_t id = tok_find(t, s, w->s[i].n);
        if (id >= 0)
            ivec_push(out, id);
        else
            spm_byte_fallback(t, s, w->s[i].n, out);
    }
    return true;
}

/* ---- bpe: merge the adjacent pair of lowest merge rank, leftmost first. */

static void bpe_try_pair(const gpe_tokenizer *t, work *w, const char *word, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const sym *a = &w->s[l], *b = &w->s[r];
    int32_t rank = merge_rank(t, word + a->off, a->n, word + b->off, b->n);
    if (rank < 0)
        return;
    heap_push(&w->h, (bigram){bg_key((uint32_t)rank, l), r, a->n + b->n});
}

static bool bpe_word(const gpe_tokenizer *t, work *w, const char *word, size_t len, ivec *out)
{
    if (t->ignore_merges) {
        int32_t id = tok_find(t, word, len);
        if (id >= 0) {
            ivec_push(out, id);
            return true;
        }
    }
    if (!split_chars(w, word, len))
        return false;
    w->h.n = 0;
    for (size_t i = 1; i < w->n; i++)
        bpe_try_pair(t, w, word, (int32_t)i - 1, (int32_t)i);
    while (w->h.n && !w->h.oom) {
        bigram b = heap_pop(&w->h);
        int32_t left = bg_left(&b);
        sym *l = &w->s[left], *r = &w->s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue;
        merge_into_left(w, left, b.right);
        bpe_try_pair(t, w, word, w->s[left].prev, left);
        bpe_try_pair(t, w, word, left, w->s[left].next);
    }
    if (w->h.oom)
        return false;
    for (int32_t i = w->n ? 0 : -1; i >= 0; i = w->s[i].next) {
        const char *s = word + w->s[i].off;
        int32_t id = tok_find(t, s, w->s[i].n);
        if (id >= 0) {
            ivec_push(out, id);
            continue;
        }
        /* Not in the vocabulary: llama.cpp looks each byte up on its own
         * and drops those that are not tokens either. */
        for (uint32_t k = 0; k < w->s[i].n; k++) {
            id = tok_find(t, s + k, 1);
            if (id >= 0)
                ivec_push(out, id);
        }
    }
    return true;
}

typedef bool (*word_fn)(const gpe_tokenizer *t, work *w, const char *word, size_t len,
                        ivec *out);

/* Run fn over word, cut at the symbol boundaries that no merge can cross
 * (see the cover trie). Short words go in one piece. */
static bool chunked(const gpe_tokenizer *t, work *w, const char *word, size_t len, ivec *out,
                    word_fn fn)
{
    if (len < 64 || !t->cov.keys || t->no_chunking)
        return fn(t, w, word, len, out);
    if (fn == bpe_word && t->ignore_merges && tok_find(t, word, len) >= 0)
        return fn(t, w, word, len, out);
    size_t start = 0, reach = 0;
    for (size_t s = 0; s < len;) {
        /* A long stretch without a cut (a run of one character, say): stop
         * looking, the rest goes in one piece (always exact; this only
         * bounds the cost of the walks). */
        if (s - start > 4096)
            break;
        if (s > start && reach <= s) {
            if (!fn(t, w, word + start, s - start, out))
                return false;
            start = s;
        }
        size_t e = s + cover_longest(&t->cov, word + s, len - s);
        if (e > reach)
            reach = e;
        size_t cl = gpe_utf8_len_lead((unsigned char)word[s]);
        s += cl < len - s ? cl : len - s;
    }
    return fn(t, w, word + start, len - start, out);
}

/* Tokenize one raw-text fragment. */
static bool spm_fragment(const gpe_tokenizer *t, work *w, const char *text, size_t len,
                         bool prefix, ivec *out)
{
    /* spaces become U+2581 "▁"; optional leading space */
    bvec *b = &w->word;
    b->n = 0;
    if (prefix)
        bvec_put(b, "\xE2\x96\x81", 3);
    size_t from = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            bvec_put(b, text + from, i - from);
            bvec_put(b, "\xE2\x96\x81", 3);
            from = i + 1;
        }
    }
    bvec_put(b, text + from, len - from);
    if (b->oom || b->n > UINT32_MAX)
        return false;
    return chunked(t, w, b->v ? b->v : "", b->n, out, spm_word);
}

static bool bpe_fragment(const gpe_tokenizer *t, work *w, const char *text, size_t len, ivec *out)
{
    cpbuf cb;
    svec pieces = {0};
    bool ok = false;
    if (!cpbuf_decode(&cb, text, len))
        return false;
    cptext x = {cb.c, cb.cat, cb.ws};
    if (!pre_split(t->pre, &x, cb.n, &pieces))
        goto done;
    size_t at = 0;
    for (size_t i = 0; i < pieces.n; i++) {
        /* byte-level form of the piece */
        bvec *b = &w->word;
        b->n = 0;
        for (size_t k = at; k < at + pieces.v[i]; k++) {
            char u[4], e[4];
            size_t nu = gpe_utf8_encode(cb.c[k], u);
            for (size_t j = 0; j < nu; j++)
                bvec_put(b, e, gpe_utf8_encode(byte_to_cpt((unsigned char)u[j]), e));
        }
        at += pieces.v[i];
        if (b->oom || b->n > UINT32_MAX)
            goto done;
        if (!chunked(t, w, b->v ? b->v : "", b->n, out, bpe_word))
            goto done;
    }
    ok = true;
done:
    free(pieces.v);
    cpbuf_free(&cb);
    return ok;
}

/* ---- wpm (BERT WordPiece), as llama.cpp does it: map each code point to
 * the first one of its NFD decomposition (drops accents), lowercase, drop
 * control characters; split at white space, and make punctuation, ASCII
 * symbols and CJK ideographs single-character words. Each word, prefixed
 * with "▁", is cut greedily into the longest vocabulary texts from the left;
 * a word with a piece that matches nothing becomes [UNK] as a whole. */

/* CJK ideograph blocks as BERT's tokenizer defines them (public facts from
 * google-research/bert tokenization.py _is_chinese_char, with the
 * 0x2B920 start that llama.cpp and HF's Rust code use). */
static bool wpm_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool wpm_word(const gpe_tokenizer *t, const char *w, size_t n, ivec *out)
{
    if (n <= 3)
        return true;   /* just the "▁" prefix: empty word */
    size_t mark = out->n;
    for (size_t i = 0; i < n;) {
        size_t j = i + t->max_tok_len < n ? i + t->max_tok_len : n;
        int32_t id = -1;
        for (; j > i; j--)
            if ((id = tok_find(t, w + i, j - i)) >= 0)
                break;
        if (id < 0) {
            out->n = mark;   /* discard the whole word */
            break;
        }
        ivec_push(out, id);
        i = j;
    }
    if (out->n == mark && t->unk >= 0)
        ivec_push(out, t->unk);
    return !out->oom;
}

static bool wpm_fragment(const gpe_tokenizer *t, work *w, const char *text, size_t len, ivec *out)
{
    bvec *b = &w->word;
    b->n = 0;
    bvec_put(b, "\xE2\x96\x81", 3);
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t adv;
        uint32_t c = gpe_unfd_first(gpe_utf8_decode(s + i, len - i, &adv));
        i += adv;
        int cat = gpe_ucat(c);
        if (gpe_uspace(c)) {
            if (!wpm_word(t, b->v, b->n, out))
                return false;
            b->n = 3;
            continue;
        }
        if (c == 0 || c == GPE_UNICODE_REPLACEMENT || cat == GPE_UCAT_C)
            continue;
        char u[4];
        size_t nu = gpe_utf8_encode(gpe_ulower(c), u);
        if (cat == GPE_UCAT_P || (c < 0x7F && cat == GPE_UCAT_S) || wpm_cjk(c)) {
            if (!wpm_word(t, b->v, b->n, out))
                return false;
            b->n = 3;
            bvec_put(b, u, nu);
            if (!wpm_word(t, b->v, b->n, out))
                return false;
            b->n = 3;
        } else {
            bvec_put(b, u, nu);
        }
        if (b->oom)
            return false;
    }
    return wpm_word(t, b->v, b->n, out);
}

/* ===================================================== special partition */

/* Fragments of the input: raw text [off, off+len) or a token. */
typedef struct frag {
    size_t off, len;
    int32_t token;   /* -1 for raw text */
} frag;

typedef struct fvec { frag *v; size_t n, cap; bool oom; } fvec;

static void fvec_push(fvec *a, frag f)
{
    if (a->oom)
        return;
    if (!grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) {
        a->oom = true;
        return;
    }
    a->v[a->n++] = f;
}

/* Token whose text is exactly text[pos, pos+L) and which may be matched
 * (control/unknown only with parse_special), or -1. */
static int32_t trie_match(const gpe_tokenizer *t, const char *text, size_t len, size_t pos,
                          size_t L, bool parse_special)
{
    if (L > len - pos)
        return -1;
    int32_t node = t->trie_root[(unsigned char)text[pos]];
    for (size_t d = 1; node >= 0 && d < L; d++) {
        unsigned char c = (unsigned char)text[pos + d];
        int32_t ch = t->trie[node].child;
        while (ch >= 0 && t->trie[ch].byte != c)
            ch = t->trie[ch].sibling;
        node = ch;
    }
    if (node < 0)
        return -1;
    int32_t id = t->trie[node].token;
    if (id < 0)
        return -1;
    int type = t->attr[id] & ATTR_TYPE;
    if (!parse_special && (type == GPE_TOKTYPE_CONTROL || type == GPE_TOKTYPE_UNKNOWN))
        return -1;
    return id;
}

/*
 * llama.cpp takes the special tokens longest text first and, for each,
 * splits every remaining raw fragment at its non-overlapping occurrences,
 * leftmost first. Same result here with one pass per distinct length over
 * the text (a trie walk per position) and a "taken" map, so the cost does
 * not grow with the number of special tokens. Tokens of equal length are
 * taken in text order (llama.cpp leaves their order unspecified).
 */
static bool partition(const gpe_tokenizer *t, const char *text, size_t len, bool parse_special,
                      fvec *out)
{
    int32_t *at = NULL;   /* token starting at byte i, or -1; -2 inside a token */
    bool ok = false;
    if (t->n_trie && len) {
        at = malloc(len * sizeof *at);
        if (!at)
            return false;
        for (size_t i = 0; i < len; i++)
            at[i] = -1;
        bool any = false;
        for (size_t li = 0; li < t->n_spec_lens; li++) {
            size_t L = t->spec_lens[li];
            for (size_t pos = 0; pos + L <= len;) {
                if (at[pos] != -1) {
                    pos++;
                    continue;
                }
                int32_t id = trie_match(t, text, len, pos, L, parse_special);
                bool free_span = id >= 0;
                for (size_t k = pos + 1; free_span && k < pos + L; k++)
                    free_span = at[k] == -1;
                if (!free_span) {
                    pos++;
                    continue;
                }
                at[pos] = id;
                for (size_t k = pos + 1; k < pos + L; k++)
                    at[k] = -2;
                any = true;
                pos += L;
            }
        }
        if (!any) {
            free(at);
            at = NULL;
        }
    }
    if (!at) {
        if (len)
            fvec_push(out, (frag){0, len, -1});
        return !out->oom;
    }
    size_t raw = 0;
    bool rstrip_next = false;
    for (size_t i = 0; i <= len;) {
        if (i < len && at[i] < 0) {
            i++;
            continue;
        }
        /* raw text [raw, i) */
        size_t a = raw, b = i;
        if (rstrip_next)
            while (a < b && (text[a] == ' ' || (text[a] >= '\t' && text[a] <= '\r')))
                a++;
        if (i < len && (t->attr[at[i]] & ATTR_LSTRIP))
            while (b > a && (text[b - 1] == ' ' || (text[b - 1] >= '\t' && text[b - 1] <= '\r')))
                b--;
        if (b > a)
            fvec_push(out, (frag){a, b - a, -1});
        if (i == len)
            break;
        int32_t id = at[i];
        fvec_push(out, (frag){i, t->tok_len[id], id});
        rstrip_next = (t->attr[id] & ATTR_RSTRIP) != 0;
        i += t->tok_len[id];
        raw = i;
    }
    ok = !out->oom;
    free(at);
    return ok;
}

/* ================================================================ encode */

int gpe_tokenizer_encode(const gpe_tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, int32_t *out, int max)
{
    if (!t || (!text && len))
        return INT32_MIN;
    ivec ids = {0};
    fvec fr = {0};
    work w = {0};
    int ret = INT32_MIN;

    if (add_special && t->add_bos && t->bos >= 0)
        ivec_push(&ids, t->bos);
    if (!partition(t, text, len, parse_special, &fr))
        goto done;
    bool prev_special = true;   /* spm: space prefix at the start and after a token */
    for (size_t i = 0; i < fr.n; i++) {
        const frag *f = &fr.v[i];
        if (f->token >= 0) {
            ivec_push(&ids, f->token);
            prev_special = true;
            continue;
        }
        bool ok = t->kind == KIND_SPM   ? spm_fragment(t, &w, text + f->off, f->len,
                                                       t->add_space_prefix && prev_special, &ids)
                  : t->kind == KIND_BPE ? bpe_fragment(t, &w, text + f->off, f->len, &ids)
                                        : wpm_fragment(t, &w, text + f->off, f->len, &ids);
        if (!ok)
            goto done;
        prev_special = false;
    }
    if (add_special && t->add_eos && t->eos >= 0)
        ivec_push(&ids, t->eos);
    if (add_special && t->kind == KIND_WPM && t->sep >= 0)
        ivec_push(&ids, t->sep);   /* [CLS] text [SEP] */
    if (ids.oom || ids.n > INT_MAX)
        goto done;
    int n = (int)ids.n;
    int copy = n <= max ? n : (max > 0 ? max : 0);
    if (copy > 0 && out)
        memcpy(out, ids.v, (size_t)copy * sizeof *out);
    ret = n <= max ? n : -n;
done:
    free(ids.v);
    free(fr.v);
    work_free(&w);
    return ret;
}

/* ================================================================= piece */

static int copy_out(char *buf, size_t len, const char *s, size_t n)
{
    if (n > INT_MAX)
        return INT32_MIN;
    if (n > len)
        return -(int)n;
    if (n)
        memcpy(buf, s, n);
    return (int)n;
}

int gpe_tokenizer_piece(const gpe_tokenizer *t, int32_t id, char *buf, size_t len, bool special)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return 0;
    int type = t->attr[id] & ATTR_TYPE;
    const char *s = tok_text(t, id);
    size_t n = t->tok_len[id];
    if (type == GPE_TOKTYPE_CONTROL || type == GPE_TOKTYPE_UNKNOWN)
        return special ? copy_out(buf, len, s, n) : 0;
    if (type == GPE_TOKTYPE_USER_DEFINED)
        return copy_out(buf, len, s, n);
    if (t->kind != KIND_BPE && type == GPE_TOKTYPE_BYTE) {
        unsigned v;
        char c;
        if (n == 6 && sscanf(s, "<0x%2x>", &v) == 1) {
            c = (char)v;
            return copy_out(buf, len, &c, 1);
        }
        return copy_out(buf, len, s, n);
    }
    if (type != GPE_TOKTYPE_NORMAL)
        return 0;   /* unused/undefined: suppressed, as llama.cpp does */
    /* Decode into a scratch of at most n bytes (both decodings shrink or
     * keep the length), then copy. */
    char small[256];
    char *tmp = n <= sizeof small ? small : malloc(n);
    if (!tmp)
        return INT32_MIN;
    size_t k = 0;
    if (t->kind != KIND_BPE) {
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                tmp[k++] = ' ';
                i += 3;
            } else {
                tmp[k++] = s[i++];
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            size_t adv;
            uint32_t c = gpe_utf8_decode((const unsigned char *)s + i, n - i, &adv);
            int b = cpt_to_byte(c);
            if (b >= 0) {
                tmp[k++] = (char)b;
            } else {
                memcpy(tmp + k, s + i, adv);   /* not byte-level: keep as is */
                k += adv;
            }
            i += adv;
        }
    }
    int r = copy_out(buf, len, tmp, k);
    if (tmp != small)
        free(tmp);
    return r;
}

/* ============================================================= accessors */

bool gpe_tokenizer_is_eog(const gpe_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & ATTR_EOG);
}

int gpe_tokenizer_n_vocab(const gpe_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t gpe_tokenizer_bos(const gpe_tokenizer *t) { return t ? t->bos : -1; }
int32_t gpe_tokenizer_eos(const gpe_tokenizer *t) { return t ? t->eos : -1; }
bool gpe_tokenizer_add_bos(const gpe_tokenizer *t) { return t && t->add_bos && t->bos >= 0; }
bool gpe_tokenizer_add_eos(const gpe_tokenizer *t) { return t && t->add_eos && t->eos >= 0; }
const char *gpe_tokenizer_kind(const gpe_tokenizer *t)
{
    return !t ? NULL : t->kind == KIND_SPM ? "llama" : t->kind == KIND_BPE ? "gpt2" : "bert";
}
const char *gpe_tokenizer_pre(const gpe_tokenizer *t) { return t ? t->pre_name : NULL; }
void gpe_tokenizer_set_chunking(gpe_tokenizer *t, bool on)
{
    if (t)
        t->no_chunking = !on;
}

const char *gpe_tokenizer_warning(const gpe_tokenizer *t)
{
    return t && t->warning[0] ? t->warning : NULL;
}

const char *gpe_tokenizer_token_text(const gpe_tokenizer *t, int32_t id, size_t *len)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return NULL;
    if (len)
        *len = t->tok_len[id];
    return tok_text(t, id);
}

int gpe_tokenizer_token_type(const gpe_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return GPE_TOKTYPE_UNDEFINED;
    return t->attr[id] & ATTR_TYPE;
}

/* ================================================================== load */

void gpe_tokenizer_free(gpe_tokenizer *t)
{
    if (!t)
        return;
    free(t->pool);
    free(t->tok_off);
    free(t->tok_len);
    free(t->scores);
    free(t->attr);
    free(t->tok_slots);
    free(t->mpool);
    free(t->m_off);
    free(t->m_len);
    free(t->m_llen);
    free(t->m_slots);
    free(t->trie);
    free(t->spec_lens);
    cover_free(&t->cov);
    free(t);
}

static uint64_t table_size(uint64_t n)
{
    uint64_t s = 16;
    while (s < n * 2)
        s *= 2;
    return s;
}

/* Array key of type etype with exactly n elements (n == 0: any length,
 * returned in *n). Returns its index, -1 when absent, -2 with err set when
 * malformed. */
static int64_t get_array(const gpe_gguf *g, const char *key, gpe_gguf_vtype want, uint64_t *n,
                         char *err, size_t errlen)
{
    int64_t i = gpe_gguf_find_key(g, key);
    if (i < 0)
        return -1;
    gpe_gguf_vtype et;
    uint64_t cnt;
    if (!gpe_gguf_arr_info(g, i, &et, &cnt)) {
        seterr(err, errlen, "%s is not an array", key);
        return -2;
    }
    bool numeric = et != GPE_GGUF_STRING && et != GPE_GGUF_ARRAY;
    if ((want == GPE_GGUF_STRING) != (et == GPE_GGUF_STRING) || (want != GPE_GGUF_STRING && !numeric)) {
        seterr(err, errlen, "%s has elements of type %s", key, gpe_gguf_vtype_name(et));
        return -2;
    }
    if (*n && cnt != *n) {
        seterr(err, errlen, "%s has %llu entries, the vocabulary %llu", key,
               (unsigned long long)cnt, (unsigned long long)*n);
        return -2;
    }
    *n = cnt;
    return i;
}

static gpe_status load_vocab(gpe_tokenizer *t, const gpe_gguf *g, char *err, size_t errlen)
{
    uint64_t n = 0;
    int64_t ki = get_array(g, "tokenizer.ggml.tokens", GPE_GGUF_STRING, &n, err, errlen);
    if (ki == -1)
        seterr(err, errlen, "tokenizer.ggml.tokens is missing");
    if (ki < 0)
        return GPE_ERR_FORMAT;
    if (n == 0 || n > (uint64_t)INT32_MAX / 2) {
        seterr(err, errlen, "tokenizer.ggml.tokens has %llu entries", (unsigned long long)n);
        return GPE_ERR_FORMAT;
    }
    t->n_vocab = (int32_t)n;
    t->tok_off = malloc(n * sizeof *t->tok_off);
    t->tok_len = malloc(n * sizeof *t->tok_len);
    t->scores = calloc(n, sizeof *t->scores);
    t->attr = malloc(n);
    if (!t->tok_off || !t->tok_len || !t->scores || !t->attr)
        goto oom;
    bvec pool = {0};
    for (uint64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gpe_gguf_arr_str(g, ki, i, &len);
        if (!s || len > UINT32_MAX / 2) {
            free(pool.v);
            seterr(err, errlen, "tokenizer.ggml.tokens[%llu] is unreadable", (unsigned long long)i);
            return GPE_ERR_FORMAT;
        }
        t->tok_off[i] = pool.n;
        t->tok_len[i] = (uint32_t)len;
        bvec_put(&pool, s, len);
        bvec_put(&pool, "", 1);
    }
    if (pool.oom) {
        free(pool.v);
        goto oom;
    }
    t->pool = pool.v;

    uint64_t ns = n;
    int64_t si = get_array(g, "tokenizer.ggml.scores", GPE_GGUF_F32, &ns, err, errlen);
    if (si == -2)
        return GPE_ERR_FORMAT;
    for (uint64_t i = 0; si >= 0 && i < n; i++)
        if (!gpe_gguf_arr_f32(g, si, i, &t->scores[i]))
            t->scores[i] = 0;

    uint64_t nt = n;
    int64_t ti = get_array(g, "tokenizer.ggml.token_type", GPE_GGUF_I32, &nt, err, errlen);
    if (ti == -2)
        return GPE_ERR_FORMAT;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v = GPE_TOKTYPE_NORMAL;
        if (ti >= 0 && (!gpe_gguf_arr_i64(g, ti, i, &v) || v < 0 || v > GPE_TOKTYPE_BYTE))
            v = GPE_TOKTYPE_UNDEFINED;
        t->attr[i] = (unsigned char)v;
    }

    /* text -> id; a duplicated text maps to its last id, as in llama.cpp */
    uint64_t size = table_size(n);
    t->tok_slots = calloc(size, sizeof *t->tok_slots);
    if (!t->tok_slots)
        goto oom;
    t->tok_mask = size - 1;
    for (uint64_t i = 0; i < n; i++) {
        const char *s = tok_text(t, (int32_t)i);
        uint64_t h = fnv(FNV_INIT, s, t->tok_len[i]);
        for (uint64_t j = h & t->tok_mask;; j = (j + 1) & t->tok_mask) {
            uint32_t v = t->tok_slots[j];
            if (!v || (t->tok_len[v - 1] == t->tok_len[i] &&
                       memcmp(tok_text(t, (int32_t)(v - 1)), s, t->tok_len[i]) == 0)) {
                t->tok_slots[j] = (uint32_t)i + 1;
                break;
            }
        }
    }
    return GPE_OK;
oom:
    seterr(err, errlen, "out of memory loading the vocabulary");
    return GPE_ERR_NOMEM;
}

static gpe_status load_merges(gpe_tokenizer *t, const gpe_gguf *g, char *err, size_t errlen)
{
    uint64_t n = 0;
    int64_t mi = get_array(g, "tokenizer.ggml.merges", GPE_GGUF_STRING, &n, err, errlen);
    if (mi == -1)
        seterr(err, errlen, "tokenizer.ggml.merges is missing (required by gpt2 tokenizers)");
    if (mi < 0)
        return GPE_ERR_FORMAT;
    if (n > (uint64_t)INT32_MAX / 2) {
        seterr(err, errlen, "tokenizer.ggml.merges has %llu entries", (unsigned long long)n);
        return GPE_ERR_FORMAT;
    }
    t->n_merges = (int32_t)n;
    t->m_off = malloc((n ? n : 1) * sizeof *t->m_off);
    t->m_len = malloc((n ? n : 1) * sizeof *t->m_len);
    t->m_llen = malloc((n ? n : 1) * sizeof *t->m_llen);
    uint64_t size = table_size(n);
    t->m_slots = calloc(size, sizeof *t->m_slots);
    if (!t->m_off || !t->m_len || !t->m_llen || !t->m_slots)
        goto oom;
    t->m_mask = size - 1;
    bvec pool = {0};
    for (uint64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gpe_gguf_arr_str(g, mi, i, &len);
        /* "left right", split at the first space after the first byte; a
         * merge without one can never apply (llama.cpp keeps it as an
         * empty pair) */
        const char *sp = s && len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp || len > UINT32_MAX / 2) {
            t->m_len[i] = 0;
            t->m_llen[i] = UINT32_MAX;
            t->m_off[i] = 0;
            continue;
        }
        t->m_off[i] = pool.n;
        t->m_len[i] = (uint32_t)len;
        t->m_llen[i] = (uint32_t)(sp - s);
        bvec_put(&pool, s, len);
    }
    if (pool.oom) {
        free(pool.v);
        goto oom;
    }
    t->mpool = pool.v ? pool.v : calloc(1, 1);
    if (!t->mpool)
        goto oom;
    for (uint64_t i = 0; i < n; i++) {
        if (t->m_llen[i] == UINT32_MAX)
            continue;
        const char *s = t->mpool + t->m_off[i];
        uint64_t h = fnv(FNV_INIT, s, t->m_len[i]);
        for (uint64_t j = h & t->m_mask;; j = (j + 1) & t->m_mask) {
            uint32_t v = t->m_slots[j];
            if (!v) {
                t->m_slots[j] = (uint32_t)i + 1;
                break;
            }
            /* first occurrence keeps its rank */
            if (t->m_len[v - 1] == t->m_len[i] && t->m_llen[v - 1] == t->m_llen[i] &&
                memcmp(t->mpool + t->m_off[v - 1], s, t->m_len[i]) == 0)
                break;
        }
    }
    return GPE_OK;
oom:
    seterr(err, errlen, "out of memory loading the merges");
    return GPE_ERR_NOMEM;
}

static int32_t special_id(const gpe_gguf *g, const char *key, int32_t def, int32_t n_vocab)
{
    int64_t v;
    int64_t i = gpe_gguf_find_key(g, key);
    /* out-of-range ids (e.g. 0xFFFFFFFF for "none") keep the default, as
     * llama.cpp does */
    if (i >= 0 && gpe_gguf_kv_i64(g, i, &v) && v >= 0 && v < n_vocab)
        return (int32_t)v;
    return def >= 0 && def < n_vocab ? def : -1;
}

static bool contains_nocase(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && lower_ascii((unsigned char)hay[i]) == (unsigned char)needle[i])
            i++;
        if (i == n)
            return true;
    }
    return false;
}

static int cmp_desc_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static bool build_specials(gpe_tokenizer *t)
{
    size_t cap_nodes = 0, cap_lens = 0, n_lens = 0;
    for (int i = 0; i < 256; i++)
        t->trie_root[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int type = t->attr[id] & ATTR_TYPE;
        uint32_t L = t->tok_len[id];
        if ((type != GPE_TOKTYPE_CONTROL && type != GPE_TOKTYPE_USER_DEFINED &&
             type != GPE_TOKTYPE_UNKNOWN) || L == 0)
            continue;
        const unsigned char *s = (const unsigned char *)tok_text(t, id);
        int32_t node = t->trie_root[s[0]];
        if (node < 0) {
            if (!grow((void **)&t->trie, &cap_nodes, (size_t)t->n_trie + 1, sizeof *t->trie))
                return false;
            node = t->n_trie++;
            t->trie[node] = (trie_node){-1, -1, -1, s[0]};
            t->trie_root[s[0]] = node;
        }
        for (uint32_t d = 1; d < L; d++) {
            int32_t ch = t->trie[node].child;
            while (ch >= 0 && t->trie[ch].byte != s[d])
                ch = t->trie[ch].sibling;
            if (ch < 0) {
                if (!grow((void **)&t->trie, &cap_nodes, (size_t)t->n_trie + 1, sizeof *t->trie))
                    return false;
                ch = t->n_trie++;
                t->trie[ch] = (trie_node){-1, t->trie[node].child, -1, s[d]};
                t->trie[node].child = ch;
            }
            node = ch;
        }
        if (t->trie[node].token < 0)
            t->trie[node].token = id;
        bool seen = false;
        for (size_t k = 0; k < n_lens && !seen; k++)
            seen = t->spec_lens[k] == L;
        if (!seen) {
            if (!grow((void **)&t->spec_lens, &cap_lens, n_lens + 1, sizeof *t->spec_lens))
                return false;
            t->spec_lens[n_lens++] = L;
        }
    }
    if (n_lens)
        qsort(t->spec_lens, n_lens, sizeof *t->spec_lens, cmp_desc_u32);
    t->n_spec_lens = n_lens;
    return true;
}

/* Cover trie: spm merges produce vocabulary texts, bpe merges their
 * left+right. Left empty (no chunking) when memory is short. */
static void build_cover(gpe_tokenizer *t)
{
    if (t->kind == KIND_WPM)
        return;   /* no merges */
    uint64_t total = 0;
    int32_t n = t->kind == KIND_SPM ? t->n_vocab : t->n_merges;
    for (int32_t i = 0; i < n; i++)
        total += t->kind == KIND_SPM ? t->tok_len[i] : t->m_len[i];
    /* trie nodes are about a third of the bytes on real vocabularies */
    if (!cover_init(&t->cov, total / 3))
        return;
    bool ok = true;
    for (int32_t i = 0; ok && i < n; i++) {
        if (t->kind == KIND_SPM) {
            ok = cover_add(&t->cov, tok_text(t, i), t->tok_len[i]);
        } else if (t->m_llen[i] != UINT32_MAX) {
            /* left+right: the merge text without its space */
            char small[256];
            uint32_t ml = t->m_len[i] - 1;
            char *tmp = ml <= sizeof small ? small : malloc(ml);
            if (!tmp) {
                ok = false;
                break;
            }
            const char *m = t->mpool + t->m_off[i];
            memcpy(tmp, m, t->m_llen[i]);
            memcpy(tmp + t->m_llen[i], m + t->m_llen[i] + 1, ml - t->m_llen[i]);
            ok = cover_add(&t->cov, tmp, ml);
            if (tmp != small)
                free(tmp);
        }
    }
    if (!ok)
        cover_free(&t->cov);
}

/* The pre-tokenizer (byte-level BPE: tokenizer.ggml.pre; the others have
 * one). Returns whether BOS is added by default. */
static bool load_pre(gpe_tokenizer *t, const gpe_gguf *g)
{
    bool def_add_bos = t->kind != KIND_BPE;
    if (t->kind != KIND_BPE) {
        t->pre = PRE_DEFAULT;
        t->pre_name = "default";
    } else {
        const char *pre = gpe_gguf_get_str(g, "tokenizer.ggml.pre", NULL);
        t->pre = PRE_DEFAULT;
        t->pre_name = "default";
        if (!pre) {
            snprintf(t->warning, sizeof t->warning,
                     "tokenizer.ggml.pre is missing: using the default pre-tokenizer");
        } else {
            size_t i, np = sizeof k_pre_names / sizeof k_pre_names[0];
            for (i = 0; i < np && strcmp(pre, k_pre_names[i].name) != 0; i++)
                ;
            if (i < np) {
                t->pre = k_pre_names[i].kind;
                t->pre_name = k_pre_names[i].name;
            } else {
                t->pre = PRE_GPT2;
                t->pre_name = "gpt-2";
                snprintf(t->warning, sizeof t->warning,
                         "unknown pre-tokenizer '%.64s': using the gpt-2 split", pre);
            }
        }
        /* llama.cpp's LLAMA3 pre type (not the other names sharing its
         * regex) adds BOS and takes whole pieces that are tokens unmerged */
        static const char *const llama3_names[] = {"llama3", "llama-v3", "llama-bpe", "falcon3",
                                                   "pixtral"};
        for (size_t i = 0; pre && i < sizeof llama3_names / sizeof llama3_names[0]; i++) {
            if (strcmp(pre, llama3_names[i]) == 0) {
                def_add_bos = true;
                t->ignore_merges = true;
            }
        }
    }
    return def_add_bos;
}

/* The special tokens' ids, the add_* flags and the byte tokens. */
static void load_specials(gpe_tokenizer *t, const gpe_gguf *g, bool def_add_bos)
{
    int32_t nv = t->n_vocab;
    if (t->kind == KIND_WPM) {
        /* bert: [CLS] (cls_token_id, 101) leads, [SEP] (102) ends, [UNK] 100 */
        t->bos = special_id(g, "tokenizer.ggml.bos_token_id",
                            special_id(g, "tokenizer.ggml.cls_token_id", 101, nv), nv);
        t->eos = special_id(g, "tokenizer.ggml.eos_token_id", -1, nv);
        t->unk = special_id(g, "tokenizer.ggml.unknown_token_id", 100, nv);
        t->sep = special_id(g, "tokenizer.ggml.seperator_token_id", 102, nv);
        for (int32_t i = 0; i < nv; i++)
            if (t->tok_len[i] > t->max_tok_len)
                t->max_tok_len = t->tok_len[i];
    } else {
        t->bos = special_id(g, "tokenizer.ggml.bos_token_id", t->kind == KIND_SPM ? 1 : 11, nv);
        t->eos = special_id(g, "tokenizer.ggml.eos_token_id", t->kind == KIND_SPM ? 2 : 11, nv);
        t->unk = special_id(g, "tokenizer.ggml.unknown_token_id", t->kind == KIND_SPM ? 0 : -1,
                            nv);
        t->sep = -1;
    }
    t->eot = special_id(g, "tokenizer.ggml.eot_token_id", -1, nv);
    t->eom = special_id(g, "tokenizer.ggml.eom_token_id", -1, nv);
    t->add_bos = def_add_bos;
    t->add_eos = false;
    t->add_space_prefix = t->kind == KIND_SPM;
    bool b;
    if (gpe_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b))
        t->add_bos = b;
    if (gpe_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b))
        t->add_eos = b;
    if (gpe_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b))
        t->add_space_prefix = b;

    for (int c = 0; c < 256; c++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", c);
        t->byte_tok[c] = tok_find(t, name, 6);
    }
}

/* End of generation: eos/eot/eom and the usual end-of-turn texts. */
static void mark_eog(gpe_tokenizer *t)
{
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
        "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
        "<end_of_utterance>",
    };
    int32_t eogs[3] = {t->eos, t->eot, t->eom};
    for (int i = 0; i < 3; i++)
        if (eogs[i] >= 0)
            t->attr[eogs[i]] |= ATTR_EOG;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = tok_find(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0)
            t->attr[id] |= ATTR_EOG;
    }
}

/* Phi-3 strips white space after its special tokens (llama.cpp sets
 * RSTRIP by model name; <unk>, <s> and <|endoftext|> excepted). */
static void phi3_rstrip(gpe_tokenizer *t, const gpe_gguf *g)
{
    int32_t nv = t->n_vocab;
    const char *name = gpe_gguf_get_str(g, "general.name", NULL);
    if (name && (contains_nocase(name, "phi-3") || contains_nocase(name, "phi3"))) {
        for (int32_t id = 0; id < nv; id++) {
            int type = t->attr[id] & ATTR_TYPE;
            if (type == GPE_TOKTYPE_CONTROL || type == GPE_TOKTYPE_USER_DEFINED ||
                type == GPE_TOKTYPE_UNKNOWN)
                t->attr[id] |= ATTR_RSTRIP;
        }
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (int i = 0; i < 3; i++) {
            int32_t id = tok_find(t, keep[i], strlen(keep[i]));
            if (id >= 0)
                t->attr[id] &= (unsigned char)~ATTR_RSTRIP;
        }
        int32_t id = tok_find(t, "</s>", 4);
        if (id >= 0)
            t->attr[id] |= ATTR_RSTRIP;
    }
}

gpe_tokenizer *gpe_tokenizer_load(const gpe_gguf *g, char *err, size_t errlen)
{
    return gpe_tokenizer_load_status(g, err, errlen, NULL);
}

gpe_tokenizer *gpe_tokenizer_load_status(const gpe_gguf *g, char *err, size_t errlen,
                                         gpe_status *st)
{
    gpe_status dummy;
    if (!st)
        st = &dummy;
    *st = GPE_ERR_FORMAT;
    if (!g) {
        seterr(err, errlen, "no GGUF");
        *st = GPE_ERR_ARG;
        return NULL;
    }
    const char *model = gpe_gguf_get_str(g, "tokenizer.ggml.model", NULL);
    if (!model) {
        seterr(err, errlen, "tokenizer.ggml.model is missing");
        return NULL;
    }
    gpe_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        seterr(err, errlen, "out of memory");
        *st = GPE_ERR_NOMEM;
        return NULL;
    }
    if (strcmp(model, "llama") == 0) {
        t->kind = KIND_SPM;
    } else if (strcmp(model, "gpt2") == 0) {
        t->kind = KIND_BPE;
    } else if (strcmp(model, "bert") == 0) {
        t->kind = KIND_WPM;
    } else {
        seterr(err, errlen,
               "unsupported tokenizer.ggml.model '%.64s' (supported: llama (SentencePiece), "
               "gpt2 (byte-level BPE), bert (WordPiece))",
               model);
        goto fail;
    }
    if ((*st = load_vocab(t, g, err, errlen)) != GPE_OK)
        goto fail;
    if (t->kind == KIND_BPE && (*st = load_merges(t, g, err, errlen)) != GPE_OK)
        goto fail;

    /* defaults (llama.cpp): spm bos 1, eos 2, unk 0, adds BOS and a space
     * prefix; bpe bos = eos = 11, adds nothing (except llama-3 below) */
    bool def_add_bos = load_pre(t, g);
    load_specials(t, g, def_add_bos);

    mark_eog(t);
    phi3_rstrip(t, g);

    build_cover(t);
    if (!build_specials(t)) {
        seterr(err, errlen, "out of memory building the special-token index");
        *st = GPE_ERR_NOMEM;
        goto fail;
    }
    *st = GPE_OK;
    return t;
fail:
    gpe_tokenizer_free(t);
    return NULL;
}
