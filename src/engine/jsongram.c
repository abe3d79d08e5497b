/*
 * jsongram: byte matcher of a compiled schema. Interface in jsongram.h.
 *
 * Each frame is in one mode. A handler takes one byte and answers: not
 * allowed, consumed, consumed-and-complete (pop), or "this byte ends me,
 * give it to my parent" (numbers and literals have no closing byte). A
 * parent sets its own next state before it pushes a child, so a pop needs
 * no notification and every frame below the top is already in the state
 * it will be in once the child completes (which is what makes
 * gpe_jg_remaining a plain sum over frames).
 *
 * Numbers: an integer part of at most 15 digits, bounded by the node's
 * [lo, hi]; a prefix is allowed while some completion lies in range. A
 * fraction (number nodes only) is allowed only when every fraction keeps
 * the value in range: v >= lo and v + 1 <= hi for v >= 0, and
 * v - 1 >= lo, v <= hi for a negative integer part. No exponent.
 */
#include "jsongram.h"

#include <string.h>

enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
enum { O_OPEN, O_KEY, O_COLON, O_NEXT, O_COMMA };   /* object states */
enum { A_OPEN, A_NEXT };                            /* array states */
enum { S_BODY, S_ESC };                             /* string states */
enum { N_INT, N_DOT, N_FRAC };                      /* number states */
enum { R_FAIL, R_OK, R_POP, R_RETRY, R_POP_RETRY }; /* handler results */

#define MAX_DIGITS 15

/* May a fraction follow integer part (neg, v)? Only where every fraction
 * keeps the value in range; *nonzero: the fraction must not be all zeros
 * (the integer part is an exclusive bound). */
static bool frac_ok(const gpe_js_node *nd, bool neg, int64_t v, bool *nonzero)
{
    if (!nd->allow_frac)
        return false;
    int64_t x = neg ? -v : v;
    bool ok = neg ? (x - 1 >= nd->lo && x <= nd->hi) : (x >= nd->lo && x + 1 <= nd->hi);
    *nonzero = neg ? (nd->hi_x && x == nd->hi) : (nd->lo_x && x == nd->lo);
    return ok;
}

static int64_t num_need(const gpe_js_node *nd, bool neg, int n, int64_t v)
{
    return gpe_js_num_need(nd, neg, n, v);
}

static bool push(gpe_jg_state *s, int node)
{
    if (s->depth >= GPE_JG_MAX_DEPTH)
        return false;
    gpe_jg_frame *f = &s->f[s->depth++];
    memset(f, 0, sizeof *f);
    f->node = node;
    f->mode = F_VALUE;
    return true;
}

void gpe_jg_init(gpe_jg_state *s, const gpe_jschema *p)
{
    s->depth = 0;
    push(s, p->root);
}

/* Candidate keys of an object from property i: up to and including the
 * first required one (optional ones may be skipped, required ones not). */
static uint64_t key_cands(const gpe_js_node *o, int i)
{
    uint64_t m = 0;
    for (int k = i; k < o->n_props; k++) {
        m |= 1ULL << k;
        if (o->props[k].required)
            break;
    }
    return m;
}

static bool has_required(const gpe_js_node *o, int i)
{
    return o->tail[i] > 0;
}

/* First byte of a value: choose the union alternative, then the mode. */
static int value_byte(const gpe_jschema *p, gpe_jg_frame *f, unsigned char c)
{
    const gpe_js_node *nd = gpe_jschema_node(p, f->node);
    while (nd->kind == GPE_JS_UNION) {
        int pick = -1;
        for (int i = 0; i < nd->n_alts && pick < 0; i++)
            if (gpe_js_first_has(gpe_jschema_node(p, nd->alts[i]), c))
                pick = nd->alts[i];
        if (pick < 0)
            return R_FAIL;
        nd = gpe_jschema_node(p, pick);
    }
    if (nd->kind == GPE_JS_ANY) {
        int b = c == '{' ? GPE_JS_N_ANYOBJ : c == '[' ? GPE_JS_N_ANYARR
              : c == '"' ? GPE_JS_N_ANYSTR : (c == '-' || (c >= '0' && c <= '9'))
              ? GPE_JS_N_ANYNUM : GPE_JS_N_ANYLIT;
        nd = &p->nodes[b];
    }
    if (!gpe_js_first_has(nd, c))
        return R_FAIL;
    int id = (int)(nd - p->nodes);
    memset(f, 0, sizeof *f);
    f->node = id;
    switch (nd->kind) {
    case GPE_JS_OBJECT:
        f->mode = F_OBJ;
        f->st = O_OPEN;
        return R_OK;
    case GPE_JS_ARRAY:
        f->mode = F_ARR;
        f->st = A_OPEN;
        return R_OK;
    case GPE_JS_STRING:
        f->mode = F_STR;
        f->st = S_BODY;
        f->mask = nd->re ? GPE_JRE_START : 0;   /* the pattern's state */
        return R_OK;
    case GPE_JS_NUMBER:
        f->mode = F_NUM;
        f->st = N_INT;
        if (c == '-')
            f->neg = 1;
        else
            f->n = 1, f->v = c - '0';
        return num_need(nd, f->neg, f->n, f->v) < GPE_JS_INF ? R_OK : R_FAIL;
    case GPE_JS_LITERALS: {
        f->mode = F_LIT;
        int lo = 0;
        while (lo < nd->n_lits && (unsigned char)nd->lits[lo][0] != c)
            lo++;
        int hi = lo;
        while (hi < nd->n_lits && (unsigned char)nd->lits[hi][0] == c)
            hi++;
        f->k = lo;
        f->h = hi;
        f->n = 1;
        return lo < hi ? R_OK : R_FAIL;
    }
    default:
        return R_FAIL;
    }
}

/* Start of a key ('"' consumed) in object frame f. */
static int key_start(gpe_jg_state *s, const gpe_jschema *p, gpe_jg_frame *f)
{
    const gpe_js_node *o = &p->nodes[f->node];
    if (o->extra >= 0) {
        f->st = O_COLON;
        if (!push(s, GPE_JS_N_ANYSTR))
            return R_FAIL;
        gpe_jg_frame *k = &s->f[s->depth - 1];
        k->mode = F_STR;
        k->st = S_BODY;
        return R_OK;
    }
    f->mask = key_cands(o, f->n);
    if (!f->mask)
        return R_FAIL;
    f->st = O_KEY;
    f->k = 1;
    return R_OK;
}

static int obj_byte(gpe_jg_state *s, const gpe_jschema *p, gpe_jg_frame *f, unsigned char c)
{
    const gpe_js_node *o = &p->nodes[f->node];
    switch (f->st) {
    case O_OPEN:
        if (c == '}')
            return o->extra >= 0 || !has_required(o, f->n) ? R_POP : R_FAIL;
        return c == '"' ? key_start(s, p, f) : R_FAIL;
    case O_COMMA:
        return c == '"' ? key_start(s, p, f) : R_FAIL;
    case O_NEXT:
        if (c == '}')
            return o->extra >= 0 || !has_required(o, f->n) ? R_POP : R_FAIL;
        if (c == ',' && (o->extra >= 0 || f->n < o->n_props)) {
            f->st = O_COMMA;
            return R_OK;
        }
        return R_FAIL;
    case O_COLON:
        if (c != ':')
            return R_FAIL;
        f->st = O_NEXT;
        return push(s, o->extra) ? R_OK : R_FAIL;
    case O_KEY: {
        uint64_t m = 0;
        int done = -1;
        for (int i = f->n; i < o->n_props; i++) {
            if (!(f->mask >> i & 1))
                continue;
            const gpe_js_prop *pr = &o->props[i];
            if (f->k < pr->key_len && (unsigned char)pr->key[f->k] == c) {
                m |= 1ULL << i;
                if (f->k + 1 == pr->key_len)
                    done = i;
            }
        }
        if (!m)
            return R_FAIL;
        f->mask = m;
        f->k++;
        if (done < 0)
            return R_OK;
        f->n = done + 1;
        f->st = O_NEXT;
        return push(s, o->props[done].node) ? R_OK : R_FAIL;
    }
    }
    return R_FAIL;
}

static int arr_byte(gpe_jg_state *s, const gpe_jschema *p, gpe_jg_frame *f, unsigned char c)
{
    const gpe_js_node *a = &p->nodes[f->node];
    if (c == ']')
        return f->n >= a->min_items ? R_POP : R_FAIL;
    if (f->st == A_OPEN) {
        if (a->max_items == 0)
            return R_FAIL;
        f->st = A_NEXT;
        f->n = 1;
        return push(s, a->items) ? R_RETRY : R_FAIL;
    }
    if (c != ',' || (a->max_items >= 0 && f->n >= a->max_items))
        return R_FAIL;
    f->n++;
    return push(s, a->items) ? R_OK : R_FAIL;
}

static int str_byte(const gpe_jschema *p, gpe_jg_frame *f, unsigned char c)
{
    const gpe_js_node *nd = &p->nodes[f->node];
    if (f->pend) {
        if (c < f->clo || c > f->chi)
            return R_FAIL;
        f->pend--;
        f->clo = 0x80;
        f->chi = 0xBF;
        return R_OK;
    }
    if (f->st == S_ESC) {
        if (!strchr("\"\\/bfnrt", c) || c == 0)
            return R_FAIL;
        f->st = S_BODY;
        return R_OK;
    }
    if (c == '"')
        return f->n >= nd->min_chars && (!nd->re || gpe_jre_accepts(nd->re, f->mask)) ? R_POP
                                                                                   : R_FAIL;
    if (c < 0x20 || (nd->max_chars >= 0 && f->n >= nd->max_chars))
        return R_FAIL;
    if (nd->re) {
        /* a pattern string is written without escapes: each character
         * steps the automaton by its first byte (jregex.h) */
        uint64_t next = c == '\\' ? 0 : gpe_jre_step(nd->re, f->mask, c);
        if (!next)
            return R_FAIL;
        f->mask = next;
    }
    uint8_t lo = 0x80, hi = 0xBF, pend;
    if (c < 0x80)
        pend = 0;
    else if (c >= 0xC2 && c <= 0xDF)
        pend = 1;
    else if (c >= 0xE0 && c <= 0xEF)
        pend = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        pend = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return R_FAIL;
    f->n++;
    f->pend = pend;
    f->clo = lo;
    f->chi = hi;
    if (c == '\\')
        f->st = S_ESC;
    return R_OK;
}

static int num_byte(const gpe_jschema *p, gpe_jg_frame *f, unsigned char c)
{
    const gpe_js_node *nd = &p->nodes[f->node];
    bool digit = c >= '0' && c <= '9';
    switch (f->st) {
    case N_INT:
        if (digit) {
            if (f->n > 0 && f->v == 0)
                return R_FAIL;   /* no leading zeros */
            if (f->n >= MAX_DIGITS)
                return R_FAIL;
            f->v = f->v * 10 + (c - '0');
            f->n++;
            return num_need(nd, f->neg, f->n, f->v) < GPE_JS_INF ? R_OK : R_FAIL;
        }
        if (f->n == 0)
            return R_FAIL;
        if (c == '.') {
            bool nz;
            if (!frac_ok(nd, f->neg, f->v, &nz))
                return R_FAIL;
            f->st = N_DOT;
            f->h = nz;   /* a nonzero fraction digit is still due */
            return R_OK;
        }
        return num_need(nd, f->neg, f->n, f->v) == 0 ? R_POP_RETRY : R_FAIL;
    case N_DOT:
        if (!digit || (f->h && f->k + 1 >= MAX_DIGITS && c == '0'))
            return R_FAIL;
        f->st = N_FRAC;
        f->k = 1;
        f->h = f->h && c == '0';
        return R_OK;
    default:
        if (!digit)
            return f->h ? R_FAIL : R_POP_RETRY;
        if (f->k >= MAX_DIGITS || (f->h && f->k + 1 >= MAX_DIGITS && c == '0'))
            return R_FAIL;
        f->k++;
        f->h = f->h && c == '0';
        return R_OK;
    }
}

static int lit_byte(const gpe_jschema *p, gpe_jg_frame *f, unsigned char c)
{
    const gpe_js_node *nd = &p->nodes[f->node];
    int lo = f->k, hi = f->h, off = f->n;
    while (lo < hi && !(nd->lit_len[lo] > off && (unsigned char)nd->lits[lo][off] == c))
        lo++;
    int nh = lo;
    while (nh < hi && nd->lit_len[nh] > off && (unsigned char)nd->lits[nh][off] == c)
        nh++;
    if (lo == nh)
        return nd->lit_len[f->k] == off ? R_POP_RETRY : R_FAIL;
    f->k = lo;
    f->h = nh;
    f->n++;
    return R_OK;
}

/* A literal ends (literal k of its node, the frame on top): when it was
 * the tag of a discriminated union (jschema.c tag_union), the object below
 * goes on as the alternative the tag picked, after its first property. */
static void retag(gpe_jg_state *s, const gpe_jschema *p, int k)
{
    if (s->depth < 2)
        return;
    gpe_jg_frame *o = &s->f[s->depth - 2];
    const gpe_js_node *nd = &p->nodes[o->node];
    if (o->mode == F_OBJ && nd->tag_alt && o->n == 1)
        o->node = nd->tag_alt[k];
}

bool gpe_jg_feed(gpe_jg_state *s, const gpe_jschema *p, unsigned char c)
{
    for (;;) {
        if (s->depth == 0)
            return false;
        gpe_jg_frame *f = &s->f[s->depth - 1];
        int r;
        switch (f->mode) {
        case F_VALUE: r = value_byte(p, f, c); break;
        case F_OBJ: r = obj_byte(s, p, f, c); break;
        case F_ARR: r = arr_byte(s, p, f, c); break;
        case F_STR: r = str_byte(p, f, c); break;
        case F_NUM: r = num_byte(p, f, c); break;
        default: r = lit_byte(p, f, c); break;
        }
        switch (r) {
        case R_OK:
            return true;
        case R_POP:
            s->depth--;
            return true;
        case R_RETRY:
            continue;
        case R_POP_RETRY:
            if (f->mode == F_LIT)
                retag(s, p, f->k);
            s->depth--;
            continue;
        default:
            return false;
        }
    }
}

bool gpe_jg_feed_all(gpe_jg_state *s, const gpe_jschema *p, const char *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!gpe_jg_feed(s, p, (unsigned char)b[i]))
            return false;
    return true;
}

static int64_t addc(int64_t a, int64_t b)
{
    return a >= GPE_JS_INF || b >= GPE_JS_INF || a + b >= GPE_JS_INF ? GPE_JS_INF : a + b;
}

static int64_t obj_remaining(const gpe_jschema *p, const gpe_jg_frame *f)
{
    const gpe_js_node *o = &p->nodes[f->node];
    if (o->extra >= 0) {
        int64_t v = p->nodes[o->extra].min_len;
        switch (f->st) {
        case O_COMMA: return addc(v, 4);   /* "" : value } */
        case O_COLON: return addc(v, 2);
        default: return 1;
        }
    }
    switch (f->st) {
    case O_OPEN:
        return has_required(o, f->n) ? o->tail[f->n] : 1;   /* first key has no comma */
    case O_NEXT:
        return addc(o->tail[f->n], 1);
    default: {
        /* O_COMMA (k = 0 bytes of a key written) or O_KEY (k bytes) */
        uint64_t m = f->st == O_KEY ? f->mask : key_cands(o, f->n);
        int k = f->st == O_KEY ? f->k : 0;
        int64_t best = GPE_JS_INF;
        for (int i = f->n; i < o->n_props; i++) {
            if (!(m >> i & 1))
                continue;
            int64_t t = addc(o->props[i].key_len - k, p->nodes[o->props[i].node].min_len);
            t = addc(t, o->tail[i + 1]);
            best = t < best ? t : best;
        }
        return addc(best, 1);
    }
    }
}

int64_t gpe_jg_frame_remaining(const gpe_jg_frame *f, const gpe_jschema *p)
{
    const gpe_js_node *nd = &p->nodes[f->node];
    switch (f->mode) {
    case F_VALUE:
        return nd->min_len;
    case F_OBJ:
        return obj_remaining(p, f);
    case F_ARR: {
        int64_t need = (f->st == A_OPEN ? 0 : f->n);
        need = nd->min_items > need ? nd->min_items - need : 0;
        int64_t il = p->nodes[nd->items].min_len;
        if (need == 0)
            return 1;
        if (il >= GPE_JS_INF)
            return GPE_JS_INF;
        /* from A_OPEN the first item has no comma */
        return addc(need * (il + 1) - (f->st == A_OPEN ? 1 : 0), 1);
    }
    case F_STR: {
        int64_t more = nd->min_chars > f->n ? nd->min_chars - f->n : 0;
        if (nd->re) {
            int32_t r = gpe_jre_remaining(nd->re, f->mask);
            /* dead, or the pattern needs more characters than maxLength leaves */
            if (r == GPE_JRE_DEAD || (nd->max_chars >= 0 && f->n + r > nd->max_chars))
                return GPE_JS_INF;
            more = r > more ? r : more;
        }
        return f->pend + (f->st == S_ESC) + more + 1;
    }
    case F_NUM:
        if (f->st == N_DOT)
            return 1;
        if (f->st == N_FRAC)
            return f->h ? 1 : 0;   /* a nonzero digit still due */
        return num_need(nd, f->neg, f->n, f->v);
    default: {
        /* the shortest candidate still alive (sorted order puts a prefix
         * first, not the shortest: "blue" < "red") */
        int64_t m = GPE_JS_INF;
        for (int i = f->k; i < f->h; i++) {
            int64_t x = nd->lit_extra ? addc(nd->lit_len[i], nd->lit_extra[i]) : nd->lit_len[i];
            m = x < m ? x : m;
        }
        return m >= GPE_JS_INF ? GPE_JS_INF : m - f->n;
    }
    }
}

int64_t gpe_jg_remaining(const gpe_jg_state *s, const gpe_jschema *p)
{
    int64_t t = 0;
    for (int i = 0; i < s->depth; i++)
        t = addc(t, gpe_jg_frame_remaining(&s->f[i], p));
    return t;
}

bool gpe_jg_in_pattern(const gpe_jg_state *s, const gpe_jschema *p, const gpe_js_node **node,
                       int64_t *chars, uint64_t *re_state)
{
    if (s->depth == 0)
        return false;
    const gpe_jg_frame *f = &s->f[s->depth - 1];
    if (f->mode != F_STR || f->pend || f->st != S_BODY || !p->nodes[f->node].re)
        return false;
    *node = &p->nodes[f->node];
    *chars = f->n;
    *re_state = f->mask;
    return true;
}

bool gpe_jg_in_string(const gpe_jg_state *s, const gpe_jschema *p, int64_t *chars,
                      int64_t *min_chars, int64_t *max_chars)
{
    if (s->depth == 0)
        return false;
    const gpe_jg_frame *f = &s->f[s->depth - 1];
    if (f->mode != F_STR || f->pend || f->st != S_BODY || p->nodes[f->node].re)
        return false;   /* (a pattern needs each byte: no fast path) */
    *chars = f->n;
    *min_chars = p->nodes[f->node].min_chars;
    *max_chars = p->nodes[f->node].max_chars;
    return true;
}
