/*
 * backend_gguf_out.c: what a job sends: text through the stop matcher,
 * tool calls, its end and errors; and a job made ready for its slot
 * (tokenized, continuation ids appended, the stop matcher primed).
 */
#include "agent/backend_gguf_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"

/* --------------------------------------------------------- decode thread */

/* Terminal helpers: call the sink, then the job is freed by the caller. */
void gguf_job_error(gjob *j, const char *code, const char *msg)
{
    j->sink.error(j->sink.ctx, code, msg);
}

void gguf_job_nomem(gjob *j, const char *what)
{
    char msg[160];
    snprintf(msg, sizeof msg, "the agent ran out of memory %s", what);
    gguf_job_error(j, "AGENT_OUT_OF_MEMORY", msg);
}

/* Send a token event with emit[0..n) and the ids sampled since the last
 * one (the backend's part of a token-exact failover: the server keeps the
 * ids behind the text it relayed). Once an id was lost (ids_lost) every
 * event goes without ids: the first such event ends the server's record
 * (docs/protocol.md), where one with the later ids alone would have it
 * keep ids that do not spell the text it relayed. */
static void send_text(gjob *j, const char *emit, size_t n)
{
    if (j->ids_lost)
        j->sink.token(j->sink.ctx, emit, n, -1);
    else if (j->sink.token_ids && j->n_unsent > 0)
        j->sink.token_ids(j->sink.ctx, emit, n, j->unsent, (size_t)j->n_unsent);
    else
        j->sink.token(j->sink.ctx, emit, n, j->n_unsent > 0 ? j->unsent[j->n_unsent - 1] : -1);
    j->n_unsent = 0;
}

/* The calls the parser found since the last time, as tool_call events
 * (ids derived from the job id: the same on every attempt). */
static void send_calls(gjob *j)
{
    const char *name, *args;
    while (gpe_toolparse_call(j->tools.tp, j->tools.n_sent, &name, &args)) {
        if (j->sink.tool_call) {
            char seed[160], h[65], id[40];
            snprintf(seed, sizeof seed, "%s/%zu", j->job_id, j->tools.n_sent);
            gp_sha256_hex(seed, strlen(seed), h);
            snprintf(id, sizeof id, "call_%.24s", h);
            j->sink.tool_call(j->sink.ctx, (int)j->tools.n_sent, id, name, args, strlen(args));
        }
        j->tools.n_sent++;
        /* the ids behind a call are not text a continuation could resume */
        j->n_unsent = 0;
    }
}

/* Generated text on its way out: through the tool-call parser when the
 * job has tools (content goes on as token events, calls as tool_call).
 * A parser that ran out of memory may have lost a piece of text or a call:
 * nothing more goes out (what it emitted with the failure neither: the
 * server's text and ids stay those of what it relayed whole), and the job
 * ends AGENT_OUT_OF_MEMORY (j->oom; job_step and gguf_job_end). */
void gguf_out_text(gjob *j, const char *s, size_t n)
{
    if (j->oom)
        return;
    if (!j->tools.tp) {
        if (n > 0)
            send_text(j, s, n);
        return;
    }
    const char *emit;
    size_t elen;
    if (gpe_toolparse_feed(j->tools.tp, s, n, &emit, &elen) != GPE_OK) {
        j->oom = true;
        return;
    }
    if (elen > 0)
        send_text(j, emit, elen);
    send_calls(j);
}

/* A fixed buffer would do for nearly every token, but one longer than it
 * (long whitespace or punctuation runs in real vocabularies; a GGUF may
 * hold any length) came back as -(needed) and was taken for an empty
 * piece: its text vanished from the output. The job's scratch grows to the
 * longest token it met instead, and a growth that fails is the job's
 * AGENT_OUT_OF_MEMORY (the caller's j->oom). */
int gguf_piece(gguf_backend *b, gjob *j, int32_t tok, bool special)
{
    if (!j->piece) {
        j->piece = malloc(256);
        if (!j->piece)
            return -1;
        j->piece_cap = 256;
    }
    int n = gpe_token_to_piece(b->model, tok, j->piece, j->piece_cap, special);
    if (n >= 0 || n == INT32_MIN)   /* INT32_MIN: the tokenizer's own scratch failed */
        return n >= 0 ? n : -1;
    size_t need = (size_t)-(int64_t)n;
    char *p = realloc(j->piece, need);
    if (!p)
        return -1;
    j->piece = p;
    j->piece_cap = need;
    n = gpe_token_to_piece(b->model, tok, j->piece, j->piece_cap, special);
    return n >= 0 ? n : -1;
}

/* The usage metrics that go before the end; false when they could not be
 * built (the server would answer without the cached tokens and timings). */
static bool send_metrics(gjob *j)
{
    double t = gguf_now_s();
    double gen = j->t_first > 0 ? t - j->t_first : 0;
    json_t *m = json_pack("{s:i, s:i, s:I, s:f, s:f}", "prompt_tokens", j->n_prompt,
                          "prompt_tokens_cached", j->reused < j->n_prompt ? j->reused : j->n_prompt,
                          "completion_tokens", (json_int_t)j->n_gen, "time_to_first_token_ms",
                          j->t_first > 0 ? (j->t_first - j->t_start) * 1e3 : 0.0,
                          "tokens_per_sec", gen > 0 && j->n_gen > 1 ? (j->n_gen - 1) / gen : 0.0);
    if (!m)
        return false;
    j->sink.metrics(j->sink.ctx, m);
    json_decref(m);
    return true;
}

void gguf_job_end(gjob *j, const char *reason)
{
    if (j->stop && !j->oom) {
        const char *emit;
        size_t n;
        gpe_status st;
        gpe_stop_flush_status(j->stop, &emit, &n, &st);
        if (st != GPE_OK)
            j->oom = true;   /* an earlier piece was lost (job_step ends there) */
        else
            gguf_out_text(j, emit, n);
    }
    if (j->tools.tp && !j->oom) {
        const char *emit;
        size_t n;
        /* GPE_ERR_NOMEM: here or in an earlier feed, a call or text lost */
        if (gpe_toolparse_finish(j->tools.tp, &emit, &n) != GPE_OK) {
            j->oom = true;
        } else {
            if (n > 0)
                send_text(j, emit, n);
            send_calls(j);
            if (j->tools.n_sent > 0 && strcmp(reason, "stop") == 0)
                reason = "tool_calls";
        }
    }
    if (j->sink.metrics && !j->count_only && !j->oom && !send_metrics(j))
        j->oom = true;
    if (j->oom) {
        gguf_job_nomem(j, "producing the output");
        return;
    }
    j->sink.end(j->sink.ctx, reason, j->n_prompt, j->count_only ? 0 : j->n_gen);
}

int32_t *gguf_tokenize(gguf_backend *b, const char *text, int *n_out)
{
    size_t len = strlen(text);
    int cap = (int)(len < 1u << 24 ? len : 1u << 24) + 8;
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t)
        return NULL;
    int n = gpe_tokenize(b->model, text, len, true, true, t, cap);
    if (n < 0 && n != INT32_MIN) {
        cap = -n;
        int32_t *bigger = realloc(t, (size_t)cap * sizeof *t);
        if (!bigger) {
            free(t);
            return NULL;
        }
        t = bigger;
        n = gpe_tokenize(b->model, text, len, true, true, t, cap);
    }
    if (n < 0) {
        free(t);
        return NULL;
    }
    *n_out = n;
    return t;
}

/* Token-exact continuation: the prompt's tokens followed by the generated
 * ids of the previous attempts (never the text re-tokenized). */
static bool append_cont_ids(gjob *j)
{
    if (j->n_cont == 0)
        return true;
    int32_t *t = realloc(j->toks, (size_t)(j->n_toks + j->n_cont) * sizeof *t);
    if (!t)
        return false;
    memcpy(t + j->n_toks, j->cont_ids, (size_t)j->n_cont * sizeof *t);
    j->toks = t;
    j->n_toks += j->n_cont;
    return true;
}

/* The stop matcher of the lost attempt had fed the pieces of every id it
 * sampled and emitted the continuation text; what it still held back is
 * the rest. Give it to ours, so its next feed behaves as that one's would
 * have (a stop string straddling the junction is still found). Without a
 * continuation: nothing, but the matcher's first buffer is made here all
 * the same, where a failure costs the job nothing generated yet (a later
 * growth that fails ends the job out of memory: job_step). */
bool gguf_prime_stop(gguf_backend *b, gjob *j)
{
    gp_buf all = {0};
    bool ok = true;
    for (int i = 0; i < j->n_cont && ok; i++) {
        int n = gguf_piece(b, j, j->cont_ids[i], false);
        ok = n >= 0 && gp_buf_append(&all, j->piece, (size_t)n) == 0;
    }
    const char *sent = j->cont_text ? j->cont_text : "", *held = "";
    size_t ns = strlen(sent), nh = 0;
    if (ok && all.len >= ns && (ns == 0 || memcmp(all.data, sent, ns) == 0)) {
        held = all.data ? all.data + ns : "";
        nh = all.len - ns;
    } else if (ok) {
        gp_log_warn("continuation_mismatch", "job %s: the continuation ids do not render to the "
                    "continuation text; the stop matcher starts empty", j->job_id);
    }
    ok = ok && gpe_stop_prime(j->stop, held, nh) == 0;
    gp_buf_free(&all);
    return ok;
}

/* While the job is still pending (its slot is chosen from its tokens):
 * tokenize, and end here the jobs that need no slot (count_tokens) or
 * cannot run. Sets prepared; sets finished when the terminal event was
 * sent (the job is then only unlinked and freed). */

void gguf_job_prepare(gguf_backend *b, gjob *j)
{
    j->prepared = true;
    j->finished = true;
    if (j->emb_input) {
        gguf_job_embed(b, j);
        return;
    }
    j->toks = gguf_tokenize(b, j->text, &j->n_toks);
    if (!j->toks) {
        gguf_job_nomem(j, "tokenizing the prompt");
        return;
    }
    j->n_prompt = j->n_toks;
    if (!append_cont_ids(j)) {
        gguf_job_nomem(j, "appending the continuation ids");
        return;
    }
    if (j->sink.started)
        j->sink.started(j->sink.ctx);
    if (j->count_only) {
        gguf_job_end(j, "stop");
        return;
    }
    if (j->n_toks == 0) {
        gguf_job_error(j, "INVALID_REQUEST", "empty prompt");
        return;
    }
    if (j->n_toks >= b->n_ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "prompt has %d tokens; the context holds %d", j->n_toks,
                 b->n_ctx);
        gguf_job_error(j, "CONTEXT_OVERFLOW", msg);
        return;
    }
    j->finished = false;
}
