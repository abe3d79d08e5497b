/*
 * sched: per-model queues, ready sets and the two policies (see sched.h and
 * docs/scheduling.md).
 *
 * Layout
 *   rings:     key -> ring. Keys are a model name ("llama3"), a model name
 *              with one label ("llama3\x1fregion=eu") or a model name with
 *              the tools mark ("llama3\x1ftools": the agents whose facts say
 *              supports_tools for it; no '=', so no label collides with it).
 *              A ring is a circular
 *              doubly-linked list of `member`s (one per ready agent serving
 *              that key) and a cursor: the next agent round_robin tries.
 *   sagent:    per-agent state (hung on registry_agent.sched_priv): free
 *              slots of its parked long-poll, its members (built once per
 *              registry models_gen), whether they are linked.
 *   queues:    requested name -> two intrusive FIFOs (interactive, batch).
 *   affinity:  session -> (agent_id, expiry), plus a list in expiry order
 *              so expiry is amortised O(1).
 */
#include "server/fleet/sched.h"

#include <stdlib.h>
#include <string.h>

#include "server/fleet/gps_strmap.h"
#include "server/fleet/prefix_index.h"

/* Separator between a model name and a label in a ring key: a byte that
 * cannot appear in JSON-sourced names without escaping, so no collision with
 * a real model called "a=b". */
#define KEY_SEP '\x1f'
#define MAX_MEMBERS 4096

typedef struct ring ring;
typedef struct sagent sagent;

typedef struct member {
    struct member *prev, *next;   /* circular, valid while linked */
    ring *ring;
    sagent *sa;
} member;

struct ring {
    member *cursor;               /* next candidate; NULL when empty */
    size_t n;
};

struct sagent {
    registry_agent *a;
    int free;                     /* free slots of the parked poll */
    bool parked;
    bool linked;                  /* members are in their rings */
    bool built;
    uint32_t gen;                 /* registry models_gen the members match */
    member *members;
    size_t n_members;
    pidx_owner po;                /* its slots' advertised prefixes */
    uint32_t prefix_gen;          /* registry prefix_gen po matches */
    bool prefix_indexed;
    sagent *prev, *next;          /* all sagents (for destroy) */
};

typedef struct sched_queue {
    sched_job *head[SCHED_PRIORITY_COUNT], *tail[SCHED_PRIORITY_COUNT];
    size_t depth[SCHED_PRIORITY_COUNT];
    double wait_ewma_ms;          /* recent queue waits, 0 = unknown */
} sched_queue;

typedef struct aff {
    char agent_id[37];
    uint64_t expiry_ms;
    const char *key;              /* the map node's key */
    struct aff *prev, *next;      /* expiry order */
} aff;

struct sched {
    registry *reg;
    sched_config cfg;
    smap rings;
    smap queues;
    smap affinity;
    pidx *prefixes;
    aff *aff_head, *aff_tail;
    sagent *agents;
    int64_t seq_back, seq_front;  /* queue order counters */
    size_t queued;
};

/* ============================================================= config */

void sched_config_default(sched_config *c)
{
    memset(c, 0, sizeof(*c));
    c->policy = SCHED_ROUND_ROBIN;
    c->max_queue = 1000;
    c->w_load = 1.0;
    c->w_active = 1.0;
    c->w_speed = 1.0;
    c->w_reliability = 1.0;
    c->w_affinity = 2.0;
    c->weighted_sample = 16;
    c->affinity_ttl_ms = 300000;
    c->prefer_strict = false;
    c->prefix_routing = true;
}

int sched_policy_parse(const char *s, sched_policy *out)
{
    if (s && strcmp(s, "round_robin") == 0)
        *out = SCHED_ROUND_ROBIN;
    else if (s && strcmp(s, "weighted") == 0)
        *out = SCHED_WEIGHTED;
    else
        return -1;
    return 0;
}

int sched_priority_parse(const char *s, sched_priority *out)
{
    if (s && strcmp(s, "interactive") == 0)
        *out = SCHED_INTERACTIVE;
    else if (s && strcmp(s, "batch") == 0)
        *out = SCHED_BATCH;
    else
        return -1;
    return 0;
}

const char *sched_result_name(sched_result r)
{
    switch (r) {
    case SCHED_ASSIGNED: return "assigned";
    case SCHED_QUEUED: return "queued";
    case SCHED_QUEUE_FULL: return "queue_full";
    case SCHED_NO_AGENT: return "no_agent";
    case SCHED_ERROR: return "error";
    }
    return "unknown";
}

sched *sched_create(registry *reg, const sched_config *cfg)
{
    sched *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->reg = reg;
    if (cfg)
        s->cfg = *cfg;
    else
        sched_config_default(&s->cfg);
    if (s->cfg.weighted_sample == 0)
        s->cfg.weighted_sample = 1;
    if (!(s->prefixes = pidx_create())) {
        free(s);
        return NULL;
    }
    return s;
}

/* ============================================================== rings */

static void ring_insert(member *m)
{
    ring *r = m->ring;
    if (!r->cursor) {
        m->prev = m->next = m;
        r->cursor = m;
    } else {
        /* Just before the cursor: the newcomer is tried last in this
         * rotation, which keeps round_robin order stable when agents leave
         * and come back after every job. */
        member *c = r->cursor;
        m->next = c;
        m->prev = c->prev;
        c->prev->next = m;
        c->prev = m;
    }
    r->n++;
}

static void ring_remove(member *m)
{
    ring *r = m->ring;
    if (r->n == 1) {
        r->cursor = NULL;
    } else {
        if (r->cursor == m)
            r->cursor = m->next;
        m->prev->next = m->next;
        m->next->prev = m->prev;
    }
    m->prev = m->next = NULL;
    r->n--;
}

static ring *ring_get(sched *s, const char *key, bool create)
{
    ring *r = smap_get(&s->rings, key);
    if (r || !create)
        return r;
    r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    if (!smap_put(&s->rings, key, r)) {
        free(r);
        return NULL;
    }
    return r;
}

/* Ring key for (name, label): "name\x1fkey=value" written into buf (cap
 * KEY_MAX). NULL when it does not fit: agents' names and labels are at most
 * 256 bytes each (registry_facts_parse), so such a key names no ring. */
#define KEY_MAX 1024
static const char *label_key(char *buf, const char *name, const char *k, const char *v)
{
    size_t ln = strlen(name), lk = strlen(k), lv = strlen(v);
    if (ln + lk + lv + 3 > KEY_MAX)
        return NULL;
    memcpy(buf, name, ln);
    buf[ln] = KEY_SEP;
    memcpy(buf + ln + 1, k, lk);
    buf[ln + 1 + lk] = '=';
    memcpy(buf + ln + 2 + lk, v, lv + 1);
    return buf;
}

/* Ring key of the tool-taking agents of name: "name\x1ftools" in buf (cap
 * KEY_MAX), or NULL when it does not fit. */
static const char *tools_key(char *buf, const char *name)
{
    size_t ln = strlen(name);
    if (ln + sizeof("tools") + 1 > KEY_MAX)
        return NULL;
    memcpy(buf, name, ln);
    buf[ln] = KEY_SEP;
    memcpy(buf + ln + 1, "tools", sizeof("tools"));
    return buf;
}

/* ========================================================== sagents */

static void sa_link(sagent *sa)
{
    if (sa->linked)
        return;
    for (size_t i = 0; i < sa->n_members; i++)
        ring_insert(&sa->members[i]);
    sa->linked = true;
}

static void sa_unlink(sagent *sa)
{
    if (!sa->linked)
        return;
    for (size_t i = 0; i < sa->n_members; i++)
        ring_remove(&sa->members[i]);
    sa->linked = false;
}

static int add_member(sched *s, sagent *sa, smap *seen, const char *key)
{
    if (smap_get(seen, key) || sa->n_members >= MAX_MEMBERS)
        return 0;             /* one membership per ring per agent */
    if (!smap_put(seen, key, sa))
        return -1;
    ring *r = ring_get(s, key, true);
    if (!r)
        return -1;
    member *m = &sa->members[sa->n_members++];
    memset(m, 0, sizeof(*m));
    m->ring = r;
    m->sa = sa;
    return 0;
}

static int add_name(sched *s, sagent *sa, smap *seen, const char *name, bool tools)
{
    if (add_member(s, sa, seen, name) < 0)
        return -1;
    const registry_agent *a = sa->a;
    char buf[KEY_MAX];
    if (tools) {
        const char *k = tools_key(buf, name);
        if (k && add_member(s, sa, seen, k) < 0)
            return -1;
    }
    for (size_t i = 0; i < a->n_labels; i++) {
        const char *k = label_key(buf, name, a->labels[i].key, a->labels[i].value);
        if (k && add_member(s, sa, seen, k) < 0)
            return -1;
    }
    return 0;
}

/* (Re)build the memberships from the agent's models, their supports_tools
 * and labels. Must be unlinked. */
static int sa_build(sched *s, sagent *sa)
{
    const registry_agent *a = sa->a;
    size_t names = 0;
    for (size_t i = 0; i < a->n_models; i++)
        names += 1 + a->models[i].n_aliases;
    size_t want = names * (2 + a->n_labels);
    if (want > MAX_MEMBERS)
        want = MAX_MEMBERS;
    free(sa->members);
    sa->members = NULL;
    sa->n_members = 0;
    sa->built = false;
    if (want) {
        sa->members = calloc(want, sizeof(member));
        if (!sa->members)
            return -1;
    }
    smap seen = {0};
    int rc = 0;
    for (size_t i = 0; i < a->n_models && rc == 0; i++) {
        bool tools = a->models[i].supports_tools;
        rc = add_name(s, sa, &seen, a->models[i].id, tools);
        for (size_t j = 0; j < a->models[i].n_aliases && rc == 0; j++)
            rc = add_name(s, sa, &seen, a->models[i].aliases[j], tools);
    }
    smap_free(&seen, NULL);
    if (rc < 0) {
        free(sa->members);
        sa->members = NULL;
        sa->n_members = 0;
        return -1;
    }
    sa->gen = a->models_gen;
    sa->built = true;
    return 0;
}

static sagent *sa_get(sched *s, registry_agent *a, bool create)
{
    sagent *sa = a->sched_priv;
    if (sa || !create)
        return sa;
    sa = calloc(1, sizeof(*sa));
    if (!sa)
        return NULL;
    sa->a = a;
    sa->next = s->agents;
    if (s->agents)
        s->agents->prev = sa;
    s->agents = sa;
    a->sched_priv = sa;
    return sa;
}

/* Bring ring membership in line with: parked, free > 0, HEALTHY; and the
 * prefix index with the agent's last prefix_cache report. */
static int sa_sync(sched *s, sagent *sa)
{
    if (!sa->prefix_indexed || sa->prefix_gen != sa->a->prefix_gen) {
        sa->prefix_gen = sa->a->prefix_gen;
        sa->prefix_indexed = true;
        if (pidx_owner_set(s->prefixes, &sa->po, sa, &sa->a->prefix) < 0)
            return -1;
    }
    if (!sa->built || sa->gen != sa->a->models_gen) {
        sa_unlink(sa);
        if (sa_build(s, sa) < 0)
            return -1;
    }
    bool want = sa->parked && sa->free > 0 && sa->a->state == REGISTRY_HEALTHY;
    if (want)
        sa_link(sa);
    else
        sa_unlink(sa);
    return 0;
}

int sched_agent_ready(sched *s, registry_agent *a, int free_slots)
{
    sagent *sa = sa_get(s, a, true);
    if (!sa)
        return -1;
    sa->free = free_slots > 0 ? free_slots : 0;
    sa->parked = sa->free > 0;
    return sa_sync(s, sa);
}

void sched_agent_unready(sched *s, registry_agent *a)
{
    sagent *sa = sa_get(s, a, false);
    if (!sa)
        return;
    sa->parked = false;
    sa->free = 0;
    sa_unlink(sa);
}

int sched_agent_update(sched *s, registry_agent *a)
{
    sagent *sa = sa_get(s, a, false);
    return sa ? sa_sync(s, sa) : 0;
}

void sched_agent_forget(sched *s, registry_agent *a)
{
    sagent *sa = sa_get(s, a, false);
    if (!sa)
        return;
    sa_unlink(sa);
    if (sa->prev)
        sa->prev->next = sa->next;
    else
        s->agents = sa->next;
    if (sa->next)
        sa->next->prev = sa->prev;
    pidx_owner_clear(s->prefixes, &sa->po);
    free(sa->members);
    free(sa);
    a->sched_priv = NULL;
}

size_t sched_prefix_entries(const sched *s)
{
    return s->cfg.prefix_routing ? pidx_size(s->prefixes) : 0;
}

int sched_agent_free_slots(const sched *s, const registry_agent *a)
{
    const sagent *sa = a->sched_priv;
    return sa && sa->parked ? sa->free : 0;
}

bool sched_agent_is_ready(const sched *s, const registry_agent *a)
{
    const sagent *sa = a->sched_priv;
    return sa && sa->linked;
}

/* ========================================================== affinity */

static void aff_unlink(sched *s, aff *f)
{
    if (f->prev)
        f->prev->next = f->next;
    else
        s->aff_head = f->next;
    if (f->next)
        f->next->prev = f->prev;
    else
        s->aff_tail = f->prev;
    f->prev = f->next = NULL;
}

static void aff_append(sched *s, aff *f)
{
    f->prev = s->aff_tail;
    f->next = NULL;
    if (s->aff_tail)
        s->aff_tail->next = f;
    else
        s->aff_head = f;
    s->aff_tail = f;
}

static void aff_drop(sched *s, aff *f)
{
    aff_unlink(s, f);
    smap_del(&s->affinity, f->key);   /* frees the key too */
    free(f);
}

/* Remember session -> agent for affinity_ttl from now. Best effort: on
 * ENOMEM the session simply has no affinity. */
static void aff_set(sched *s, const char *session, const char *agent_id, uint64_t now)
{
    aff *f = smap_get(&s->affinity, session);
    if (!f) {
        f = calloc(1, sizeof(*f));
        if (!f)
            return;
        smap_node *n = smap_put(&s->affinity, session, f);
        if (!n) {
            free(f);
            return;
        }
        f->key = n->key;
    } else {
        aff_unlink(s, f);
    }
    memcpy(f->agent_id, agent_id, sizeof(f->agent_id));
    f->expiry_ms = now + s->cfg.affinity_ttl_ms;
    /* TTL is constant and time does not go back, so appending keeps the
     * list in expiry order. */
    aff_append(s, f);
}

const char *sched_affinity_get(sched *s, const char *session, uint64_t now_ms)
{
    if (!session)
        return NULL;
    aff *f = smap_get(&s->affinity, session);
    if (!f)
        return NULL;
    if (now_ms >= f->expiry_ms) {
        aff_drop(s, f);
        return NULL;
    }
    return f->agent_id;
}

void sched_tick(sched *s, uint64_t now_ms)
{
    while (s->aff_head && now_ms >= s->aff_head->expiry_ms)
        aff_drop(s, s->aff_head);
}

/* ========================================================== matching */

static bool labels_match(const registry_agent *a, const sched_job *j)
{
    for (size_t i = 0; i < j->n_labels; i++) {
        const char *v = registry_agent_label(a, j->labels[i].key);
        if (!v || strcmp(v, j->labels[i].value) != 0)
            return false;
    }
    return true;
}

static bool job_strict(const sched *s, const sched_job *j)
{
    return j->prefer_agent && (j->prefer_strict < 0 ? s->cfg.prefer_strict : j->prefer_strict > 0);
}

/* Could agent a take job j (ignoring readiness)? A job without tools pays
 * one flag test for the tools constraint. */
static bool agent_fits(const sched *s, const registry_agent *a, const sched_job *j)
{
    if (j->exclude_agent && strcmp(j->exclude_agent, a->id) == 0)
        return false;
    if (j->needs_tools && !registry_agent_takes_tools(a, j->model))
        return false;
    if (j->needs_embeddings && !registry_agent_takes_embeddings(a, j->model))
        return false;
    if (j->needs_generation && !registry_agent_generates(a, j->model))
        return false;
    if (job_strict(s, j) && strcmp(j->prefer_agent, a->id) != 0)
        return false;
    return labels_match(a, j);
}

bool sched_agent_fits(const sched *s, const registry_agent *a, const sched_job *job)
{
    return a->state == REGISTRY_HEALTHY && registry_agent_serves(a, job->model) &&
           agent_fits(s, a, job);
}

/* Ready and usable right now. An agent that left HEALTHY without the core
 * calling sched_agent_update is dropped from the rings here (lazily). */
static bool sa_usable(sched *s, sagent *sa)
{
    if (sa->a->state != REGISTRY_HEALTHY) {
        sa_unlink(sa);
        return false;
    }
    return sa->linked && sa->free > 0;
}

double sched_agent_score(const sched *s, const registry_agent *a, double best_tps,
                         bool affinity, uint64_t now_ms)
{
    const sched_config *c = &s->cfg;
    int total = a->slots_total > 0 ? a->slots_total : 1;
    int busy = a->active > a->slots_busy ? a->active : a->slots_busy;
    double load = (double)busy / total;
    if (load > 1.0)
        load = 1.0;
    double speed = best_tps > 0 ? a->tokens_per_sec / best_tps : 0.0;
    if (speed > 1.0)
        speed = 1.0;
    double score = c->w_load * (1.0 - load) + c->w_active / (a->active + 1.0) +
                   c->w_speed * speed + c->w_reliability * registry_agent_reliability(a) +
                   c->w_affinity * (affinity ? 1.0 : 0.0);
    return registry_agent_weight(s->reg, a, now_ms) * score;
}

/* Ring to search for job j: the model's, or for a job with labels or tools
 * the smallest of its (model, label) and (model, tools) rings (every
 * candidate there meets that constraint; the others are checked per
 * candidate). NULL = nobody ready. */
static ring *job_ring(sched *s, const sched_job *j)
{
    if (j->n_labels == 0 && !j->needs_tools)
        return ring_get(s, j->model, false);
    ring *best = NULL;
    char buf[KEY_MAX];
    if (j->needs_tools) {
        const char *k = tools_key(buf, j->model);
        best = k ? ring_get(s, k, false) : NULL;
        if (!best || !best->n)
            return NULL;
    }
    for (size_t i = 0; i < j->n_labels; i++) {
        const char *k = label_key(buf, j->model, j->labels[i].key, j->labels[i].value);
        ring *r = k ? ring_get(s, k, false) : NULL;
        if (!r || !r->n)
            return NULL;
        if (!best || r->n < best->n)
            best = r;
    }
    return best;
}

/* Direct pick of a specific agent if ready, serving the model and fitting. */
static sagent *pick_agent(sched *s, registry_agent *a, const sched_job *j)
{
    if (!a || !a->sched_priv)
        return NULL;
    sagent *sa = a->sched_priv;
    if (!sa_usable(s, sa) || !registry_agent_serves(a, j->model) || !agent_fits(s, a, j))
        return NULL;
    return sa;
}

static sagent *pick_round_robin(sched *s, ring *r, const sched_job *j)
{
    size_t budget = r->n;
    member *m = r->cursor;
    while (m && budget--) {
        member *next = m->next;
        sagent *sa = m->sa;
        bool ok = sa_usable(s, sa) && agent_fits(s, sa->a, j);
        if (ok) {
            r->cursor = m->next;   /* the ring may have changed: m is still in it */
            return sa;
        }
        if (!r->cursor)
            break;                 /* the ring emptied (lazy drops) */
        m = (next && next->prev) ? next : r->cursor;
    }
    return NULL;
}

static sagent *pick_weighted(sched *s, ring *r, const sched_job *j, uint64_t now)
{
    size_t k = s->cfg.weighted_sample, budget = r->n, nc = 0;
    sagent *cand[64];
    if (k > 64)
        k = 64;
    member *m = r->cursor;
    while (m && budget-- && nc < k) {
        member *next = m->next;
        sagent *sa = m->sa;
        if (sa_usable(s, sa) && agent_fits(s, sa->a, j))
            cand[nc++] = sa;
        if (!r->cursor)
            break;
        m = (next && next->prev) ? next : r->cursor;
    }
    if (!nc)
        return NULL;
    double best_tps = 0;
    for (size_t i = 0; i < nc; i++)
        if (cand[i]->a->tokens_per_sec > best_tps)
            best_tps = cand[i]->a->tokens_per_sec;
    size_t bi = 0;
    double bs = -1.0;
    for (size_t i = 0; i < nc; i++) {
        double sc = sched_agent_score(s, cand[i]->a, best_tps, false, now);
        if (sc > bs) {   /* ties: the earliest in rotation order */
            bs = sc;
            bi = i;
        }
    }
    /* Rotate the starting point so equal scores share the work. */
    if (r->cursor)
        r->cursor = r->cursor->next;
    return cand[bi];
}

static void assign(sched *s, sagent *sa, sched_job *j, uint64_t now)
{
    j->agent = sa->a;
    registry_job_begin(s->reg, sa->a);
    if (j->session)
        aff_set(s, j->session, sa->a->id, now);
    if (--sa->free <= 0) {
        sa->free = 0;
        sa_unlink(sa);
    }
}

typedef struct prefix_ctx {
    sched *s;
    const sched_job *j;
} prefix_ctx;

static bool prefix_accept(void *ctx, void *ud)
{
    prefix_ctx *c = ctx;
    sagent *sa = ud;
    return sa_usable(c->s, sa) && registry_agent_serves(sa->a, c->j->model) &&
           agent_fits(c->s, sa->a, c->j);
}

static sagent *choose(sched *s, sched_job *j, uint64_t now)
{
    sagent *sa;
    if (j->prefer_agent && (sa = pick_agent(s, registry_get(s->reg, j->prefer_agent), j)))
        return sa;
    if (job_strict(s, j))
        return NULL;
    /* The agent whose slot already holds the longest part of this prompt
     * skips that much prefill (a conversation's next turn): before
     * affinity and policy, which only guess where it went last. */
    if (s->cfg.prefix_routing && j->prefix) {
        prefix_ctx c = {s, j};
        void *ud;
        long n = pidx_route(s->prefixes, j->prefix, prefix_accept, &c, &ud);
        if (n > 0) {
            j->prefix_units = n;
            return ud;
        }
    }
    if (s->cfg.policy == SCHED_WEIGHTED && j->session) {
        const char *id = sched_affinity_get(s, j->session, now);
        if (id && (sa = pick_agent(s, registry_get(s->reg, id), j)))
            return sa;
    }
    ring *r = job_ring(s, j);
    if (!r || !r->n)
        return NULL;
    return s->cfg.policy == SCHED_WEIGHTED ? pick_weighted(s, r, j, now)
                                           : pick_round_robin(s, r, j);
}

/* ============================================================ queues */

static sched_queue *queue_get(sched *s, const char *model, bool create)
{
    sched_queue *q = smap_get(&s->queues, model);
    if (q || !create)
        return q;
    q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    if (!smap_put(&s->queues, model, q)) {
        free(q);
        return NULL;
    }
    return q;
}

static void queue_push(sched *s, sched_queue *q, sched_job *j)
{
    int p = j->priority;
    j->queue = q;
    if (j->front) {
        j->qseq = --s->seq_front;
        j->qprev = NULL;
        j->qnext = q->head[p];
        if (q->head[p])
            q->head[p]->qprev = j;
        else
            q->tail[p] = j;
        q->head[p] = j;
    } else {
        j->qseq = ++s->seq_back;
        j->qnext = NULL;
        j->qprev = q->tail[p];
        if (q->tail[p])
            q->tail[p]->qnext = j;
        else
            q->head[p] = j;
        q->tail[p] = j;
    }
    q->depth[p]++;
    s->queued++;
}

static void queue_unlink(sched *s, sched_job *j)
{
    sched_queue *q = j->queue;
    int p = j->priority;
    if (j->qprev)
        j->qprev->qnext = j->qnext;
    else
        q->head[p] = j->qnext;
    if (j->qnext)
        j->qnext->qprev = j->qprev;
    else
        q->tail[p] = j->qprev;
    j->qprev = j->qnext = NULL;
    j->queue = NULL;
    q->depth[p]--;
    s->queued--;
}

sched_result sched_submit(sched *s, sched_job *j, uint64_t now_ms, registry_agent **agent_out)
{
    if (agent_out)
        *agent_out = NULL;
    if (!j || !j->model || j->queue)
        return SCHED_ERROR;
    if ((unsigned)j->priority >= SCHED_PRIORITY_COUNT)
        j->priority = SCHED_BATCH;
    j->agent = NULL;
    j->prefix_units = 0;
    if (registry_model_live_count(s->reg, j->model) == 0)
        return SCHED_NO_AGENT;
    /* The dialects drop tools when no agent takes them; this catches the
     * agent that went away since, and fallback models without one. */
    if (j->needs_tools && registry_model_tools_count(s->reg, j->model) == 0)
        return SCHED_NO_AGENT;
    if (job_strict(s, j)) {
        const registry_agent *pa = registry_get(s->reg, j->prefer_agent);
        if (!pa || !registry_agent_serves(pa, j->model) ||
            (j->needs_tools && !registry_agent_takes_tools(pa, j->model)) ||
            (j->needs_embeddings && !registry_agent_takes_embeddings(pa, j->model)) ||
            (j->needs_generation && !registry_agent_generates(pa, j->model)) ||
            (pa->state != REGISTRY_HEALTHY && pa->state != REGISTRY_SUSPECT &&
             pa->state != REGISTRY_REGISTERING))
            return SCHED_NO_AGENT;
    }
    sagent *sa = choose(s, j, now_ms);
    if (sa) {
        assign(s, sa, j, now_ms);
        if (agent_out)
            *agent_out = sa->a;
        return SCHED_ASSIGNED;
    }
    sched_queue *q = queue_get(s, j->model, true);
    if (!q)
        return SCHED_ERROR;
    if (q->depth[0] + q->depth[1] >= s->cfg.max_queue)
        return SCHED_QUEUE_FULL;
    j->enqueue_ms = now_ms;
    queue_push(s, q, j);
    return SCHED_QUEUED;
}

bool sched_remove(sched *s, sched_job *j)
{
    if (!j || !j->queue)
        return false;
    queue_unlink(s, j);
    return true;
}

bool sched_job_queued(const sched_job *j)
{
    return j && j->queue != NULL;
}

sched_job *sched_queue_first(const sched *s, const char *model, sched_priority p)
{
    const sched_queue *q = model ? smap_get(&s->queues, model) : NULL;
    return q && (unsigned)p < SCHED_PRIORITY_COUNT ? q->head[p] : NULL;
}

sched_job *sched_queue_next(const sched_job *j)
{
    return j && j->queue ? j->qnext : NULL;
}

/* First job of list that agent a may take. */
static sched_job *first_fit(const sched *s, sched_job *head, const registry_agent *a)
{
    for (sched_job *j = head; j; j = j->qnext)
        if (agent_fits(s, a, j))
            return j;
    return NULL;
}

size_t sched_dispatch(sched *s, registry_agent *a, sched_job **out, size_t max, uint64_t now_ms)
{
    sagent *sa = a ? a->sched_priv : NULL;
    if (!sa || !sa->parked || sa->free <= 0 || a->state != REGISTRY_HEALTHY || !s->queued)
        return 0;
    size_t n = 0;
    while (n < max && sa->free > 0) {
        sched_job *best = NULL;
        for (int p = 0; p < SCHED_PRIORITY_COUNT && !best; p++) {
            for (size_t i = 0; i < a->n_models; i++) {
                const registry_model_info *m = &a->models[i];
                for (size_t k = 0; k <= m->n_aliases; k++) {
                    const char *name = k == 0 ? m->id : m->aliases[k - 1];
                    sched_queue *q = smap_get(&s->queues, name);
                    if (!q || !q->head[p])
                        continue;
                    sched_job *j = first_fit(s, q->head[p], a);
                    if (j && (!best || j->qseq < best->qseq))
                        best = j;
                }
            }
        }
        if (!best)
            break;
        sched_queue *q = best->queue;
        double w = (double)(now_ms >= best->enqueue_ms ? now_ms - best->enqueue_ms : 0);
        q->wait_ewma_ms = q->wait_ewma_ms > 0 ? 0.8 * q->wait_ewma_ms + 0.2 * w : (w > 0 ? w : 0);
        queue_unlink(s, best);
        assign(s, sa, best, now_ms);
        out[n++] = best;
    }
    return n;
}

/* ========================================================= inspection */

size_t sched_queue_depth(const sched *s, const char *model, sched_priority p)
{
    const sched_queue *q = model ? smap_get(&s->queues, model) : NULL;
    return q && (unsigned)p < SCHED_PRIORITY_COUNT ? q->depth[p] : 0;
}

size_t sched_queued_total(const sched *s)
{
    return s->queued;
}

void sched_foreach_queue(const sched *s,
                         void (*fn)(void *ud, const char *model, size_t interactive, size_t batch),
                         void *ud)
{
    size_t i;
    for (smap_node *n = smap_first(&s->queues, &i); n; n = smap_next(&s->queues, n, &i)) {
        const sched_queue *q = n->val;
        fn(ud, n->key, q->depth[SCHED_INTERACTIVE], q->depth[SCHED_BATCH]);
    }
}

uint64_t sched_estimated_wait_ms(const sched *s, const char *model)
{
    const sched_queue *q = model ? smap_get(&s->queues, model) : NULL;
    return q ? (uint64_t)(q->wait_ewma_ms + 0.5) : 0;
}

/* ============================================================ destroy */

static void aff_free_cb(void *v)
{
    free(v);
}

void sched_destroy(sched *s)
{
    if (!s)
        return;
    sagent *sa = s->agents;
    while (sa) {
        sagent *next = sa->next;
        sa->a->sched_priv = NULL;
        pidx_owner_clear(s->prefixes, &sa->po);
        free(sa->members);
        free(sa);
        sa = next;
    }
    pidx_destroy(s->prefixes);
    smap_free(&s->rings, free);
    /* Queued jobs belong to the core; just detach them. */
    size_t i;
    for (smap_node *n = smap_first(&s->queues, &i); n; n = smap_next(&s->queues, n, &i)) {
        sched_queue *q = n->val;
        for (int p = 0; p < SCHED_PRIORITY_COUNT; p++)
            for (sched_job *j = q->head[p]; j; j = j->qnext)
                j->queue = NULL;
    }
    smap_free(&s->queues, free);
    smap_free(&s->affinity, aff_free_cb);
    free(s);
}
