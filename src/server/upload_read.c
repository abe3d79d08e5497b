/* upload_read: see upload_read.h. */
#include "server/upload_read.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_json.h"
#include "server/fleet/agent_check.h"
#include "server/http/textcheck.h"

/* A cursor over the body; every reader returns false for "not ours". */
typedef struct rd {
    const char *p, *end;
    gps_upload *u;
} rd;

static void ws(rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static bool lit(rd *r, char c)
{
    ws(r);
    if (r->p >= r->end || *r->p != c)
        return false;
    r->p++;
    return true;
}

/* The bytes that end a plain run of a string: '"', '\\' and controls. */
static const bool str_stop[256] = {
    [0x00] = 1, [0x01] = 1, [0x02] = 1, [0x03] = 1, [0x04] = 1, [0x05] = 1, [0x06] = 1,
    [0x07] = 1, [0x08] = 1, [0x09] = 1, [0x0a] = 1, [0x0b] = 1, [0x0c] = 1, [0x0d] = 1,
    [0x0e] = 1, [0x0f] = 1, [0x10] = 1, [0x11] = 1, [0x12] = 1, [0x13] = 1, [0x14] = 1,
    [0x15] = 1, [0x16] = 1, [0x17] = 1, [0x18] = 1, [0x19] = 1, [0x1a] = 1, [0x1b] = 1,
    [0x1c] = 1, [0x1d] = 1, [0x1e] = 1, [0x1f] = 1, ['"'] = 1, ['\\'] = 1,
};

/* A string, unescaped, appended to out. No \u escapes (jansson's rules for
 * them, surrogates and \u0000, are left to jansson), no raw control bytes,
 * valid UTF-8. *dumped (when asked): the bytes of the text inside a string
 * as json_dumps writes it, gp_json_escaped_len of what was appended. Every
 * escape read but "\/" is the one jansson writes, and every other byte is
 * written as it came, so that is the string's bytes here less one per "\/"
 * (a token's size without a second pass over its text, issue 24). */
static bool str_sized(rd *r, gp_buf *out, size_t *dumped)
{
    if (!lit(r, '"'))
        return false;
    size_t from = out->len;
    const char *open = r->p;
    size_t slashes = 0; /* "\/" read: 2 bytes here, '/' in a dump */
    const char *run = r->p;
    unsigned char hi = 0; /* any byte >= 0x80: only then is UTF-8 checked */
    for (;;) {
        /* The plain bytes of a run, one test each. */
        while (r->p < r->end && !str_stop[(unsigned char)*r->p])
            hi |= (unsigned char)*r->p++;
        if (r->p >= r->end)
            return false;
        unsigned char c = (unsigned char)*r->p;
        if (c == '"' || c == '\\') {
            if (r->p > run && gp_buf_append(out, run, (size_t)(r->p - run)) < 0)
                return false;
            if (c == '"')
                break;
            if (r->p + 1 >= r->end)
                return false;
            char e;
            switch (r->p[1]) {
            case '"': e = '"'; break;
            case '\\': e = '\\'; break;
            case '/': e = '/'; slashes++; break;
            case 'b': e = '\b'; break;
            case 'f': e = '\f'; break;
            case 'n': e = '\n'; break;
            case 'r': e = '\r'; break;
            case 't': e = '\t'; break;
            default: return false; /* \u (jansson's rules) or not an escape */
            }
            if (gp_buf_append(out, &e, 1) < 0)
                return false;
            r->p += 2;
            run = r->p;
            continue;
        }
        return false; /* a raw control byte */
    }
    if (dumped)
        *dumped = (size_t)(r->p - open) - slashes;
    r->p++; /* the closing quote */
    return hi < 0x80 || gps_text_utf8(out->data + from, out->len - from);
}

static bool str(rd *r, gp_buf *out)
{
    return str_sized(r, out, NULL);
}

/* A key (at most 15 bytes of [a-z_], as every key of ours) into k. */
static bool key(rd *r, char k[16])
{
    ws(r);
    if (r->p >= r->end || *r->p != '"')
        return false;
    const char *s = r->p + 1;
    const char *q = memchr(s, '"', (size_t)(r->end - s));
    if (!q || q - s > 15)
        return false;
    for (const char *c = s; c < q; c++)
        if (!((*c >= 'a' && *c <= 'z') || *c == '_'))
            return false; /* ours are [a-z_]: anything else is not ours */
    memcpy(k, s, (size_t)(q - s));
    k[q - s] = '\0';
    r->p = q + 1;
    return lit(r, ':');
}

/* A non-negative integer as JSON writes it: no sign, no leading zero, no
 * fraction or exponent (jansson would make those reals), at most 18 digits. */
static bool num(rd *r, long long *v)
{
    ws(r);
    const char *s = r->p;
    long long x = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        if (r->p - s < 18) /* past 18 digits it is declined below: no overflow */
            x = x * 10 + (*r->p - '0');
        r->p++;
    }
    size_t nd = (size_t)(r->p - s);
    if (nd == 0 || nd > 18 || (nd > 1 && *s == '0'))
        return false;
    if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E'))
        return false;
    *v = x;
    return true;
}

/* Skip one value (a non-token event is cut out this way and handed to
 * jansson, which judges it whole). */
static bool skip(rd *r, int depth)
{
    ws(r);
    if (r->p >= r->end || depth > 64)
        return false;
    char c = *r->p;
    if (c == '"') {
        for (r->p++; r->p < r->end; r->p++) {
            if (*r->p == '\\')
                r->p++;
            else if (*r->p == '"') {
                r->p++;
                return true;
            }
        }
        return false;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->p++;
        if (lit(r, close))
            return true;
        do {
            if (c == '{' && (!skip(r, depth + 1) || !lit(r, ':')))
                return false;
            if (!skip(r, depth + 1))
                return false;
        } while (lit(r, ','));
        return lit(r, close);
    }
    const char *s = r->p;
    while (r->p < r->end && strchr(",}] \t\r\n", *r->p) == NULL)
        r->p++;
    return r->p > s;
}

/* An event as no reader has touched it. */
static void ev_clear(gps_event_in *e)
{
    memset(e, 0, sizeof *e);
    e->token_id = -1;
}

static gps_event_in *ev_push(gps_upload *u)
{
    if (u->n_evs == u->cap_evs) {
        size_t nc = u->cap_evs ? u->cap_evs * 2 : 64;
        gps_event_in *v = realloc(u->evs, nc * sizeof *v);
        if (!v)
            return NULL;
        u->evs = v;
        u->cap_evs = nc;
    }
    gps_event_in *e = &u->evs[u->n_evs++];
    ev_clear(e);
    return e;
}

static size_t digits(long long v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* The compact size of {"type":"token","text":"..."[,"token_id":N]};
 * dumped: the text's bytes in the dump (str_sized). */
static size_t token_bytes(const gps_event_in *e, size_t dumped, bool has_id)
{
    return 2 + (4 + 3 + 7) + 1 + (4 + 3 + 2 + dumped) +
           (has_id ? 1 + 8 + 3 + digits(e->token_id) : 0);
}

/* A token event exactly as every agent writes it (agent_evq_token_json):
 * {"type":"token","text":"..."} or with ,"token_id":N last; without a
 * key lookup per member. Reads what token_ev reads for such bytes. false:
 * not that shape (the caller rewinds and tries token_ev). */
static bool token_ev_compact(rd *r, gps_event_in *e)
{
    static const char head[] = "{\"type\":\"token\",\"text\":";
    static const char id[] = ",\"token_id\":";
    gps_upload *u = r->u;
    ws(r);
    if ((size_t)(r->end - r->p) < sizeof head - 1 || memcmp(r->p, head, sizeof head - 1) != 0)
        return false;
    r->p += sizeof head - 1;
    size_t from = u->text.len, dumped = 0;
    if (!str_sized(r, &u->text, &dumped))
        return false;
    e->text = u->text.data + from;
    e->len = u->text.len - from;
    bool has_id = false;
    if ((size_t)(r->end - r->p) >= sizeof id - 1 && memcmp(r->p, id, sizeof id - 1) == 0) {
        r->p += sizeof id - 1;
        if (!num(r, &e->token_id) || e->token_id > GPS_AGENT_MAX_TOKEN_ID)
            return false;
        has_id = true;
    }
    if (r->p >= r->end || *r->p != '}')
        return false;
    r->p++;
    e->bytes = token_bytes(e, dumped, has_id);
    return e->bytes <= GPS_AGENT_MAX_EVENT_BYTES;
}

/* A token event {"type":"token","text":..[,"token_id":N]}, keys in any
 * order. false with r->p anywhere: the caller rewinds. */
static bool token_ev(rd *r, gps_event_in *e)
{
    gps_upload *u = r->u;
    bool has_type = false, has_text = false, has_id = false;
    size_t text_from = u->text.len, dumped = 0;
    if (!lit(r, '{'))
        return false;
    do {
        char k[16];
        if (!key(r, k))
            return false;
        if (!strcmp(k, "type") && !has_type) {
            ws(r);
            /* As every agent writes it: no unescaping, no copy. */
            if (r->end - r->p >= 7 && memcmp(r->p, "\"token\"", 7) == 0) {
                r->p += 7;
                has_type = true;
                continue;
            }
            size_t at = u->text.len;
            if (!str(r, &u->text) || u->text.len - at != 5 ||
                memcmp(u->text.data + at, "token", 5) != 0)
                return false;
            gp_buf_truncate(&u->text, at); /* (the type is not kept) */
            has_type = true;
        } else if (!strcmp(k, "text") && !has_text) {
            text_from = u->text.len;
            if (!str_sized(r, &u->text, &dumped))
                return false;
            e->text = u->text.data + text_from;
            e->len = u->text.len - text_from;
            has_text = true;
        } else if (!strcmp(k, "token_id") && !has_id) {
            if (!num(r, &e->token_id) || e->token_id > GPS_AGENT_MAX_TOKEN_ID)
                return false;
            has_id = true;
        } else {
            return false; /* another key, or a duplicate */
        }
    } while (lit(r, ','));
    if (!lit(r, '}') || !has_type || !has_text)
        return false;
    e->bytes = token_bytes(e, dumped, has_id);
    return e->bytes <= GPS_AGENT_MAX_EVENT_BYTES;
}

/* A JSON number as jansson reads it: an integer of at most 18 digits
 * (strtoll's range, with room) into *iv, or a real strtod reads (as
 * jansson does) to a finite value into *dv; *is_int says which. false:
 * another number (the caller declines). */
static bool plain_num(rd *r, bool *is_int, long long *iv, double *dv)
{
    const char *s = r->p, *p = s;
    if (p < r->end && *p == '-')
        p++;
    const char *d = p;
    while (p < r->end && *p >= '0' && *p <= '9')
        p++;
    size_t nd = (size_t)(p - d);
    if (nd == 0 || (nd > 1 && *d == '0'))
        return false;
    bool real = false;
    if (p < r->end && *p == '.') {
        const char *f = ++p;
        while (p < r->end && *p >= '0' && *p <= '9')
            p++;
        if (p == f)
            return false;
        real = true;
    }
    if (p < r->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < r->end && (*p == '+' || *p == '-'))
            p++;
        const char *x = p;
        while (p < r->end && *p >= '0' && *p <= '9')
            p++;
        if (p == x)
            return false;
        real = true;
    }
    r->p = p;
    *is_int = !real;
    if (!real) {
        if (nd > 18)
            return false;
        long long v = 0;
        for (const char *c = d; c < p; c++)
            v = v * 10 + (*c - '0');
        *iv = *s == '-' ? -v : v;
        return true;
    }
    char b[64];
    if ((size_t)(p - s) >= sizeof b)
        return false;
    memcpy(b, s, (size_t)(p - s));
    b[p - s] = '\0';
    *dv = strtod(b, NULL);
    return !isinf(*dv);
}

/* plain_num's number as jansson's tree. */
static json_t *flat_num(rd *r)
{
    bool is_int;
    long long iv;
    double dv;
    if (!plain_num(r, &is_int, &iv, &dv))
        return NULL;
    return is_int ? json_integer(iv) : json_real(dv);
}

static json_t *flat_obj(rd *r, int depth);

/* One value of an event: a string as str() reads it, a number as
 * flat_num, true, false, null, or an object as flat_obj. NULL: anything
 * else (an array, a \u escape, ...: the caller hands it to jansson). */
static json_t *flat_value(rd *r, int depth)
{
    ws(r);
    if (r->p >= r->end)
        return NULL;
    char c = *r->p;
    if (c == '"') {
        gp_buf *t = &r->u->text; /* a scratch end of it, given back at once */
        size_t at = t->len;
        json_t *v = str(r, t) ? json_stringn_nocheck(t->data + at, t->len - at) : NULL;
        gp_buf_truncate(t, at);
        return v;
    }
    if (c == '{')
        return flat_obj(r, depth + 1);
    if (c == '-' || (c >= '0' && c <= '9'))
        return flat_num(r);
    static const char *const lits[] = {"true", "false", "null"};
    for (size_t k = 0; k < 3; k++) {
        size_t n = strlen(lits[k]);
        if ((size_t)(r->end - r->p) >= n && memcmp(r->p, lits[k], n) == 0) {
            r->p += n;
            return k == 0 ? json_true() : k == 1 ? json_false() : json_null();
        }
    }
    return NULL;
}

/* An object of such values whose keys are 1..63 bytes of printable ASCII
 * without escapes, as agents write every event; a duplicate key declines
 * (jansson, with JSON_REJECT_DUPLICATES, refuses it). */
static json_t *flat_obj(rd *r, int depth)
{
    if (depth > 8 || !lit(r, '{'))
        return NULL;
    json_t *o = json_object();
    if (!o || lit(r, '}'))
        return o;
    do {
        ws(r);
        char k[64];
        const char *s = r->p + 1, *q = s;
        if (r->p >= r->end || *r->p != '"')
            goto no;
        while (q < r->end && q - s < 63 && *q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\')
            q++;
        if (q >= r->end || *q != '"' || q == s)
            goto no;
        memcpy(k, s, (size_t)(q - s));
        k[q - s] = '\0';
        r->p = q + 1;
        if (!lit(r, ':') || json_object_get(o, k))
            goto no;
        json_t *v = flat_value(r, depth);
        if (!v || json_object_set_new_nocheck(o, k, v) < 0)
            goto no;
    } while (lit(r, ','));
    if (lit(r, '}'))
        return o;
no:
    json_decref(o);
    return NULL;
}

/* A string of printable ASCII without '"' or '\\' (ids, names, finish
 * reasons), which jansson reads as the same bytes and dumps as they are:
 * *s, *n in the body. */
static bool ascii_str(rd *r, const char **s, size_t *n)
{
    if (!lit(r, '"'))
        return false;
    const char *b = r->p;
    while (r->p < r->end && *r->p >= 0x20 && *r->p < 0x7f && *r->p != '"' && *r->p != '\\')
        r->p++;
    if (r->p >= r->end || *r->p != '"')
        return false;
    *s = b;
    *n = (size_t)(r->p - b);
    r->p++;
    return true;
}

/* A member of a plain event (plain_ev). */
typedef struct pmem {
    const char *k; /* in the body, klen bytes of [A-Za-z0-9_] */
    size_t klen;
    char kind;     /* 's' string, 'i' integer, 'r' real, 'u' usage counts */
    const char *s; /* 's': in the body, slen bytes */
    size_t slen;
    long long i;   /* 'i' */
    double d;      /* 'i', 'r': the value as json_number_value reads it */
    long long pt, ct; /* 'u': its prompt_tokens, completion_tokens, -1 when absent */
    size_t size;   /* the value's bytes as compact JSON */
} pmem;

static bool is(const pmem *m, const char *name)
{
    size_t n = strlen(name);
    return m->klen == n && memcmp(m->k, name, n) == 0;
}

static bool str_is(const pmem *m, const char *v)
{
    size_t n = strlen(v);
    return m->kind == 's' && m->slen == n && memcmp(m->s, v, n) == 0;
}

/* A key of 1..63 bytes of [A-Za-z0-9_] and its ':'. */
static bool plain_key(rd *r, pmem *m)
{
    ws(r);
    if (r->p >= r->end || *r->p != '"')
        return false;
    const char *s = r->p + 1, *q = s;
    while (q < r->end && q - s < 64 &&
           ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
            *q == '_'))
        q++;
    if (q >= r->end || *q != '"' || q == s || q - s >= 64)
        return false;
    m->k = s;
    m->klen = (size_t)(q - s);
    r->p = q + 1;
    return lit(r, ':');
}

/* An end event's usage: {"prompt_tokens":N,"completion_tokens":N}, either
 * or none, counts within the check's bounds. */
static bool plain_usage(rd *r, pmem *m)
{
    m->kind = 'u';
    m->pt = m->ct = -1;
    m->size = 2;
    if (!lit(r, '{'))
        return false;
    if (lit(r, '}'))
        return true;
    size_t n = 0;
    do {
        pmem x;
        bool is_int;
        long long v;
        double d;
        if (!plain_key(r, &x))
            return false;
        ws(r);
        if (!plain_num(r, &is_int, &v, &d) || !is_int || v < 0 || v > GPS_AGENT_MAX_TOKENS)
            return false;
        long long *slot = is(&x, "prompt_tokens")       ? &m->pt
                          : is(&x, "completion_tokens") ? &m->ct
                                                        : NULL;
        if (!slot || *slot >= 0)
            return false; /* another key (the check's to judge), or a duplicate */
        *slot = v;
        m->size += (n++ ? 1 : 0) + x.klen + 3 + digits(v);
    } while (lit(r, ','));
    return lit(r, '}');
}

/* A metrics event's members: numbers within the check's bounds. */
static bool plain_metrics(gps_event_in *e, const pmem *m, size_t n)
{
    if (n > GPS_AGENT_MAX_METRICS_FIELDS)
        return false;
    for (size_t i = 0; i < n; i++) {
        const pmem *x = &m[i];
        if (is(x, "type"))
            continue;
        char k[64];
        memcpy(k, x->k, x->klen);
        k[x->klen] = '\0';
        if ((x->kind != 'i' && x->kind != 'r') ||
            gps_agent_metric_check(k, x->kind == 'i', x->d, NULL) < 0)
            return false;
        if (strcmp(k, "tokens_per_sec") == 0) {
            e->has_tps = true;
            e->tokens_per_sec = x->d;
        } else if (strcmp(k, "prompt_tokens") == 0) {
            e->prompt_tokens = x->i; /* (an integer >= 0: its bounds) */
        } else if (strcmp(k, "count_estimated") == 0) {
            e->count_estimated = x->d != 0;
        }
    }
    return true;
}

/* A progress event's members: prompt_tokens_done, prompt_tokens_total,
 * token counts. */
static bool plain_progress(gps_event_in *e, const pmem *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const pmem *x = &m[i];
        if (is(x, "type"))
            continue;
        long long *to = is(x, "prompt_tokens_done")    ? &e->progress_done
                        : is(x, "prompt_tokens_total") ? &e->progress_total
                                                       : NULL;
        if (!to || x->kind != 'i' || x->i < 0 || x->i > GPS_AGENT_MAX_TOKENS)
            return false;
        *to = x->i;
    }
    return true;
}

/* An end event's members: finish_reason (1..32 bytes), usage,
 * stop_sequence (1..GPS_AGENT_MAX_STOP_SEQUENCE bytes); their strings
 * kept NUL-terminated in the upload's text. */
static bool plain_end(gps_upload *u, gps_event_in *e, const pmem *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const pmem *x = &m[i];
        if (is(x, "type"))
            continue;
        if (is(x, "usage") && x->kind == 'u') {
            e->prompt_tokens = x->pt;
            e->completion_tokens = x->ct;
            continue;
        }
        bool fr = is(x, "finish_reason");
        if ((!fr && !is(x, "stop_sequence")) || x->kind != 's' || x->slen == 0 ||
            x->slen > (fr ? 32 : GPS_AGENT_MAX_STOP_SEQUENCE))
            return false; /* upstream_meta (kept as a tree), null, another key... */
        size_t at = u->text.len;
        if (gp_buf_append(&u->text, x->s, x->slen) < 0 || gp_buf_append(&u->text, "", 1) < 0)
            return false;
        *(fr ? &e->finish_reason : &e->stop_sequence) = u->text.data + at;
    }
    return true;
}

/* The other events every agent sends with every request, read into the
 * fields the server keeps without a tree (e->plain): {"type":"started"};
 * a progress event of its two counts; a metrics event of numbers; an end
 * event of finish_reason, usage and stop_sequence. Keys of [A-Za-z0-9_], strings of printable ASCII
 * without escapes, numbers as plain_num reads them. Taken only where
 * gps_agent_event_check_sized takes the same bytes, with the size it
 * counts; anything else (upstream_meta, an escape, a null, a bound passed,
 * another type or key, a duplicate key) declines, and other_ev reads,
 * checks and refuses it as before. */
static bool plain_ev(rd *r, gps_event_in *e)
{
    pmem m[GPS_AGENT_MAX_METRICS_FIELDS + 1];
    size_t n = 0, bytes = 2;
    const pmem *type = NULL;
    ws(r);
    const char *raw = r->p;
    if (!lit(r, '{') || lit(r, '}'))
        return false;
    do {
        if (n == sizeof m / sizeof m[0])
            return false;
        pmem *x = &m[n];
        memset(x, 0, sizeof *x);
        if (!plain_key(r, x))
            return false;
        for (size_t i = 0; i < n; i++)
            if (m[i].klen == x->klen && memcmp(m[i].k, x->k, x->klen) == 0)
                return false; /* a duplicate: jansson refuses it */
        ws(r);
        if (r->p < r->end && *r->p == '"') {
            if (!ascii_str(r, &x->s, &x->slen))
                return false;
            x->kind = 's';
            x->size = x->slen + 2;
        } else if (r->p < r->end && *r->p == '{') {
            if (!is(x, "usage") || !plain_usage(r, x))
                return false;
        } else {
            bool is_int;
            if (!plain_num(r, &is_int, &x->i, &x->d))
                return false;
            x->kind = is_int ? 'i' : 'r';
            if (is_int)
                x->d = (double)x->i;
            x->size = is_int ? (x->i < 0 ? 1 + digits(-x->i) : digits(x->i))
                             : gp_json_real_size(x->d);
        }
        bytes += (n ? 1 : 0) + x->klen + 3 + x->size;
        if (is(x, "type"))
            type = x;
        n++;
    } while (lit(r, ','));
    if (!lit(r, '}') || !type || bytes > GPS_AGENT_MAX_EVENT_BYTES)
        return false;
    e->plain = true;
    e->raw = raw;
    e->raw_len = (size_t)(r->p - raw);
    e->bytes = bytes;
    e->prompt_tokens = e->completion_tokens = e->progress_done = e->progress_total = -1;
    if (str_is(type, "progress")) {
        e->type = GPS_EV_UNKNOWN;
        e->progress = true;
        return plain_progress(e, m, n);
    }
    if (str_is(type, "started")) {
        e->type = GPS_EV_STARTED;
        return n == 1;
    }
    if (str_is(type, "metrics")) {
        e->type = GPS_EV_METRICS;
        return plain_metrics(e, m, n);
    }
    if (str_is(type, "end")) {
        e->type = GPS_EV_END;
        return plain_end(r->u, e, m, n);
    }
    return false;
}

/* Any other event: cut out, read and checked alone. A flat event (every
 * agent's started, metrics, progress, end) is built without jansson's
 * parser (most of an event's cost); any other shape is parsed by it. */
static bool other_ev(rd *r, gps_event_in *e, size_t i)
{
    ws(r);
    const char *s = r->p;
    if (!skip(r, 0))
        return false;
    rd sub = {s, r->p, r->u};
    e->ev = flat_obj(&sub, 0);
    if (e->ev && sub.p != r->p) { /* (skip ends the value where flat_obj does) */
        json_decref(e->ev);
        e->ev = NULL;
    }
    /* Checked: an event jansson read while memory ran short may have a
     * string changed. Out of memory is a NULL like any other: the caller
     * then reads the whole body with gps_req_json, which answers 500. */
    if (!e->ev)
        e->ev = gp_json_load_checked(s, (size_t)(r->p - s), JSON_REJECT_DUPLICATES, NULL);
    char field[96], msg[256];
    return e->ev && gps_agent_event_check_sized(e->ev, i, &e->bytes, field, sizeof field, msg,
                                                sizeof msg) == 0;
}

/* The readers of one event, cheapest first. Each reads the event whole
 * or fails; the next starts again where the event begins, with the event
 * and the text as they were (ev_restart). other_ev, the last, takes
 * anything the event checker accepts. */
typedef bool (*ev_reader)(rd *r, gps_event_in *e);
static const ev_reader EV_READERS[] = {token_ev_compact, token_ev, plain_ev};

static void ev_restart(rd *r, gps_event_in *e, const char *at, size_t text_len)
{
    r->p = at;
    gp_buf_truncate(&r->u->text, text_len);
    ev_clear(e);
}

static bool events(rd *r, gps_upload_job *jb)
{
    gps_upload *u = r->u;
    jb->first = u->n_evs;
    if (!lit(r, '['))
        return false;
    if (lit(r, ']'))
        return true;
    do {
        if (u->n_evs - jb->first >= GPS_AGENT_MAX_EVENTS)
            return false;
        gps_event_in *e = ev_push(u); /* (cleared, as ev_restart leaves it) */
        if (!e)
            return false;
        const char *at = r->p;
        size_t tlen = u->text.len;
        bool read = false;
        for (size_t k = 0; !read && k < sizeof EV_READERS / sizeof *EV_READERS; k++) {
            if (k)
                ev_restart(r, e, at, tlen);
            read = EV_READERS[k](r, e);
        }
        if (!read) {
            ev_restart(r, e, at, tlen);
            if (!other_ev(r, e, u->n_evs - 1 - jb->first))
                return false;
        }
        jb->n++;
    } while (lit(r, ','));
    return lit(r, ']');
}

static bool entry(rd *r)
{
    gps_upload *u = r->u;
    if (u->n_jobs == u->cap_jobs) {
        size_t nc = u->cap_jobs ? u->cap_jobs * 2 : 16;
        gps_upload_job *v = realloc(u->jobs, nc * sizeof *v);
        if (!v)
            return false;
        u->jobs = v;
        u->cap_jobs = nc;
    }
    gps_upload_job *jb = &u->jobs[u->n_jobs++];
    memset(jb, 0, sizeof *jb);
    bool has_id = false, has_seq = false, has_evs = false;
    if (!lit(r, '{'))
        return false;
    do {
        char k[16];
        if (!key(r, k))
            return false;
        if (!strcmp(k, "job_id") && !has_id) {
            jb->job_id_off = u->text.len;
            if (!str(r, &u->text) || gp_buf_append(&u->text, "", 1) < 0)
                return false;
            jb->job_id_len = u->text.len - 1 - jb->job_id_off;
            if (jb->job_id_len == 0 || jb->job_id_len > 128 ||
                memchr(u->text.data + jb->job_id_off, '\0', jb->job_id_len))
                return false;
            has_id = true;
        } else if (!strcmp(k, "seq") && !has_seq) {
            if (!num(r, &jb->seq) || jb->seq > GPS_AGENT_MAX_SEQ)
                return false;
            has_seq = true;
        } else if (!strcmp(k, "events") && !has_evs) {
            if (!events(r, jb))
                return false;
            has_evs = true;
        } else {
            return false;
        }
    } while (lit(r, ','));
    return lit(r, '}') && has_id && has_seq && has_evs;
}

static bool top(rd *r, size_t max_jobs)
{
    gps_upload *u = r->u;
    bool has_agent = false, has_jobs = false;
    if (!lit(r, '{'))
        return false;
    do {
        char k[16];
        if (!key(r, k))
            return false;
        if (!strcmp(k, "agent_id") && !has_agent) {
            size_t at = u->text.len;
            if (!str(r, &u->text) || u->text.len - at != 36)
                return false;
            memcpy(u->agent_id, u->text.data + at, 36);
            u->agent_id[36] = '\0';
            gp_buf_truncate(&u->text, at);
            if (!gp_uuid_valid(u->agent_id))
                return false;
            has_agent = true;
        } else if (!strcmp(k, "jobs") && !has_jobs) {
            if (!lit(r, '[') || lit(r, ']'))
                return false; /* an empty batch is refused: jansson's path words it */
            do {
                if (u->n_jobs >= max_jobs || !entry(r))
                    return false;
            } while (lit(r, ','));
            if (!lit(r, ']'))
                return false;
            has_jobs = true;
        } else if (!strcmp(k, "instance") && !u->instance) {
            size_t at = u->text.len;
            if (!str(r, &u->text) || gp_buf_append(&u->text, "", 1) < 0)
                return false;
            u->instance = u->text.data + at;
            u->instance_len = u->text.len - 1 - at;
            if (memchr(u->instance, '\0', u->instance_len))
                return false;
        } else {
            return false; /* other liveness fields and the rest: jansson's path */
        }
    } while (lit(r, ','));
    if (!lit(r, '}') || !has_agent || !has_jobs)
        return false;
    ws(r);
    return r->p == r->end;
}

bool gps_upload_read(const char *body, size_t n, size_t max_jobs, gps_upload *u)
{
    memset(u, 0, sizeof *u);
    gp_buf_init(&u->text);
    /* What is kept (unescaped texts, job ids and their NULs) is never
     * longer than the body: one allocation, and pointers into it hold. */
    u->text.data = malloc(n + 16);
    if (!u->text.data)
        return false;
    u->text.cap = n + 16;
    u->text.data[0] = '\0';
    char *base = u->text.data;
    rd r = {body, body + n, u};
    if (!body || !top(&r, max_jobs) || u->text.data != base) {
        gps_upload_free(u);
        return false;
    }
    for (size_t i = 0; i < u->n_jobs; i++)
        u->jobs[i].job_id = u->text.data + u->jobs[i].job_id_off;
    return true;
}

void gps_upload_free(gps_upload *u)
{
    for (size_t i = 0; i < u->n_evs; i++)
        json_decref(u->evs[i].ev);
    free(u->evs);
    free(u->jobs);
    gp_buf_free(&u->text);
    memset(u, 0, sizeof *u);
}

/* A plain string of the work body: printable ASCII without '"' or '\\'
 * (ids, tokens, names), which jansson reads as the same bytes. */
static json_t *plain_str(rd *r)
{
    const char *s;
    size_t n;
    return ascii_str(r, &s, &n) ? json_stringn_nocheck(s, n) : NULL;
}

/* One value of the work body: a plain string, an integer as num() reads
 * it, or an array of plain strings. NULL: anything else. */
static json_t *work_value(rd *r)
{
    ws(r);
    if (r->p >= r->end)
        return NULL;
    if (*r->p == '"')
        return plain_str(r);
    if (*r->p >= '0' && *r->p <= '9') {
        long long v;
        return num(r, &v) ? json_integer(v) : NULL;
    }
    if (!lit(r, '['))
        return NULL;
    json_t *a = json_array();
    if (!a || lit(r, ']'))
        return a;
    do {
        json_t *s = plain_str(r);
        if (!s || json_array_append_new(a, s) < 0) {
            json_decref(a);
            return NULL;
        }
    } while (lit(r, ','));
    if (!lit(r, ']')) {
        json_decref(a);
        return NULL;
    }
    return a;
}

json_t *gps_work_read(const char *body, size_t n)
{
    rd r = {body, body + n, NULL};
    json_t *o = body ? json_object() : NULL;
    if (!o || !lit(&r, '{'))
        goto no;
    if (lit(&r, '}'))
        goto end;
    do {
        char k[16];
        if (!key(&r, k) || json_object_get(o, k)) /* a duplicate: jansson refuses it */
            goto no;
        json_t *v = work_value(&r);
        if (!v || json_object_set_new_nocheck(o, k, v) < 0)
            goto no;
    } while (lit(&r, ','));
    if (!lit(&r, '}'))
        goto no;
end:
    ws(&r);
    if (r.p == r.end)
        return o;
no:
    json_decref(o);
    return NULL;
}
