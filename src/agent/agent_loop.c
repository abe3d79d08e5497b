/* agent_loop: the agent's loop: completions, what it knows of its jobs, its turn, agent_run. */
#include "agent/agent_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "agent/curl_loop.h"
#include "common/gp_json.h"
#include "common/gp_log.h"

/* ======================================================================== */
/* Completions and the loop                                                 */
/* ======================================================================== */

static void handle_done(agent *a, CURLMsg *m)
{
    req *r = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    curl_multi_remove_handle(a->multi, m->easy_handle);
    if (!r)
        return;
    long status = 0;
    CURLcode rc = m->data.result;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    if (r->too_big)
        rc = CURLE_WRITE_ERROR;
    if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CONNECT_ERROR ||
        rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_SSL_CERTPROBLEM) {
        /* A TLS failure is a configuration problem (wrong CA, wrong host
         * name, plain HTTP port): say so plainly once per outage. */
        if (!a->server_down_logged)
            gp_log_error("tls_error", "TLS with %s failed: %s: %s%s", a->servers[r->srv],
                         curl_easy_strerror(rc), r->errbuf[0] ? r->errbuf : "no detail",
                         rc == CURLE_PEER_FAILED_VERIFICATION
                             ? " (check --ca-file and the host name in --server)"
                             : "");
    }
    json_t *body = NULL;
    bool fast = r->kind == REQ_EVENTS_BATCH && rc == CURLE_OK && status == 200 &&
                ag_batch_done_fast(a, r);
    json_error_t je = {0};
    if (rc == CURLE_OK && r->resp.len > 0 && !fast)
        body = gp_json_loadb(r->resp.data, r->resp.len, &je);
    if (rc == CURLE_OK && status == 200 && !fast && !json_is_object(body) &&
        (r->kind != REQ_WORK || r->resp.len > 0)) {
        /* A 200 must carry a JSON object; anything else is a broken server
         * or proxy: treat like a server error. A reply we could not read
         * for want of memory takes the same path (it is retried), but the
         * log says whose fault it was. */
        const char *what = r->kind == REQ_ENROLL ? "enroll"
                           : r->kind == REQ_POLL ? "poll"
                           : r->kind == REQ_WORK ? "work"
                                                 : "events";
        if (!body && json_error_code(&je) == json_error_out_of_memory)
            gp_log_warn("reply_out_of_memory",
                        "out of memory while reading the server's reply to a %s request", what);
        else
            gp_log_warn("bad_reply", "server reply to a %s request is not a JSON object", what);
        status = 502;
    }
    switch (r->kind) {
    case REQ_ENROLL:
        a->enroll_req = NULL;
        ag_enroll_done(a, rc, status, body);
        break;
    case REQ_POLL:
        a->poll_req = NULL;
        ag_poll_done(a, rc, status, body);
        break;
    case REQ_WORK:
        if (r == a->work_stale) {
            a->work_stale = NULL;
            ag_work_stale_done(a, rc, status, body);
            break;
        }
        a->work_req = NULL;
        ag_work_done(a, rc, status, body);
        break;
    case REQ_EVENTS:
        ag_upload_done(a, r->job, rc, status, body);
        break;
    case REQ_EVENTS_BATCH:
        if (!fast)
            ag_batch_done(a, r, rc, status, body);
        break;
    case REQ_DEREGISTER:
        a->dereg_req = NULL;
        a->dereg_done = true;
        if (rc == CURLE_OK && status == 200)
            gp_log_info("deregistered", "the server marked this agent offline");
        else
            gp_log_warn("deregister_failed", "deregistration failed (%s, HTTP %ld): the "
                        "server will see this agent go silent",
                        rc == CURLE_OK ? "ok" : curl_easy_strerror(rc), status);
        break;
    }
    json_decref(body);
    ag_req_done_free(a, r);
}

/* A clean stop tells the server (POST /agents/deregister), so that it
 * shows the agent offline rather than dead and pages nobody. Started once
 * no poll is in flight (a poll after it would register us again); true
 * while the loop should keep going for it. */
static bool deregister_step(agent *a)
{
    if (!a->registered || a->dereg_done || a->fatal)
        return false;
    if (a->dereg_req)
        return true;
    if (a->poll_req) {
        a->leaving = true; /* let it finish, start no other */
        return true;
    }
    a->leaving = true;
    json_t *body = json_pack("{s:s,s:s}", "agent_id", a->id, "instance", a->instance);
    a->dereg_req = body ? ag_req_start(a, REQ_DEREGISTER, "/agents/deregister", body, 3000, NULL)
                        : NULL;
    if (!a->dereg_req)
        a->dereg_done = true;
    return a->dereg_req != NULL;
}

/* ------------------------------------------------------------------------
 * What the loop knows of its jobs (issue 24). Backend threads link a job
 * on a->dirty when its queue gains something the loop acts on
 * (job_note_locked); the loop's own changes (an upload answered, a cancel)
 * link it too. Once a turn the loop takes the list, with each job's state,
 * under one lock (jobs_review) and updates what it keeps: the ready jobs
 * waiting for a batch (a->bq), those waiting to retry (a->retries), the
 * urgent and running counts, and frees finished jobs. Nothing walks every
 * job on a wake-up any more.
 * ---------------------------------------------------------------------- */

static void bq_remove(agent *a, agent_job *j)
{
    if (!j->in_bq)
        return;
    *(j->bq_prev ? &j->bq_prev->bq_next : &a->bq_head) = j->bq_next;
    *(j->bq_next ? &j->bq_next->bq_prev : &a->bq_tail) = j->bq_prev;
    j->bq_prev = j->bq_next = NULL;
    j->in_bq = false;
    a->n_bq--;
}

/* Queue j for the next batch: at the end, or, urgent (its first output or
 * its end), at the front, so that a batch cut at BATCH_MAX_JOBS carries
 * it; where it is already when neither moves it. */
static void bq_add(agent *a, agent_job *j, bool urgent)
{
    if (j->in_bq && (!urgent || a->bq_head == j))
        return;
    bq_remove(a, j);
    if (urgent) {
        j->bq_prev = NULL;
        j->bq_next = a->bq_head;
        *(a->bq_head ? &a->bq_head->bq_prev : &a->bq_tail) = j;
        a->bq_head = j;
    } else {
        j->bq_next = NULL;
        j->bq_prev = a->bq_tail;
        *(a->bq_tail ? &a->bq_tail->bq_next : &a->bq_head) = j;
        a->bq_tail = j;
    }
    j->in_bq = true;
    a->n_bq++;
}

/* What the loop sees of j now: flags are agent_evq_flags of its queue,
 * read under a->mu (0 when an upload was just taken from it). */
void ag_job_seen(agent *a, agent_job *j, unsigned flags)
{
    bool ready = !j->cancelled && !j->upload && (flags & AGENT_EVQ_READY);
    bool urgent = ready && (flags & AGENT_EVQ_URGENT);
    if (urgent != j->seen_urgent)
        a->n_urgent += urgent ? 1 : -1;
    j->seen_urgent = urgent;
    j->seen_ready = ready;
    if (!ready) {
        bq_remove(a, j);
        agent_timers_del(&a->retries, &j->retry_timer);
    }
}

void ag_job_retry_at(agent *a, agent_job *j, uint64_t at)
{
    pthread_mutex_lock(&a->mu);
    unsigned flags = agent_evq_flags(&j->q);
    pthread_mutex_unlock(&a->mu);
    j->next_upload_ms = at;
    ag_job_seen(a, j, flags);
    if (j->seen_ready) {
        bq_remove(a, j);
        agent_timers_set(&a->retries, &j->retry_timer, at); /* room: job_begin */
    }
}

/* A ready job's upload: into the next batch (to the server polled now,
 * when it takes them), on its own at once, or later (next_upload_ms).
 * *urgent is set when an urgent job went on its own, as the walk over
 * every job counted it (a batch due now goes at once with it). */
static void job_place(agent *a, agent_job *j, uint64_t now, bool *urgent)
{
    if (!j->seen_ready)
        return;
    if (now < j->next_upload_ms) {
        bq_remove(a, j);
        agent_timers_set(&a->retries, &j->retry_timer, j->next_upload_ms);
        return;
    }
    agent_timers_del(&a->retries, &j->retry_timer);
    if (a->events_batch && j->srv == a->cur) {
        bq_add(a, j, j->seen_urgent);
        return;
    }
    bq_remove(a, j);
    *urgent = *urgent || j->seen_urgent;
    ag_upload_start(a, j, now);
}

/* Free a job finished on both sides (safe point: not inside any callback
 * of its, no upload in flight, off a->dirty: the backend is done with it). */
static void job_reap(agent *a, agent_job *j)
{
    ag_job_seen(a, j, 0);
    agent_timers_del(&a->deadlines, &j->dl_timer);
    *(j->prev ? &j->prev->next : &a->jobs) = j->next;
    if (j->next)
        j->next->prev = j->prev;
    agent_idtab_del(&a->jtab, &j->hnode);
    a->live_dirty = true;
    a->n_jobs--;
    if (gp_log_enabled(GP_LOG_DEBUG))
        gp_log_write(GP_LOG_DEBUG, "job_done", j->correlation_id,
                     json_pack("{s:s}", "job_id", j->id), "job %s finished", j->id);
    ag_job_free(j);
}

/* j lost an event for want of memory (agent_evq_broken): its queue ends
 * with the AGENT_OUT_OF_MEMORY error, which fails the job over, and takes
 * nothing more, so its backend stops as on a cancel (its terminal callback
 * frees the slot; the job goes once the error is delivered). Not
 * j->cancelled: the error is still to be sent. */
static void job_stop_broken(agent *a, agent_job *j)
{
    if (j->cancel_sent)
        return;
    gp_log_write(GP_LOG_ERROR, "job_out_of_memory", j->correlation_id,
                 json_pack("{s:s}", "job_id", j->id),
                 "job %s: out of memory while queueing its output; failing it "
                 "(AGENT_OUT_OF_MEMORY)", j->id);
    ag_job_cancel(a, j);
}

/* Take a->dirty with what each of its jobs holds now (one lock a turn),
 * then act on it. */
static void jobs_review(agent *a, uint64_t now, bool *urgent)
{
    size_t k = 0;
    pthread_mutex_lock(&a->mu);
    for (agent_job *j = a->dirty; j; j = j->dirty_next) {
        j->dirty = false;
        j->snap_flags = agent_evq_flags(&j->q);
        j->snap_done = j->backend_done;
        j->snap_evq_done = agent_evq_done(&j->q);
        a->review[k++] = j; /* room: job_begin */
    }
    a->dirty = NULL;
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < k; i++) {
        agent_job *j = a->review[i];
        if (j->snap_done && !j->seen_done) {
            j->seen_done = true;
            a->n_running--;
        }
        if (j->snap_done && !j->upload && (j->cancelled || j->snap_evq_done)) {
            job_reap(a, j);
            continue;
        }
        if ((j->snap_flags & AGENT_EVQ_BROKEN) && !j->snap_done)
            job_stop_broken(a, j);
        ag_job_seen(a, j, j->snap_flags);
        job_place(a, j, now, urgent);
    }
}

/* The server polled now or its taking batches changed: the jobs queued
 * for a batch go where they belong now. */
static void bq_requeue(agent *a, uint64_t now, bool *urgent)
{
    agent_job *j = a->bq_head;
    a->bq_head = a->bq_tail = NULL;
    a->n_bq = 0;
    a->bq_cur = a->cur;
    a->bq_batch = a->events_batch;
    while (j) {
        agent_job *next = j->bq_next;
        j->in_bq = false;
        j->bq_prev = j->bq_next = NULL;
        job_place(a, j, now, urgent);
        j = next;
    }
}

/* Jobs past their deadline are stopped; *wake: the next deadline. */
static void deadlines_due(agent *a, uint64_t now, uint64_t *wake)
{
    agent_timer *t;
    while ((t = agent_timers_first(&a->deadlines)) && t->at <= now) {
        agent_job *j = (agent_job *)((char *)t - offsetof(agent_job, dl_timer));
        agent_timers_del(&a->deadlines, t);
        pthread_mutex_lock(&a->mu);
        bool overdue = !j->backend_done && !j->stop_deadline;
        if (overdue)
            j->stop_deadline = true;
        pthread_mutex_unlock(&a->mu);
        if (overdue) {
            gp_log_warn("job_deadline", "job %s ran past its deadline; stopping it", j->id);
            ag_job_cancel(a, j);
        }
    }
    if (t)
        *wake = t->at < *wake ? t->at : *wake;
}

/* Jobs whose upload waited for next_upload_ms go now; *wake: the next. */
static void retries_due(agent *a, uint64_t now, uint64_t *wake, bool *urgent)
{
    agent_timer *t;
    while ((t = agent_timers_first(&a->retries)) && t->at <= now) {
        agent_job *j = (agent_job *)((char *)t - offsetof(agent_job, retry_timer));
        agent_timers_del(&a->retries, t);
        job_place(a, j, now, urgent);
    }
    if (t)
        *wake = t->at < *wake ? t->at : *wake;
}

static void stop_all_jobs(agent *a)
{
    for (agent_job *j = a->jobs; j; j = j->next) {
        pthread_mutex_lock(&a->mu);
        bool running = !j->backend_done;
        if (running)
            j->stop_shutdown = true;
        pthread_mutex_unlock(&a->mu);
        if (running)
            ag_job_cancel(a, j);
    }
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static void agent_announce(agent *a)
{
    int total, usable;
    ag_slot_counts(a, &total, &usable);
    gp_log_write(GP_LOG_INFO, "agent_start", NULL,
                 json_pack("{s:s,s:i}", "server", a->base, "servers", a->n_servers),
                 "agent %s (%s) serving through backend %s, %d slot(s), server %s%s", a->id,
                 a->name, a->be->ops->name, total, a->base,
                 a->n_servers > 1 ? " (the first of its list; it moves on failure)" : "");
    if (a->o->insecure)
        gp_log_warn("tls_insecure",
                    "INSECURE: the server's TLS certificate is NOT verified (--insecure); anyone "
                    "on the network path can impersonate %s and receive the agent key and all "
                    "prompts. Use --ca-file instead.", a->base);
    if (a->token_ignored)
        gp_log_info("token_ignored", "using the agent key in %s/" AGENT_KEY_FILE
                    "; --token is ignored", a->o->state_dir);
}

/* One look at everything (the loop's turn): stop requests, jobs that
 * changed, deadlines, uploads, the poll and the long-poll. True when the
 * agent is to leave; else *wake_at is when the next turn is due at the
 * latest (monotonic ms). */
static void stop_requests(agent *a, uint64_t now);
static void uploads_due(agent *a, uint64_t now, uint64_t *wake);
static void server_requests_due(agent *a, uint64_t now, uint64_t *wake);

static bool loop_body(agent *a, uint64_t *wake_at)
{
    uint64_t now = gp_now_mono_ms();
    atomic_store(&a->wake_sent, false); /* before the scan: see loop_wake_now */

    /* Enrollment refused or key revoked: nothing to wait for. */
    if (a->fatal) {
        stop_all_jobs(a);
        return true;
    }
    stop_requests(a, now);
    uint64_t wake = now + 1000;
    uploads_due(a, now, &wake);

    /* Leave when drained (or out of time after stopping the jobs). */
    if (a->stopping && !a->jobs && (a->drain_announced || !a->registered) &&
        !deregister_step(a))
        return true;
    if (a->jobs_stopped && now >= a->final_deadline_ms) {
        gp_log_warn("shutdown_incomplete", "leaving with undelivered job events");
        return true;
    }
    server_requests_due(a, now, &wake);
    *wake_at = wake;
    return false;
}

/* Stop requests from the signal thread: drain, then stop the jobs at the
 * drain deadline (or at once on a second request). */
static void stop_requests(agent *a, uint64_t now)
{
    int sr = atomic_load(&a->stop_req);
    if (sr >= 1 && !a->stopping) {
        gp_log_info("draining", "stop requested: draining (up to %lld s for running jobs)",
                    a->o->drain_timeout_sec);
        a->stopping = true;
        a->draining = true;
        a->drain_announced = false;
        a->drain_deadline_ms = now + (uint64_t)a->o->drain_timeout_sec * 1000;
        if (!a->poll_req)
            a->next_poll_ms = now;
    }
    if (a->stopping && !a->jobs_stopped && (sr >= 2 || now >= a->drain_deadline_ms)) {
        if (a->jobs)
            gp_log_warn("drain_timeout", "stopping the jobs still running");
        a->jobs_stopped = true;
        a->exit_code = sr >= 2 ? 1 : 0;
        a->final_deadline_ms = now + SHUTDOWN_FLUSH_MS;
        stop_all_jobs(a);
    }
}

/* Per-job upkeep: what changed (jobs_review), deadlines and retries due,
 * and uploads (batched when the server takes it and none is in flight).
 * *wake: lowered to when this is next due. */
static void uploads_due(agent *a, uint64_t now, uint64_t *wake)
{
    bool urgent = false;
    jobs_review(a, now, &urgent);
    if (a->bq_cur != a->cur || a->bq_batch != a->events_batch)
        bq_requeue(a, now, &urgent);
    deadlines_due(a, now, wake);
    retries_due(a, now, wake, &urgent);
    if (a->n_bq && !a->batch_req) {
        /* With two or more jobs running, wait up to events-batch-ms
         * after the first pending event so that the others' tokens
         * share the request; a lone job's go at once (its latency is
         * what a single stream sees), and so does a batch with a job's
         * first output or end in it. Without the wait the server's
         * answer is so quick at paced streams that an upload carried a
         * token or two: its per-request cost, not the tokens, was what
         * the server spent (issue 24). */
        if (!a->batch_since_ms)
            a->batch_since_ms = now;
        uint64_t due = a->batch_since_ms + (uint64_t)a->o->events_batch_ms;
        if (a->n_running < 2 || now >= due || urgent || a->n_urgent > 0) {
            ag_batch_start(a, now, false);
            a->batch_since_ms = 0;
        } else {
            *wake = min_u64(*wake, due);
        }
    } else if (ag_batch_urgent_due(a)) {
        ag_batch_start(a, now, true);
    }
}

/* Enrollment or the heartbeat poll, and the long-poll, when due. *wake:
 * lowered to when one is next due. */
static void server_requests_due(agent *a, uint64_t now, uint64_t *wake)
{
    /* Enroll first (once), then heartbeat. */
    if (a->enrolling) {
        if (!a->enroll_req && now >= a->next_enroll_ms)
            ag_enroll_start(a);
        if (!a->enroll_req)
            *wake = min_u64(*wake, a->next_enroll_ms);
    } else {
        if (!a->poll_req && now >= a->next_poll_ms && !a->leaving)
            ag_poll_start(a);
        if (!a->poll_req && !a->leaving)
            *wake = min_u64(*wake, a->next_poll_ms);
    }

    /* Keep a long-poll parked at all times: with free slots it asks
     * for work; busy or draining (free_slots 0) it is the liveness
     * channel whose close tells the server this process is gone. */
    int total, usable;
    ag_slot_counts(a, &total, &usable);
    int free_slots = usable - ag_busy_slots(a);
    if (free_slots < 0 || a->draining || a->server_drain)
        free_slots = 0;
    if (a->no_liveness && a->draining && a->drain_announced && a->work_req) {
        ag_req_abort(a, a->work_req); /* the server knows we are draining */
        a->work_req = NULL;
    }
    if (a->work_req && free_slots > a->work_free && !a->work_stale &&
        (a->work_free == 0 || a->prefix_reported)) {
        /* A slot freed under a liveness long-poll: park a new one that
         * asks for work; the server answers the old one 204. Not
         * aborted: its close would look like our death. With a prefix
         * cache, any freed slot re-parks: the new long-poll says what
         * the slot now holds (its reply's jobs, if the server sent the
         * old one any, are still taken: ag_work_stale_done). */
        a->work_stale = a->work_req;
        a->work_req = NULL;
        a->next_work_ms = now;
    }
    bool want = free_slots > 0 || !a->no_liveness;
    if (!a->work_req && a->registered && want && !a->leaving) {
        if (now >= a->next_work_ms)
            ag_work_start(a, free_slots);
        else
            *wake = min_u64(*wake, a->next_work_ms);
    }
}

/* Drive libcurl for the server requests (socket fd ready for action, or
 * CURL_SOCKET_TIMEOUT: timeouts due and requests just added) and act on
 * those that finished (outside libcurl's callbacks). True when one did. */
static bool reqs_settle(agent *a, curl_socket_t fd, int action)
{
    int running = 0;
    a->kick = false; /* a socket action also runs the timeouts due */
    curl_multi_socket_action(a->multi, fd, action, &running);
    CURLMsg *m;
    int left;
    bool any = false;
    while ((m = curl_multi_info_read(a->multi, &left))) {
        if (m->msg == CURLMSG_DONE) {
            handle_done(a, m);
            any = true;
        }
    }
    return any;
}

/* The loop's turn: loop_body until nothing it started finished at once,
 * then sleep until its wake time or an event. A request it added is
 * driven at once (not at libcurl's timer, a pass of the loop later, behind
 * a pass of relaying). */
void ag_loop_turn(agent *a)
{
    if (a->ended || a->in_turn)
        return;
    a->in_turn = true;
    uint64_t wake;
    for (;;) {
        if (loop_body(a, &wake)) {
            a->ended = true;
            a->in_turn = false;
            event_base_loopbreak(a->evb);
            return;
        }
        if (!a->kick || !reqs_settle(a, CURL_SOCKET_TIMEOUT, 0))
            break; /* else act on what just finished before sleeping */
    }
    a->in_turn = false;
    /* A batch in flight, or one due at `wake`: the loop will look at the
     * jobs of the server it goes to before it sends anything more there,
     * so their non-urgent changes need not wake it (lazy_srv). A job
     * linked since jobs_review, without a wake, is looked at in the next
     * pass. */
    bool lazy = a->events_batch && (a->batch_req || a->n_bq);
    pthread_mutex_lock(&a->mu);
    a->lazy_srv = lazy ? a->cur : -1;
    a->lazy_urgent_srv = a->events_batch && a->batch_req && a->batch_req->srv == a->cur &&
                                 a->urgent_req && a->urgent_req->srv == a->cur
                             ? a->cur
                             : -1;
    bool again = a->dirty != NULL;
    pthread_mutex_unlock(&a->mu);
    if (again) {
        event_active(a->turn_ev, EV_TIMEOUT, 0);
        return;
    }
    uint64_t now = gp_now_mono_ms();
    uint64_t ms = wake > now ? min_u64(wake - now, 1000) : 0;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    event_add(a->turn_ev, &tv);
}

static void on_turn(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ag_loop_turn(arg);
}

/* Another thread wrote the eventfd. */
static void on_wake_fd(evutil_socket_t fd, short what, void *arg)
{
    agent *a = arg;
    uint64_t n;
    (void)what;
    while (read(fd, &n, sizeof n) < 0 && errno == EINTR)
        ;
    ag_loop_turn(a);
}

/* A server connection's socket is ready (CURLMOPT_SOCKETFUNCTION). */
static void on_req_sock(evutil_socket_t fd, short what, void *arg)
{
    agent *a = arg;
    int action = ((what & EV_READ) ? CURL_CSELECT_IN : 0) |
                 ((what & EV_WRITE) ? CURL_CSELECT_OUT : 0);
    if (reqs_settle(a, fd, action))
        ag_loop_turn(a);
}

static void on_req_timer(evutil_socket_t fd, short what, void *arg)
{
    agent *a = arg;
    (void)fd;
    (void)what;
    if (reqs_settle(a, CURL_SOCKET_TIMEOUT, 0))
        ag_loop_turn(a);
}

/* CURLMOPT_SOCKETFUNCTION for the server requests: watch s as libcurl asks
 * (socketp: its event), with new work (AGENT_PRI_NEW). */
static int on_req_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    agent *a = userp;
    struct event *ev = socketp;
    (void)easy;
    if (what == CURL_POLL_REMOVE) {
        if (ev)
            event_free(ev);
        return 0;
    }
    return curl_loop_watch(a->evb, a->multi, s, what, ev, AGENT_PRI_NEW, on_req_sock, a) ? 0
                                                                                         : -1;
}

/* CURLMOPT_TIMERFUNCTION for the server requests. */
static int on_req_timeout(CURLM *multi, long timeout_ms, void *userp)
{
    agent *a = userp;
    (void)multi;
    return curl_loop_timer(a->curl_tev, timeout_ms);
}

int agent_run(agent *a)
{
    a->next_poll_ms = gp_now_mono_ms();
    a->next_work_ms = UINT64_MAX;
    a->next_enroll_ms = gp_now_mono_ms();
    agent_announce(a);
    a->loop_th = pthread_self();
    atomic_store(&a->looping, true);
    a->ended = false;
    event_active(a->turn_ev, EV_TIMEOUT, 0);
    event_base_dispatch(a->evb);
    atomic_store(&a->looping, false);
    gp_log_info("agent_exit", "agent stopped (exit code %d)", a->exit_code);
    return a->exit_code;
}

/* The loop: its base (AGENT_PRI_*, backend.h), its events, libcurl's
 * callbacks for the server requests, and the backend bound to it when it
 * runs on it. 0, or -1 with err set (agent_destroy frees what was made). */
int ag_loop_init(agent *a, char *err, size_t errlen)
{
    a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->wake_fd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        return -1;
    }
    a->evb = event_base_new();
    if (a->evb && event_base_priority_init(a->evb, 2) != 0) {
        event_base_free(a->evb);
        a->evb = NULL;
    }
    if (a->evb) {
        a->turn_ev = evtimer_new(a->evb, on_turn, a);
        a->wake_ev = event_new(a->evb, a->wake_fd, EV_READ | EV_PERSIST, on_wake_fd, a);
        a->curl_tev = evtimer_new(a->evb, on_req_timer, a);
    }
    if (!a->evb || !a->turn_ev || !a->wake_ev || !a->curl_tev ||
        event_priority_set(a->turn_ev, AGENT_PRI_NEW) != 0 ||
        event_priority_set(a->wake_ev, AGENT_PRI_NEW) != 0 ||
        event_priority_set(a->curl_tev, AGENT_PRI_NEW) != 0 || event_add(a->wake_ev, NULL) != 0) {
        snprintf(err, errlen, "cannot set up the agent's event loop");
        return -1;
    }
    curl_multi_setopt(a->multi, CURLMOPT_SOCKETFUNCTION, on_req_socket);
    curl_multi_setopt(a->multi, CURLMOPT_SOCKETDATA, a);
    curl_multi_setopt(a->multi, CURLMOPT_TIMERFUNCTION, on_req_timeout);
    curl_multi_setopt(a->multi, CURLMOPT_TIMERDATA, a);
    if (a->be && a->be->ops->bind_loop && a->be->ops->bind_loop(a->be, a->evb, err, errlen) != 0)
        return -1;
    return 0;
}
