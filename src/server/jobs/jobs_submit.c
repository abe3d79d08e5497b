/* jobs_submit: a new job, from its key's limits to the queue (see jobs.h). */
#include "server/jobs/jobs.h"
#include "server/jobs/jobs_internal.h"
#include "server/jobs/jobs_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_count.h"
#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/auth/limits.h"
#include "server/http/ids.h"
#include "server/metrics.h"

/* The most tokens a new job may spend: its prompt (the documented
 * estimate, common/gp_count.h) plus max_tokens. A count_tokens job spends
 * none. */
static long long job_token_reserve(const gps_job_spec *spec)
{
    if (spec->kind == GPS_JOB_COUNT_TOKENS)
        return 0;
    long long n = spec->max_tokens > 0 ? spec->max_tokens : 0;
    json_t *w = json_object();
    if (w) {
        if (spec->prompt)
            json_object_set_new(w, "prompt", json_string(spec->prompt));
        if (spec->messages)
            json_object_set(w, "messages", spec->messages);
        if (spec->input)
            json_object_set(w, "input", spec->input);
        long long p = gp_count_estimate(w);
        json_decref(w);
        n += p > 0 ? p : 0;
    }
    return n;
}

/* A job's prompt-prefix tenant (gps_job.tenant): one per key, narrowed by
 * a downstream pool's tag (sub); "" when every request shares the cache
 * (scope pool, or no key and no sub: home mode is one tenant). Keyed with
 * a secret so an agent can neither read the key id out of the tag nor
 * forge another key's tag; a new process has a new secret (the agents'
 * caches then miss once per conversation). */
static void tenant_of(gps_jobs *j, const char *key_id, const char *sub, char out[33])
{
    out[0] = '\0';
    if (j->opts.prefix_cache_pool || (!key_id[0] && !(sub && *sub)))
        return;
    size_t kl = strlen(key_id), sl = sub ? strlen(sub) : 0;
    char *msg = malloc(kl + sl + 2);
    if (!msg) {
        /* never fall back to the shared tenant: a tag no one else has */
        gp_random_hex(out, 16);
        return;
    }
    memcpy(msg, key_id, kl);
    msg[kl] = '\n';
    memcpy(msg + kl + 1, sub ? sub : "", sl + 1);
    char h[65];
    gp_hmac_sha256_hex(j->tenant_secret, sizeof j->tenant_secret, msg, kl + 1 + sl, h);
    free(msg);
    memcpy(out, h, 32);
    out[32] = '\0';
}

/* The job's prompt chain (gp_prefix.h), computed as an agent computes it
 * from the wire JSON, for the scheduler's prefix routing; only while some
 * agent advertises a prefix (the hashing costs a pass over the prompt). */
static void set_prefix_chain(gps_jobs *j, gps_job *job)
{
    if (job->spec.kind == GPS_JOB_COUNT_TOKENS || job->spec.kind == GPS_JOB_EMBED ||
        sched_prefix_entries(j->sched) == 0)
        return;
    json_t *w = json_object();
    if (!w)
        return;
    if (job->spec.prompt)
        json_object_set_new(w, "prompt", json_string(job->spec.prompt));
    if (job->spec.messages)
        json_object_set(w, "messages", job->spec.messages);
    if (job->spec.tools)
        json_object_set(w, "tools", job->spec.tools);
    if (job->spec.tool_choice)
        json_object_set(w, "tool_choice", job->spec.tool_choice);
    if (job->tenant[0])
        json_object_set_new(w, "tenant", json_string(job->tenant));
    if (gp_prefix_chain_of_job(w, &job->prefix_chain) == 0 && job->prefix_chain.units > 0)
        job->sj.prefix = &job->prefix_chain;
    json_decref(w);
}

static void log_submitted(gps_jobs *j, const gps_job *job, bool held)
{
    if (!gp_log_enabled(GP_LOG_DEBUG))
        return;
    json_t *f = jobs_log_fields(&j->log_submitted);
    bool ok = f && jobs_lf_str(f, "job_id", job->id) && jobs_lf_str(f, "model", job->spec.model) &&
              jobs_lf_str(f, "kind", gps_job_kind_name(job->spec.kind)) &&
              jobs_lf_str(f, "api", job->spec.api ? job->spec.api : "") &&
              jobs_lf_str(f, "priority",
                          job->spec.priority == GPS_PRIO_BATCH ? "batch" : "interactive") &&
              jobs_lf_bool(f, "held", held);
    /* The affinity key (x_pool_options.session, else user): which
     * conversation a job belongs to, for an operator reading the log. */
    const char *session = job->spec.session ? job->spec.session : job->spec.user;
    if (ok && session && !jobs_lf_str(f, "session", session))
        json_object_del(f, "session"); /* (json_string refused it: the key left out) */
    else if (ok && !session)
        json_object_del(f, "session");
    gp_log_write(GP_LOG_DEBUG, "job_submitted", job->correlation_id, jobs_log_fields_ref(f, ok),
                 held ? "job submitted; waiting for a slot of its key (max_concurrent)"
                      : "job submitted");
}

/* The job's key is at its max_concurrent: keep the job QUEUED outside the
 * scheduler until one of the key's jobs ends (release_held). */
static gps_job *submit_held(gps_jobs *j, gps_job *job)
{
    jobs_table_insert(j, job);
    j->n_live++;
    job->state = GPS_JOB_QUEUED;
    job->held = true;
    gps_limits_waiting_add(j->limits, job->key_id, 1);
    if (job->spec.resume_id)
        jobs_persist(j, job);
    else
        jobs_persist_insert(j, job);
    log_submitted(j, job, true);
    return job;
}

/* Of the live agents serving a model: how many, and how many report it
 * embeddings_only (an encoder). */
typedef struct gen_probe {
    const char *model;
    int serving, encoders;
} gen_probe;

static void gen_probe_cb(void *ud, registry_agent *a)
{
    gen_probe *p = ud;
    if (a->state != REGISTRY_HEALTHY && a->state != REGISTRY_SUSPECT)
        return;
    for (size_t i = 0; i < a->n_models; i++)
        if (registry_model_info_named(&a->models[i], p->model)) {
            p->serving++;
            p->encoders += a->models[i].embeddings_only;
            return;
        }
}

/* A text-generation job (chat, completion, count_tokens aside) for a model
 * that only encoder agents serve can never run: a 400 naming the model,
 * rather than a job an agent would refuse. */
static bool refuse_generation(gps_jobs *j, const gps_job_spec *spec, gps_submit_err *err)
{
    if (spec->kind != GPS_JOB_CHAT && spec->kind != GPS_JOB_COMPLETION)
        return false;
    gen_probe p = { .model = spec->model };
    if (spec->model)
        registry_foreach(j->reg, gen_probe_cb, &p);
    if (p.serving == 0 || p.encoders < p.serving)
        return false;
    err->status = 400;
    err->code = "INVALID_REQUEST";
    snprintf(err->message, sizeof err->message,
             "model '%.100s' is an embeddings model (encoder only): it does not generate "
             "text; use it with /v1/embeddings", spec->model);
    return true;
}

/* May a job no agent here can take (or, queued, that waits in this
 * server's queue) go to another server? Native tasks have their own claim
 * across servers (api_tasks_shared.c), a proxy runs where it was claimed, and a
 * resumed job's row exists already. */
static bool may_go_elsewhere(gps_jobs *j, const gps_job *job)
{
    return j->handoff.can_offer && j->handoff.offer && !job->spec.handoff_proxy &&
           !job->spec.resume_id && !(job->spec.api && strcmp(job->spec.api, "native") == 0);
}

bool jobs_offerable(gps_jobs *j, const gps_job *job, bool queued)
{
    if (!may_go_elsewhere(j, job))
        return false;
    if (queued && j->handoff.can_offer_queued)
        return j->handoff.can_offer_queued(j->handoff.arg, job);
    return j->handoff.can_offer(j->handoff.arg, job);
}

size_t gps_jobs_offer_queued(gps_jobs *j)
{
    if (!j->handoff.withdraw || !j->handoff.offer)
        return 0;
    gps_job *tail = j->head;
    while (tail && tail->next)
        tail = tail->next;
    size_t n = 0;
    /* The list is newest first: from its tail, the oldest is offered first. */
    for (gps_job *x = tail; x; x = x->prev) {
        if (x->state != GPS_JOB_QUEUED || x->held || x->remote || x->offered ||
            x->withdrawing || !jobs_offerable(j, x, true))
            continue;
        x->offered = j->handoff.offer(j->handoff.arg, x);
        n += x->offered;
    }
    return n;
}

size_t gps_job_models(const gps_job *job, const char **names, size_t max)
{
    size_t n = 0;
    if (max > 0)
        names[n++] = job->spec.model;
    for (size_t i = 0; i < job->n_chain && n < max; i++)
        if (job->chain[i] != job->spec.model)
            names[n++] = job->chain[i];
    return n;
}

/* The key's limits (requests per minute, tokens per day) admit a new
 * job, its tokens reserved (*reserve); false: refused (spec cleared, err
 * says why). */
static bool admit_key(gps_jobs *j, gps_job_spec *spec, const char *correlation_id,
                      const char *key_id, long long *reserve, gps_submit_err *err)
{
    int retry = 0;
    *reserve = job_token_reserve(spec);
    gps_limit_result lr =
        gps_limits_admit(j->limits, key_id, gp_now_wall_ms(), *reserve, &retry);
    if (lr != GPS_LIMIT_OK) {
        if (j->metrics)
            gps_metrics_rate_limited(j->metrics, gps_limit_result_name(lr));
        gps_job_spec_clear(spec);
        err->status = 429;
        err->retry_after_sec = retry;
        if (lr == GPS_LIMIT_RPM) {
            err->code = "RATE_LIMITED";
            snprintf(err->message, sizeof err->message,
                     "this key's requests per minute are used up; retry in %d s", retry);
        } else {
            err->code = "TOKEN_LIMIT";
            snprintf(err->message, sizeof err->message,
                     "this key's tokens for today are used up; retry in %d s "
                     "(after 00:00 UTC)", retry);
        }
        gp_log_write(GP_LOG_INFO, "rate_limited", correlation_id,
                     json_pack("{s:s,s:s,s:i}", "key_id", key_id, "reason",
                               gps_limit_result_name(lr), "retry_after", retry),
                     "request refused by the key's limits");
        return false;
    }
    return true;
}

/* A new job that takes spec's contents (spec keeps its api only): its
 * id, tenant, text resumed, sampler seed and clocks. NULL when out of
 * memory (the reservation given back, spec cleared, err says so). */
static void out_of_memory(gps_submit_err *err)
{
    err->status = 500;
    err->code = "INTERNAL";
    snprintf(err->message, sizeof err->message, "out of memory");
}

static gps_job *job_new(gps_jobs *j, gps_job_spec *spec, const char *correlation_id,
                        const char *key_id, long long reserve, gps_submit_err *err)
{
    gps_job *job = calloc(1, sizeof *job);
    if (!job) {
        if (reserve > 0)
            gps_limits_release(j->limits, key_id, reserve);
        gps_job_spec_clear(spec);
        out_of_memory(err);
        return NULL;
    }
    job->owner = j;
    if (spec->resume_id)
        snprintf(job->id, sizeof job->id, "%s", spec->resume_id);
    else
        gps_id_new("job_", job->id, sizeof job->id);
    gp_copy_str(job->correlation_id, sizeof job->correlation_id,
                correlation_id ? correlation_id : "");
    gp_copy_str(job->key_id, sizeof job->key_id, key_id ? key_id : "");
    tenant_of(j, job->key_id, spec->tenant_sub, job->tenant);
    job->reserved_tokens = reserve;
    job->spec = *spec;
    memset(spec, 0, sizeof *spec);
    spec->api = job->spec.api;
    gp_buf_init(&job->text);
    if (job->spec.resume_text && job->spec.resume_tokens > 0) {
        /* Continue where the previous server process stopped: the client
         * already has this text (its events are stored). Out of memory
         * refuses the job (500): resumed without it, the job's text would
         * not be the client's, and a failover would continue from the
         * wrong text. */
        if (gp_buf_append(&job->text, job->spec.resume_text, strlen(job->spec.resume_text)) < 0) {
            jobs_job_free(job); /* (its reservation given back, its spec cleared) */
            out_of_memory(err);
            return NULL;
        }
        job->completion_tokens = job->continued_tokens = job->spec.resume_tokens;
        job->client_saw_output = true;
        jobs_resume_ids_take(job);
    }
    if (job->spec.has_seed) {
        job->sampler_seed = job->spec.seed;
    } else {
        uint64_t r = gps_id_u64(); /* (no RAND_bytes per job: ids.h) */
        job->sampler_seed = (long long)(r >> 1);   /* JSON integers are signed */
    }
    job->created_us = gp_now_mono_us();
    job->created_wall_ms = gp_now_wall_ms();
    job->queued_since_us = job->created_us;
    return job;
}

/* A new job's chain of models and its scheduler view (sj), from its spec. */
static void job_sched_view(gps_jobs *j, gps_job *job)
{
    job->sj.model = job->spec.model;
    /* The client's order, before a fallback below swaps the names. */
    job->chain[job->n_chain++] = job->spec.model;
    for (size_t i = 0; i < job->spec.n_fallback; i++)
        job->chain[job->n_chain++] = job->spec.fallback_models[i];
    job->sj.priority = job->spec.priority == GPS_PRIO_BATCH ? SCHED_BATCH : SCHED_INTERACTIVE;
    job->sj.prefer_agent = job->spec.prefer_agent;
    job->sj.prefer_strict = -1;
    job->sj.session = job->spec.session ? job->spec.session : job->spec.user;
    job->sj.labels = job->spec.labels;
    job->sj.n_labels = job->spec.n_labels;
    job->sj.needs_tools = job->spec.tools != NULL;
    job->sj.needs_embeddings = job->spec.kind == GPS_JOB_EMBED;
    /* a name served by encoders and decoders alike: text jobs skip the encoders */
    job->sj.needs_generation =
        job->spec.kind == GPS_JOB_CHAT || job->spec.kind == GPS_JOB_COMPLETION;
    set_prefix_chain(j, job);
}

/* The job's own model can neither take nor queue it (r): its fallback
 * models are tried (*a: the agent that took it). Returns the answer that
 * stands. */
static sched_result submit_fallback(gps_jobs *j, gps_job *job, sched_result r,
                                    registry_agent **a)
{
    /* fallback_models, in order: the first that can take or queue the
     * job serves it. spec.model becomes the serving model (the reply,
     * the request log and failover all use it); the requested name
     * moves into its slot. When none can, the first model's error is
     * the answer. */
    for (size_t i = 0; i < job->spec.n_fallback; i++) {
        job->sj.model = job->spec.fallback_models[i];
        sched_result rf = sched_submit(j->sched, &job->sj, gp_now_mono_ms(), a);
        if (rf == SCHED_ASSIGNED || rf == SCHED_QUEUED) {
            char *served = job->spec.fallback_models[i];
            job->spec.fallback_models[i] = job->spec.model;
            job->spec.model = served;
            job->requested_model = job->spec.fallback_models[i];
            r = rf;
            break;
        }
    }
    job->sj.model = job->spec.model;
    return r;
}

/* Does the scheduler's answer (r) refuse the new job? Then err says why
 * and the job is freed. Not when an agent took it, it is queued, or no
 * agent here can take it but another server may (job->remote). */
static bool sched_refused(gps_jobs *j, gps_job *job, sched_result r, gps_submit_err *err)
{
    switch (r) {
    case SCHED_ASSIGNED:
    case SCHED_QUEUED:
        break;
    case SCHED_QUEUE_FULL: {
        if (j->metrics)
            gps_metrics_rate_limited(j->metrics, "queue_full");
        uint64_t est = sched_estimated_wait_ms(j->sched, job->spec.model);
        err->status = 429;
        err->code = "QUEUE_FULL";
        err->retry_after_sec = est ? (int)((est + 999) / 1000) : 1;
        snprintf(err->message, sizeof err->message,
                 "the queue for model '%.100s' is full; retry later", job->spec.model);
        jobs_job_free(job);
        return true;
    }
    case SCHED_NO_AGENT:
        if (jobs_offerable(j, job, false)) {
            job->remote = true; /* handed to another server: see below */
            break;
        }
        if (registry_model_known(j->reg, job->spec.model)) {
            err->status = 503;
            err->code = "NO_AGENT";
            err->retry_after_sec = j->opts.poll_interval_sec > 0 ? j->opts.poll_interval_sec : 5;
            snprintf(err->message, sizeof err->message,
                     "no agent is serving model '%.100s' right now; retry later",
                     job->spec.model);
        } else {
            err->status = 404;
            err->code = "MODEL_NOT_FOUND";
            snprintf(err->message, sizeof err->message,
                     "the model '%.100s' does not exist (no agent has served it)",
                     job->spec.model);
        }
        jobs_job_free(job);
        return true;
    default:
        err->status = 500;
        err->code = "INTERNAL";
        snprintf(err->message, sizeof err->message, "scheduler error");
        jobs_job_free(job);
        return true;
    }
    return false;
}

/* The new job is in: in the table, counted against its key, in the
 * request log, offered to the other servers where it may go there, and
 * delivered when an agent (a) took it. */
static void submit_accepted(gps_jobs *j, gps_job *job, sched_result r, registry_agent *a,
                            bool concurrent)
{
    jobs_table_insert(j, job);
    j->n_live++;
    job->state = GPS_JOB_QUEUED;
    if (j->limits && job->key_id[0] && concurrent) {
        job->counted = true;
        gps_limits_started(j->limits, job->key_id);
    }
    if (job->spec.resume_id)
        jobs_persist(j, job); /* the row of the previous process: now queued again */
    else
        jobs_persist_insert(j, job);
    log_submitted(j, job, false);
    if (job->remote) /* after its row's insert: the offer's row refers to it */
        j->handoff.offer(j->handoff.arg, job);
    else if (r == SCHED_QUEUED && j->handoff.withdraw && jobs_offerable(j, job, true))
        job->offered = j->handoff.offer(j->handoff.arg, job); /* and stays queued here */
    else if (r == SCHED_QUEUED && j->handoff.withdraw && j->handoff.can_offer_queued &&
             may_go_elsewhere(j, job))
        gp_log_write(GP_LOG_INFO, "job_handoff_held", job->correlation_id,
                     json_pack("{s:s,s:s}", "job_id", job->id, "model", job->spec.model),
                     "queued here; no other server has a free agent for it: offered once "
                     "one has");
    if (r == SCHED_ASSIGNED && a) {
        jobs_deliver_to(j, job, a, 1);
    } else {
        job->state = GPS_JOB_QUEUED;
    }
}

gps_job *gps_jobs_submit(gps_jobs *j, gps_job_spec *spec, const char *correlation_id,
                         const char *key_id, gps_submit_err *err)
{
    memset(err, 0, sizeof *err);
    if (refuse_generation(j, spec, err)) {
        gps_job_spec_clear(spec);
        return NULL;
    }
    long long reserve = 0;
    if (j->limits && !spec->resume_id && key_id && *key_id &&
        !admit_key(j, spec, correlation_id, key_id, &reserve, err))
        return NULL;
    gps_job *job = job_new(j, spec, correlation_id, key_id, reserve, err);
    if (!job)
        return NULL;
    job_sched_view(j, job);

    registry_agent *a = NULL;
    /* A count_tokens job is a short tokenizer call: it neither waits for
     * nor takes one of the key's max_concurrent places (a client counting
     * tokens beside its own long generation must not stall behind it). */
    bool concurrent = job->spec.kind != GPS_JOB_COUNT_TOKENS;
    if (j->limits && concurrent && !gps_limits_may_start(j->limits, job->key_id) &&
        registry_model_known(j->reg, job->spec.model))
        return submit_held(j, job);
    sched_result r = sched_submit(j->sched, &job->sj, gp_now_mono_ms(), &a);
    if ((r == SCHED_NO_AGENT || r == SCHED_QUEUE_FULL) && job->spec.n_fallback)
        r = submit_fallback(j, job, r, &a);
    if (sched_refused(j, job, r, err))
        return NULL;
    submit_accepted(j, job, r, a, concurrent);
    return job;
}

size_t gps_jobs_queue_position(gps_jobs *j, const gps_job *job)
{
    if (job->state != GPS_JOB_QUEUED)
        return 0;
    size_t ahead = 0;
    /* The table lists the newest job first: a job after this one in the
     * list came before it. That decides between two submitted in the
     * same microsecond (no longer rare since a submit writes no log line
     * at info). */
    bool past = false;
    for (const gps_job *x = j->head; x; x = x->next) {
        if (x == job) {
            past = true;
            continue;
        }
        if (x->state != GPS_JOB_QUEUED || strcmp(x->spec.model, job->spec.model))
            continue;
        if (x->spec.priority != job->spec.priority) {
            ahead += x->spec.priority < job->spec.priority; /* interactive goes first */
            continue;
        }
        if (x->sj.front != job->sj.front)
            ahead += x->sj.front;                           /* failover retries first */
        else if (x->queued_since_us != job->queued_since_us)
            ahead += x->queued_since_us < job->queued_since_us;
        else if (x->created_us != job->created_us)
            ahead += x->created_us < job->created_us;
        else
            ahead += past;
    }
    return ahead;
}
