/*
 * oai_chunk: see oai_chunk.h. A strict, allocation-free reader for one
 * shape of JSON; every doubt is a "no" that sends the chunk to jansson.
 */
#include "agent/oai_chunk.h"

#include <string.h>

typedef struct {
    const char *p, *end;
} cur;

/* A string's bytes as read, and whether it had escapes to decode. */
typedef struct {
    const char *raw;
    size_t n;
    bool escaped;
} str;

static inline void ws(cur *c)
{
    if (c->p < c->end && (unsigned char)*c->p > ' ')
        return; /* compact JSON: nearly always */
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* Bytes a string's fast loop stops at: '"', '\\', control characters and
 * the lead of a multi-byte UTF-8 sequence (1); the rest is plain (0). */
static const unsigned char stop_byte[256] = {
    [0x00 ... 0x1F] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xFF] = 1,
};

static inline bool eat(cur *c, char ch)
{
    ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

static inline bool peek(cur *c, char ch)
{
    ws(c);
    return c->p < c->end && *c->p == ch;
}

/* A string: the escapes jansson takes, except \u (left to jansson: it
 * needs surrogate pairing and refuses \u0000). */
static bool read_str(cur *c, str *out)
{
    if (!eat(c, '"'))
        return false;
    out->raw = c->p;
    out->escaped = false;
    while (c->p < c->end) {
        while (c->p < c->end && !stop_byte[(unsigned char)*c->p])
            c->p++;
        if (c->p == c->end)
            break;
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            out->n = (size_t)(c->p - out->raw);
            c->p++;
            return true;
        }
        if (ch < 0x20)
            return false;
        if (ch == '\\') {
            if (c->p + 1 >= c->end || !strchr("\"\\/bfnrt", c->p[1]) || c->p[1] == '\0')
                return false;
            out->escaped = true;
            c->p += 2;
        } else if (ch >= 0x80) {
            size_t k = gp_utf8_seq_len((const unsigned char *)c->p, (const unsigned char *)c->end);
            if (k == 0)
                return false;
            c->p += k;
        } else {
            c->p++;
        }
    }
    return false;
}

/* The string's text, decoded into scratch when it had escapes. */
static bool str_text(const str *s, gp_buf *scratch, const char **text, size_t *len)
{
    if (!s->escaped) {
        *text = s->raw;
        *len = s->n;
        return true;
    }
    scratch->len = 0;
    for (size_t i = 0; i < s->n; i++) {
        char ch = s->raw[i];
        if (ch == '\\') {
            char e = s->raw[++i];
            ch = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r'
                 : e == 't' ? '\t' : e; /* '"', '\\', '/' stand for themselves */
        }
        if (gp_buf_append(scratch, &ch, 1) < 0)
            return false;
    }
    *text = scratch->data ? scratch->data : "";
    *len = scratch->len;
    return true;
}

static bool read_null(cur *c)
{
    ws(c);
    if (c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0) {
        c->p += 4;
        return true;
    }
    return false;
}

/* A string or null: *s->raw is NULL for null. */
static bool read_str_or_null(cur *c, str *s)
{
    s->raw = NULL;
    s->n = 0;
    return peek(c, '"') ? read_str(c, s) : read_null(c);
}

/* An integer of 1-18 digits (no fraction or exponent, which jansson reads
 * as a real, and never one that could overflow its json_int_t). */
static bool read_int(cur *c, long long *v)
{
    ws(c);
    bool neg = c->p < c->end && *c->p == '-';
    if (neg)
        c->p++;
    const char *d = c->p;
    unsigned long long x = 0; /* wraps past 18 digits, which are refused */
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        x = x * 10 + (unsigned)(*c->p++ - '0');
    size_t n = (size_t)(c->p - d);
    if (n == 0 || n > 18 || (n > 1 && *d == '0'))
        return false;
    *v = neg ? -(long long)x : (long long)x;
    return c->p == c->end || !strchr(".eE", *c->p) || *c->p == '\0';
}

/* A known key and its length (a table of them ends with a NULL name). */
typedef struct {
    const char *name;
    size_t len;
} key_name;
#define KEY(s) {s, sizeof s - 1}

/* The key of the next member and its colon: idx is its position in keys.
 * A key not there (or written with an escape: a key we know has none)
 * is false, the whole chunk then jansson's. Compared in place rather than
 * read as a string first: a chunk has ten keys, and reading each was a
 * third of the scan (issue 24). */
static bool read_key(cur *c, const key_name *keys, int *idx)
{
    ws(c);
    if (c->p >= c->end || *c->p != '"')
        return false;
    const char *k = c->p + 1;
    size_t room = (size_t)(c->end - k);
    for (int i = 0; keys[i].name; i++) {
        size_t n = keys[i].len;
        if (n < room && k[0] == keys[i].name[0] && k[n] == '"' &&
            memcmp(k, keys[i].name, n) == 0) {
            c->p = k + n + 1;
            *idx = i;
            return eat(c, ':');
        }
    }
    return false;
}

/* Members of an object after its '{', each key at most once; member()
 * reads the value of key i. */
typedef bool (*member_fn)(cur *c, int i, void *ud);

static bool read_members(cur *c, const key_name *keys, member_fn member, void *ud)
{
    unsigned seen = 0;
    if (eat(c, '}'))
        return true;
    do {
        int i;
        if (!read_key(c, keys, &i) || i < 0 || (seen & (1u << i)))
            return false;
        seen |= 1u << i;
        if (!member(c, i, ud))
            return false;
    } while (eat(c, ','));
    return eat(c, '}');
}

typedef struct {
    bool chat;
    str text;   /* completions: choices[0].text; chat: choices[0].delta.content */
    str finish; /* choices[0].finish_reason */
    oai_chunk *out;
} scan;

static const key_name delta_keys[] = {KEY("role"), KEY("content"), {NULL, 0}};

static bool delta_member(cur *c, int i, void *ud)
{
    scan *s = ud;
    str ignored;
    return i == 0 ? read_str_or_null(c, &ignored) : read_str_or_null(c, &s->text);
}

static const key_name choice_keys[] = {KEY("index"), KEY("logprobs"), KEY("finish_reason"),
                                       KEY("text"), KEY("delta"), {NULL, 0}};

static bool choice_member(cur *c, int i, void *ud)
{
    scan *s = ud;
    long long ignored;
    switch (i) {
    case 0:
        return read_int(c, &ignored);
    case 1:
        return read_null(c);
    case 2: /* a finish_reason with escapes is left to jansson */
        return read_str_or_null(c, &s->finish) && !s->finish.escaped;
    case 3:
        return !s->chat && read_str_or_null(c, &s->text);
    default:
        return s->chat && eat(c, '{') && read_members(c, delta_keys, delta_member, s);
    }
}

static const key_name usage_keys[] = {KEY("prompt_tokens"), KEY("completion_tokens"),
                                      KEY("total_tokens"), {NULL, 0}};

static bool usage_member(cur *c, int i, void *ud)
{
    oai_chunk *out = ud;
    long long v;
    if (!read_int(c, &v) || v < 0) /* a negative count is jansson's to pass on */
        return false;
    if (i == 0)
        out->prompt_tokens = v;
    else if (i == 1)
        out->completion_tokens = v;
    return true;
}

static const key_name top_keys[] = {KEY("id"), KEY("object"), KEY("model"),
                                    KEY("system_fingerprint"), KEY("created"), KEY("usage"),
                                    KEY("choices"), {NULL, 0}};

static bool top_member(cur *c, int i, void *ud)
{
    scan *s = ud;
    str ignored;
    long long n;
    switch (i) {
    case 0:
    case 1:
    case 2:
    case 3:
        return read_str_or_null(c, &ignored);
    case 4:
        return read_int(c, &n);
    case 5: /* null, or the counts (what take_usage reads) */
        return read_null(c) || (eat(c, '{') && read_members(c, usage_keys, usage_member, s->out));
    default: /* choices: none, or exactly one (the backend reads the first) */
        if (!eat(c, '['))
            return false;
        if (eat(c, ']'))
            return true;
        return eat(c, '{') && read_members(c, choice_keys, choice_member, ud) && eat(c, ']');
    }
}

/* The whole scan; s holds where the text and finish_reason were. */
static bool scan_chunk(const char *p, size_t n, scan *s)
{
    cur c = {p, p + n};
    memset(s->out, 0, sizeof *s->out);
    s->out->prompt_tokens = s->out->completion_tokens = -1;
    if (!eat(&c, '{') || !read_members(&c, top_keys, top_member, s))
        return false;
    ws(&c);
    return c.p == c.end; /* trailing bytes: jansson's error */
}

bool oai_chunk_scan(const char *p, size_t n, bool chat, gp_buf *scratch, oai_chunk *out)
{
    scan s = {.chat = chat, .out = out};
    if (!scan_chunk(p, n, &s))
        return false;
    out->finish = s.finish.raw;
    out->finish_len = s.finish.n;
    if (!s.text.raw)
        return true;
    return str_text(&s.text, scratch, &out->text, &out->len);
}

/* ======================================================================== */
/* The memo: a chunk that differs from the last one only in its text        */
/* ======================================================================== */

void oai_chunk_memo_init(oai_chunk_memo *m)
{
    memset(m, 0, sizeof *m);
    gp_buf_init(&m->bytes);
}

void oai_chunk_memo_free(oai_chunk_memo *m)
{
    gp_buf_free(&m->bytes);
    m->valid = false;
}

/* The fast path: p[0..n) is the memo's chunk with another string between
 * its text's quotes. The bytes before the text and after it are the same,
 * so they read the same; the new string is read in full (it must end at
 * the same closing quote, so the rest is where it was). */
static bool memo_hit(const oai_chunk_memo *m, const char *p, size_t n, bool chat, str *text)
{
    size_t tail = m->bytes.len - m->text_end; /* from the closing quote on */
    if (!m->valid || m->chat != chat || n < m->text_at + tail ||
        memcmp(p, m->bytes.data, m->text_at) != 0 ||
        memcmp(p + n - tail, m->bytes.data + m->text_end, tail) != 0)
        return false;
    cur c = {p + m->text_at - 1, p + n};
    return read_str(&c, text) && c.p == p + n - tail + 1;
}

/* Remember a chunk read in full whose text was a string. */
static void memo_keep(oai_chunk_memo *m, const char *p, size_t n, bool chat, const scan *s)
{
    m->valid = false;
    if (!s->text.raw)
        return;
    m->bytes.len = 0;
    if (gp_buf_append(&m->bytes, p, n) < 0)
        return;
    m->chat = chat;
    m->text_at = (size_t)(s->text.raw - p);
    m->text_end = m->text_at + s->text.n;
    m->usage_prompt = s->out->prompt_tokens;
    m->usage_completion = s->out->completion_tokens;
    m->has_finish = s->finish.raw != NULL;
    m->finish_len = s->finish.n;
    /* Where finish_reason is, counted from whichever end does not move. */
    m->finish_before = s->finish.raw && s->finish.raw < s->text.raw;
    m->finish_off = !s->finish.raw ? 0
                    : m->finish_before ? (size_t)(s->finish.raw - p)
                                       : (size_t)(p + n - s->finish.raw);
    m->valid = true;
}

bool oai_chunk_read(oai_chunk_memo *m, const char *p, size_t n, bool chat, gp_buf *scratch,
                    oai_chunk *out)
{
    scan s = {.chat = chat, .out = out};
    if (memo_hit(m, p, n, chat, &s.text)) {
        out->prompt_tokens = m->usage_prompt;
        out->completion_tokens = m->usage_completion;
        out->finish_len = m->finish_len;
        out->finish = !m->has_finish ? NULL
                      : m->finish_before ? p + m->finish_off
                                         : p + n - m->finish_off;
        return str_text(&s.text, scratch, &out->text, &out->len);
    }
    if (!scan_chunk(p, n, &s))
        return false;
    memo_keep(m, p, n, chat, &s);
    out->finish = s.finish.raw;
    out->finish_len = s.finish.n;
    if (!s.text.raw)
        return true;
    return str_text(&s.text, scratch, &out->text, &out->len);
}
