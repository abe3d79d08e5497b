/* agent_util: see agent_util.h. */
#include "agent/agent_util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ======================================================================== */
/* SSE                                                                      */
/* ======================================================================== */

void agent_sse_init(agent_sse *s, size_t max_line)
{
    memset(s, 0, sizeof *s);
    gp_buf_init(&s->line);
    gp_buf_init(&s->data);
    s->max_line = max_line ? max_line : (1u << 20);
}

void agent_sse_free(agent_sse *s)
{
    gp_buf_free(&s->line);
    gp_buf_free(&s->data);
}

/* The event's one data line, read where it lay, copied into s->data: the
 * bytes it points into go away when the feed returns, or another data
 * line follows. */
static int sse_keep(agent_sse *s)
{
    if (!s->direct)
        return 0;
    s->data.len = 0;
    int rc = gp_buf_append(&s->data, s->direct, s->direct_len);
    s->direct = NULL;
    return rc;
}

static int sse_dispatch(agent_sse *s, agent_sse_cb cb, void *ud)
{
    if (!s->have_data)
        return 0;
    s->have_data = false;
    if (s->direct) {
        const char *d = s->direct;
        s->direct = NULL;
        return cb(ud, d, s->direct_len);
    }
    const char *d = s->data.data ? s->data.data : "";
    size_t n = s->data.len;
    int rc = cb(ud, d, n);
    gp_buf_truncate(&s->data, 0);
    return rc;
}

/* One complete line (without its terminator). in_feed: l points into the
 * bytes of the current feed, which stay put until it returns. */
static int sse_line(agent_sse *s, const char *l, size_t n, bool in_feed, agent_sse_cb cb,
                    void *ud)
{
    if (n == 0)
        return sse_dispatch(s, cb, ud);
    if (l[0] == ':')
        return 0;
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    if (fl != 4 || memcmp(l, "data", 4) != 0)
        return 0; /* event:, id:, retry: and unknown fields carry nothing we use */
    const char *v = colon ? colon + 1 : l + n;
    size_t vl = (size_t)(l + n - v);
    if (vl > 0 && v[0] == ' ') {
        v++;
        vl--;
    }
    if (!s->have_data && in_feed) {
        /* The usual event, one data line whose blank line follows in the
         * same read: passed on where it lies, not copied (issue 24). */
        s->direct = v;
        s->direct_len = vl;
        s->have_data = true;
        return 0;
    }
    if (sse_keep(s) < 0)
        return -1;
    if (s->have_data && gp_buf_append(&s->data, "\n", 1) < 0)
        return -1;
    if (gp_buf_append(&s->data, v, vl) < 0)
        return -1;
    if (s->data.len > s->max_line)
        return -1;
    s->have_data = true;
    return 0;
}

static int sse_feed_lines(agent_sse *s, const char *p, size_t n, agent_sse_cb cb, void *ud)
{
    size_t i = 0;
    if (n == 0)
        return 0;
    if (s->pending_cr && p[0] == '\n')
        i = 1; /* the LF of a CRLF split across feeds */
    s->pending_cr = false;
    while (i < n) {
        /* Find the next terminator (memchr: a token chunk's line is ~170
         * bytes, scanned once per byte before). */
        const char *nl = memchr(p + i, '\n', n - i);
        size_t j = nl ? (size_t)(nl - p) : n;
        const char *cr = memchr(p + i, '\r', j - i);
        if (cr)
            j = (size_t)(cr - p);
        if (j == n) {
            if (gp_buf_append(&s->line, p + i, n - i) < 0 || s->line.len > s->max_line)
                return -1;
            return 0;
        }
        int rc;
        if (s->line.len > 0) {
            if (gp_buf_append(&s->line, p + i, j - i) < 0 || s->line.len > s->max_line)
                return -1;
            rc = sse_line(s, s->line.data, s->line.len, false, cb, ud);
            s->line.len = 0;
        } else {
            if (j - i > s->max_line)
                return -1;
            rc = sse_line(s, p + i, j - i, true, cb, ud);
        }
        if (rc != 0)
            return rc;
        if (p[j] == '\r') {
            if (j + 1 < n && p[j + 1] == '\n')
                j++;
            else if (j + 1 == n)
                s->pending_cr = true;
        }
        i = j + 1;
    }
    return 0;
}

int agent_sse_feed(agent_sse *s, const char *p, size_t n, agent_sse_cb cb, void *ud)
{
    int rc = sse_feed_lines(s, p, n, cb, ud);
    /* A data line still waiting for its blank line is copied before p
     * goes away. */
    if (sse_keep(s) < 0 && rc == 0)
        rc = -1;
    return rc;
}

int agent_sse_finish(agent_sse *s, agent_sse_cb cb, void *ud)
{
    if (s->line.len > 0) {
        int rc = sse_line(s, s->line.data, s->line.len, false, cb, ud);
        s->line.len = 0;
        if (rc != 0)
            return rc;
    }
    return sse_dispatch(s, cb, ud);
}

/* ======================================================================== */
/* Event queue                                                              */
/* ======================================================================== */

void agent_evq_init(agent_evq *q)
{
    memset(q, 0, sizeof *q);
    gp_buf_init(&q->text);
}

void agent_evq_free(agent_evq *q)
{
    gp_buf_free(&q->text);
    free(q->ends);
    q->ends = NULL;
    q->n = q->cap = 0;
}

/* An event was lost (out of memory): the queue ends here. It takes no
 * later event (a token after a gap would be sent as if nothing were
 * missing), keeps the whole events before it, and its last event is
 * AGENT_EVQ_OOM_EVENT, which is never stored: it is counted
 * (agent_evq_len) and written from the static text when an upload takes it
 * (evq_batch_append), so that ending the job needs no memory of the
 * queue's. After a terminal event nothing is lost (whatever came would be
 * dropped): the queue ends as it was. */
static void evq_break(agent_evq *q)
{
    if (q->terminal)
        return;
    q->broken = true;
    q->terminal = true;
}

/* The event just appended to q->text (from `at` on) ends with a comma and
 * is counted; on failure the text is cut back to `at` and the queue breaks
 * (evq_break). */
static int evq_close(agent_evq *q, size_t at, int rc)
{
    if (rc == 0 && q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 16;
        size_t *e = realloc(q->ends, cap * sizeof *e);
        if (!e)
            rc = -1;
        else {
            q->ends = e;
            q->cap = cap;
        }
    }
    if (rc == 0)
        rc = gp_buf_append(&q->text, ",", 1);
    if (rc < 0) {
        gp_buf_truncate(&q->text, at);
        evq_break(q);
        return -1;
    }
    q->ends[q->n++] = q->text.len;
    return 0;
}

int agent_evq_push(agent_evq *q, json_t *ev)
{
    if (!ev) { /* the caller could not build it: lost */
        evq_break(q);
        return -1;
    }
    if (q->terminal) {
        json_decref(ev);
        return -1;
    }
    const char *t = json_string_value(json_object_get(ev, "type"));
    bool terminal = t && (strcmp(t, "end") == 0 || strcmp(t, "error") == 0);
    size_t at = q->text.len;
    int rc = evq_close(q, at, gp_json_dump_append(&q->text, ev));
    json_decref(ev);
    if (rc == 0 && terminal)
        q->terminal = true;
    return rc;
}

int agent_evq_push_typed(agent_evq *q, const json_t *fields, const char *type)
{
    bool obj = json_is_object(fields);
    if (!obj || json_object_get(fields, "type")) {
        /* No fields, or a "type" among them: the copy's own way (set
         * replaces it where it stands). */
        json_t *ev = obj ? json_deep_copy(fields) : json_object();
        if (ev && json_object_set_new(ev, "type", json_string(type)) < 0) {
            json_decref(ev);
            ev = NULL;
        }
        return agent_evq_push(q, ev);
    }
    if (q->terminal)
        return -1;
    size_t at = q->text.len;
    int rc = gp_json_dump_append(&q->text, fields);
    if (rc == 0) {
        q->text.len--; /* the object's '}': "type" goes last, as set appends it */
        rc = (json_object_size(fields) > 0 && gp_buf_append(&q->text, ",", 1) < 0) ||
                     gp_buf_append(&q->text, "\"type\":\"", 8) < 0 ||
                     gp_json_escape_append(&q->text, type, strlen(type)) < 0 ||
                     gp_buf_append(&q->text, "\"}", 2) < 0
                 ? -1
                 : 0;
    }
    rc = evq_close(q, at, rc);
    if (rc == 0 && (strcmp(type, "end") == 0 || strcmp(type, "error") == 0))
        q->terminal = true;
    return rc;
}

int agent_evq_push_token(agent_evq *q, const char *text, size_t len, int32_t token_id)
{
    if (q->terminal)
        return -1;
    size_t at = q->text.len;
    return evq_close(q, at, agent_evq_token_json(&q->text, text, len, token_id));
}

size_t agent_evq_len(const agent_evq *q)
{
    return q->n + q->broken; /* the out-of-memory event counts, unstored */
}

bool agent_evq_broken(const agent_evq *q)
{
    return q->broken;
}

bool agent_evq_ready(const agent_evq *q)
{
    return q->inflight == 0 && q->acked < agent_evq_len(q);
}

void agent_evq_mark_output(agent_evq *q)
{
    if (q->first_output == 0)
        q->first_output = q->n;
}

unsigned agent_evq_flags(const agent_evq *q)
{
    unsigned broken = (unsigned)q->broken * AGENT_EVQ_BROKEN; /* no branch: twice a token */
    if (!agent_evq_ready(q))
        return broken;
    return broken | (q->terminal || q->acked < q->first_output
                         ? AGENT_EVQ_READY | AGENT_EVQ_URGENT
                         : AGENT_EVQ_READY);
}

/* Append the events [acked, acked + k) of a batch of k (1 <= k, acked + k
 * <= agent_evq_len), joined by commas: the stored ones in one copy, then
 * the out-of-memory event when the batch reaches it. 0 or -1 (ENOMEM; out
 * may hold part of it). */
static int evq_batch_append(const agent_evq *q, size_t k, gp_buf *out)
{
    static const char oom[] = AGENT_EVQ_OOM_EVENT;
    size_t last = q->acked + k;      /* one past the batch */
    size_t stored = last > q->n ? q->n : last;
    if (stored > q->acked) {
        size_t from = q->acked ? q->ends[q->acked - 1] : 0;
        size_t to = q->ends[stored - 1] - 1; /* without the last comma */
        if (gp_buf_append(out, q->text.data + from, to - from) < 0)
            return -1;
    }
    if (stored == last)
        return 0;
    if (stored > q->acked && gp_buf_append(out, ",", 1) < 0)
        return -1;
    return gp_buf_append(out, oom, sizeof oom - 1);
}

int agent_evq_take_append(agent_evq *q, size_t max, size_t *seq, gp_buf *out)
{
    if (!agent_evq_ready(q))
        return 0;
    size_t k = agent_evq_len(q) - q->acked;
    if (max && k > max)
        k = max;
    size_t mark = out->len;
    if (evq_batch_append(q, k, out) < 0) {
        gp_buf_truncate(out, mark);
        return -1;
    }
    q->inflight = k;
    *seq = q->acked;
    return 1;
}

json_t *agent_evq_take(agent_evq *q, size_t max, size_t *seq)
{
    gp_buf b;
    gp_buf_init(&b);
    json_t *out = NULL;
    if (agent_evq_take_append(q, max, seq, &b) > 0) {
        out = json_stringn_nocheck(b.data, b.len);
        if (!out)
            agent_evq_nack(q); /* nothing begun */
    }
    gp_buf_free(&b);
    return out;
}

void agent_evq_ack(agent_evq *q)
{
    q->acked += q->inflight;
    q->inflight = 0;
}

void agent_evq_nack(agent_evq *q)
{
    q->inflight = 0;
}

void agent_evq_rewind(agent_evq *q, size_t expected_seq)
{
    size_t n = agent_evq_len(q);
    q->acked = expected_seq > n ? n : expected_seq;
    q->inflight = 0;
}

void agent_evq_replace_rest(agent_evq *q, json_t *ev)
{
    if (q->acked > q->n) /* the out-of-memory event was acked: nothing to refuse (defensive) */
        q->acked = q->n;
    q->n = q->acked;
    gp_buf_truncate(&q->text, q->n ? q->ends[q->n - 1] : 0);
    q->inflight = 0;
    q->terminal = q->broken = false; /* a lost event was among those refused */
    agent_evq_push(q, ev); /* or, that lost too (NULL ev), the out-of-memory event */
}

bool agent_evq_done(const agent_evq *q)
{
    return q->terminal && q->inflight == 0 && q->acked == agent_evq_len(q);
}

/* ======================================================================== */
/* Timers                                                                   */
/* ======================================================================== */

void agent_timers_init(agent_timers *h)
{
    memset(h, 0, sizeof *h);
}

void agent_timers_free(agent_timers *h)
{
    for (size_t i = 0; i < h->n; i++)
        h->v[i]->pos = 0;
    free(h->v);
    memset(h, 0, sizeof *h);
}

int agent_timers_reserve(agent_timers *h, size_t n)
{
    if (n <= h->cap)
        return 0;
    size_t cap = h->cap ? h->cap : 16;
    while (cap < n)
        cap *= 2;
    agent_timer **v = realloc(h->v, cap * sizeof *v);
    if (!v)
        return -1;
    h->v = v;
    h->cap = cap;
    return 0;
}

static void timers_put(agent_timers *h, size_t i, agent_timer *t)
{
    h->v[i] = t;
    t->pos = i + 1;
}

/* Move the node at i up or down to where its `at` belongs. */
static void timers_fix(agent_timers *h, size_t i)
{
    agent_timer *t = h->v[i];
    while (i > 0 && h->v[(i - 1) / 2]->at > t->at) {
        timers_put(h, i, h->v[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1]->at < h->v[c]->at)
            c++;
        if (h->v[c]->at >= t->at)
            break;
        timers_put(h, i, h->v[c]);
        i = c;
    }
    timers_put(h, i, t);
}

int agent_timers_set(agent_timers *h, agent_timer *t, uint64_t at)
{
    t->at = at;
    if (t->pos) {
        timers_fix(h, t->pos - 1);
        return 0;
    }
    if (h->n == h->cap && agent_timers_reserve(h, h->n + 1) < 0)
        return -1;
    timers_put(h, h->n++, t);
    timers_fix(h, h->n - 1);
    return 0;
}

void agent_timers_del(agent_timers *h, agent_timer *t)
{
    if (!t->pos)
        return;
    size_t i = t->pos - 1;
    t->pos = 0;
    agent_timer *last = h->v[--h->n];
    if (last == t)
        return;
    timers_put(h, i, last);
    timers_fix(h, i);
}

agent_timer *agent_timers_first(const agent_timers *h)
{
    return h->n ? h->v[0] : NULL;
}

int agent_evq_token_json(gp_buf *out, const char *text, size_t len, int32_t token_id)
{
    static const char head[] = "{\"type\":\"token\",\"text\":\"";
    if (!gp_utf8_valid(text, len)) {
        text = "\xef\xbf\xbd";
        len = 3;
    }
    if (gp_buf_append(out, head, sizeof head - 1) < 0 || gp_json_escape_append(out, text, len) < 0)
        return -1;
    if (token_id < 0)
        return gp_buf_append(out, "\"}", 2);
    return gp_buf_append(out, "\",\"token_id\":", 13) < 0 ||
                   gp_buf_append_int(out, token_id) < 0
               ? -1
               : gp_buf_append(out, "}", 1); /* no printf per token (gguf) */
}

/* ======================================================================== */
/* Backoff                                                                  */

/* --------------------------------------------------------------- idtab --- */

void agent_idtab_init(agent_idtab *t)
{
    memset(t, 0, sizeof *t);
}

void agent_idtab_free(agent_idtab *t)
{
    free(t->b);
    agent_idtab_init(t);
}

static uint32_t idtab_hash(const char *key)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

/* Buckets for up to n nodes at a load of at most one per bucket. */
int agent_idtab_reserve(agent_idtab *t, size_t n)
{
    if (n <= t->cap)
        return 0;
    size_t cap = t->cap ? t->cap : 64;
    while (cap < n)
        cap *= 2;
    agent_idnode **b = calloc(cap, sizeof *b);
    if (!b)
        return -1;
    for (size_t i = 0; i < t->cap; i++) {
        for (agent_idnode *nd = t->b[i], *next; nd; nd = next) {
            next = nd->next;
            nd->next = b[nd->hash & (cap - 1)];
            b[nd->hash & (cap - 1)] = nd;
        }
    }
    free(t->b);
    t->b = b;
    t->cap = cap;
    return 0;
}

int agent_idtab_add(agent_idtab *t, agent_idnode *nd, const char *key)
{
    if (agent_idtab_reserve(t, t->n + 1) < 0)
        return -1;
    nd->key = key;
    nd->hash = idtab_hash(key);
    nd->next = t->b[nd->hash & (t->cap - 1)];
    t->b[nd->hash & (t->cap - 1)] = nd;
    t->n++;
    return 0;
}

agent_idnode *agent_idtab_find(const agent_idtab *t, const char *key)
{
    if (!t->cap)
        return NULL;
    uint32_t h = idtab_hash(key);
    for (agent_idnode *nd = t->b[h & (t->cap - 1)]; nd; nd = nd->next)
        if (nd->hash == h && strcmp(nd->key, key) == 0)
            return nd;
    return NULL;
}

void agent_idtab_del(agent_idtab *t, agent_idnode *nd)
{
    if (!t->cap || !nd->key)
        return;
    for (agent_idnode **pp = &t->b[nd->hash & (t->cap - 1)]; *pp; pp = &(*pp)->next) {
        if (*pp == nd) {
            *pp = nd->next;
            nd->next = NULL;
            nd->key = NULL;
            t->n--;
            return;
        }
    }
}

/* ======================================================================== */

void agent_backoff_init(agent_backoff *b, uint32_t base_ms, uint32_t cap_ms)
{
    b->base_ms = base_ms ? base_ms : 1;
    b->cap_ms = cap_ms < b->base_ms ? b->base_ms : cap_ms;
    b->attempt = 0;
}

uint32_t agent_backoff_next(agent_backoff *b, uint32_t rnd)
{
    uint64_t nominal = b->base_ms;
    for (uint32_t i = 0; i < b->attempt && nominal < b->cap_ms; i++)
        nominal *= 2;
    if (nominal > b->cap_ms)
        nominal = b->cap_ms;
    if (b->attempt < 64)
        b->attempt++;
    uint64_t half = nominal / 2;
    return (uint32_t)(nominal - half + (half ? rnd % (half + 1) : 0));
}

void agent_backoff_reset(agent_backoff *b)
{
    b->attempt = 0;
}

/* ======================================================================== */
/* Labels                                                                   */
/* ======================================================================== */

static bool label_key_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.' || c == '/';
}

json_t *agent_labels_parse(const char *s, char *err, size_t errlen)
{
    json_t *out = json_object();
    char *copy = strdup(s ? s : "");
    if (!out || !copy) {
        snprintf(err, errlen, "labels: out of memory");
        goto fail;
    }
    char *p = copy;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0')
        goto done; /* no labels */
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        /* trim */
        while (*p == ' ' || *p == '\t')
            p++;
        char *end = p + strlen(p);
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        if (*p == '\0') {
            snprintf(err, errlen, "labels: empty item (expected k=v,k2=v2)");
            goto fail;
        }
        char *eq = strchr(p, '=');
        if (!eq) {
            snprintf(err, errlen, "labels: '%.60s' is not key=value", p);
            goto fail;
        }
        *eq = '\0';
        char *k = p, *v = eq + 1;
        char *ke = eq;
        while (ke > k && (ke[-1] == ' ' || ke[-1] == '\t'))
            *--ke = '\0';
        while (*v == ' ' || *v == '\t')
            v++;
        size_t kl = strlen(k), vl = strlen(v);
        if (kl == 0 || kl > 63) {
            snprintf(err, errlen, "labels: key must be 1..63 characters ('%.60s')", k);
            goto fail;
        }
        for (size_t i = 0; i < kl; i++)
            if (!label_key_char(k[i])) {
                snprintf(err, errlen,
                         "labels: key '%.60s' may only hold letters, digits and _ - . /", k);
                goto fail;
            }
        if (vl > 255) {
            snprintf(err, errlen, "labels: value of '%s' is longer than 255 characters", k);
            goto fail;
        }
        for (size_t i = 0; i < vl; i++)
            if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) {
                snprintf(err, errlen, "labels: value of '%s' holds a control character", k);
                goto fail;
            }
        if (json_object_get(out, k)) {
            snprintf(err, errlen, "labels: key '%s' given twice", k);
            goto fail;
        }
        json_t *jv = json_stringn(v, vl);
        if (!jv) {
            snprintf(err, errlen, "labels: value of '%s' is not valid UTF-8", k);
            goto fail;
        }
        json_object_set_new(out, k, jv);
        if (!comma)
            break;
        p = comma + 1;
    }
done:
    free(copy);
    return out;
fail:
    free(copy);
    json_decref(out);
    return NULL;
}

/* ======================================================================== */
/* State dir                                                                */
/* ======================================================================== */

/* DIR/name into path. 0, or -1 with err. */
static int state_path(const char *dir, const char *name, char *path, size_t len, char *err,
                      size_t errlen)
{
    if (!dir || !*dir) {
        snprintf(err, errlen, "state-dir: must be set");
        return -1;
    }
    if ((size_t)snprintf(path, len, "%s/%s", dir, name) >= len) {
        snprintf(err, errlen, "state-dir: path too long");
        return -1;
    }
    return 0;
}

/* Read a state file of at most max bytes. 1 with *text (owned) and *value
 * (inside it, surrounding white space trimmed), 0 when the file does not
 * exist, -1 with err. *nul_inside (may be NULL) tells a file with a NUL byte. */
static int state_read(const char *path, size_t max, char **text, char **value, bool *nul_inside,
                      char *err, size_t errlen)
{
    size_t len = 0;
    *text = gp_read_file(path, &len, max);
    if (!*text) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "state-dir: cannot read '%s': %s", path, strerror(errno));
        return -1;
    }
    if (nul_inside)
        *nul_inside = strlen(*text) != len;
    char *s = *text;
    while (*s && isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    *value = s;
    return 1;
}

int agent_state_load_id(const char *dir, char out[37], char *err, size_t errlen)
{
    char path[PATH_MAX];
    char *text = NULL;
    int rc = -1;

    if (!dir || !*dir) {
        snprintf(err, errlen, "state-dir: must be set");
        return -1;
    }
    if (gp_mkdirs(dir, 0700) < 0) {
        snprintf(err, errlen, "state-dir: cannot create '%s': %s", dir, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "state-dir: '%s' is not a directory", dir);
        return -1;
    }
    if (state_path(dir, "agent_id", path, sizeof path, err, errlen) < 0)
        return -1;
    char *s = NULL;
    int got = state_read(path, 4096, &text, &s, NULL, err, errlen);
    if (got < 0)
        goto done;
    if (got == 1) {
        if (!gp_uuid_valid(s)) {
            snprintf(err, errlen,
                     "state-dir: '%s' does not hold a UUID; fix or delete it to register as a "
                     "new agent",
                     path);
            goto done;
        }
        memcpy(out, s, 36);
        out[36] = '\0';
        rc = 0;
        goto done;
    }
    gp_uuid4(out);
    char line[40];
    int n = snprintf(line, sizeof line, "%s\n", out);
    if (gp_write_file_atomic(path, line, (size_t)n, 0600) < 0) {
        snprintf(err, errlen, "state-dir: cannot write '%s': %s", path, strerror(errno));
        goto done;
    }
    rc = 0;
done:
    free(text);
    return rc;
}

/* ======================================================================== */
/* The agent's own key                                                      */
/* ======================================================================== */

bool agent_key_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > AGENT_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= 0x20 || s[i] >= 0x7f)
            return false;
    return true;
}

int agent_state_load_key(const char *dir, char **out, char *err, size_t errlen)
{
    char path[PATH_MAX];
    *out = NULL;
    if (state_path(dir, AGENT_KEY_FILE, path, sizeof path, err, errlen) < 0)
        return -1;
    char *text = NULL, *s = NULL;
    bool nul_inside = false;
    int got = state_read(path, AGENT_KEY_MAX + 64, &text, &s, &nul_inside, err, errlen);
    if (got <= 0)
        return got;
    if (nul_inside || !agent_key_valid(s)) {
        snprintf(err, errlen,
                 "state-dir: '%s' does not hold an agent key; delete it and start with "
                 "--token to enroll again",
                 path);
        free(text);
        return -1;
    }
    *out = strdup(s);
    free(text);
    if (!*out) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 1;
}

int agent_state_save_key(const char *dir, const char *key, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (state_path(dir, AGENT_KEY_FILE, path, sizeof path, err, errlen) < 0)
        return -1;
    if (!agent_key_valid(key)) {
        snprintf(err, errlen, "the server sent an agent key that is not a printable token");
        return -1;
    }
    size_t n = strlen(key);
    char *line = malloc(n + 2);
    if (!line) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(line, key, n);
    line[n] = '\n';
    int rc = gp_write_file_atomic(path, line, n + 1, 0600);
    if (rc < 0)
        snprintf(err, errlen, "state-dir: cannot write '%s': %s", path, strerror(errno));
    memset(line, 0, n + 1);
    free(line);
    return rc;
}
