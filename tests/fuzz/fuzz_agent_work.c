/*
 * libFuzzer target: the agent's reading of the server's /agents/work reply
 * as the openai backend sees it: every job object of {"jobs":[...]} goes
 * through build_request (src/agent/backend_openai.c, included for its
 * statics), which turns the server's job into the upstream request. The
 * reply's other readers (agent.c poll_done/work_done/job_begin) only take
 * typed values through jansson getters; this target covers the one that
 * copies and reshapes the job's content.
 * Checked: a job is either refused with a message or gives a JSON object
 * that serialises (what the backend then sends upstream).
 */
#include <stddef.h>
#include <stdint.h>

#include "agent/backend_openai.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
        bool chat = false, count = false;
        json_t *req = build_request(&b, jj, &chat, &count, err, sizeof err);
        if (!req) {
            if (!err[0])
                abort();
            continue;
        }
        if (!json_is_object(req))
            abort();
        char *s = json_dumps(req, JSON_COMPACT);
        if (!s)
            abort();
        free(s);
        json_decref(req);
    }
    json_decref(reply);
    return 0;
}
