/*
 * libFuzzer target: the agent's reading of the server's /agents/work reply
 * as the openai backend sees it: every job object of {"jobs":[...]} goes
 * through build_request (src/agent/backend_openai.c, included for its
 * statics), which turns the server's job into the upstream request, and
 * through the bodies made from it for counting (openai_count.h) and for
 * embeddings (openai_embed.h). The
 * reply's other readers (agent_server.c ag_poll_done, agent_jobs.c
 * ag_work_done and job_begin) only take typed values through jansson
 * getters; this target covers the one that copies and reshapes the job's
 * content.
 * Checked: a job is either refused with a message or gives a JSON object
 * that serialises (what the backend then sends upstream); the count bodies
 * are NULL or objects that serialise.
 */
#include <stddef.h>
#include <stdint.h>

#include "agent/backend_openai.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* req (owned) must be a JSON object that serialises. */
static void check_object(json_t *req)
{
    if (!json_is_object(req))
        abort();
    char *s = gp_json_dumps(req);
    if (!s)
        abort();
    free(s);
    json_decref(req);
}

/* A body that may be absent (NULL), else as check_object. */
static void check_optional(json_t *req)
{
    if (req)
        check_object(req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *reply = json_loadb((const char *)data, size, 0, NULL);
    if (!reply)
        return 0;
    agent_options o;
    memset(&o, 0, sizeof o);
    o.upstream_model = "upstream-model";
    oai_backend b;
    memset(&b, 0, sizeof b);
    b.o = &o;
    json_t *jobs = json_object_get(reply, "jobs");
    size_t i;
    json_t *jj;
    json_array_foreach(jobs, i, jj)
    {
        char err[256] = "";
        bool chat = false;
        int n_inputs = 0;
        /* (no allocation fails here: a body refused is never out of memory) */
        bool cnm = false;
        check_optional(oai_count_tokenize_body(jj, o.upstream_model, &cnm));
        if (cnm)
            abort();
        check_optional(oai_count_messages_body(jj, o.upstream_model, &cnm));
        if (cnm)
            abort();
        check_optional(oai_count_template_body(jj, o.upstream_model, &cnm));
        if (cnm)
            abort();
        json_t *emb = oai_embed_request(o.upstream_model, jj, &n_inputs, err, sizeof err);
        if (emb)
            check_object(emb);
        else if (!err[0])
            abort();
        err[0] = '\0';
        bool nomem = false;
        json_t *req = build_request(&b, jj, &chat, &nomem, err, sizeof err);
        if (!req) {
            if (!err[0])
                abort();
            continue;
        }
        if (nomem) /* said only with no request */
            abort();
        check_object(req);
    }
    json_decref(reply);
    return 0;
}
