/*
 * bench_sched: the scheduler's decision cost with prefix routing, at 1,000
 * and 10,000 ready agents that each advertise one slot holding a
 * 20-message conversation (every one starting with the same system
 * prompt, the worst case for the index's first-unit bucket). Per decision
 * (sched_submit of one job), p50 and p99 in microseconds, for:
 *   - no chain (prefix routing has nothing to do: the round-robin baseline),
 *   - a conversation's next turn (hit: routed to its holder),
 *   - a new conversation sharing only the system prompt (miss: every probed
 *     depth looked up, then round robin).
 * The chain itself is computed once per job by jobs.c (hashing the
 * messages; printed separately). Printed, never asserted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gp_prefix.h"
#include "server/fleet/sched.h"

#define TURNS 20
#define DECISIONS 20000

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Conversation k, first n messages (system + alternating turns). */
static json_t *conversation(int k, int n)
{
    json_t *msgs = json_array();
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content",
                                          "You are a coding agent. Follow the rules."));
    for (int i = 1; i < n; i++) {
        char text[96];
        snprintf(text, sizeof text, "conversation %d turn %d: some words of the turn", k, i);
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", i % 2 ? "user" : "assistant",
                                              "content", text));
    }
    return json_pack("{s:o}", "messages", msgs);
}

static void chain_of(int k, int n, gp_prefix_chain *c)
{
    json_t *job = conversation(k, n);
    if (gp_prefix_chain_of_job(job, c) != 0) {
        fprintf(stderr, "bench_sched: chain failed\n");
        exit(1);
    }
    json_decref(job);
}

static void run(int n_agents)
{
    registry_config rc;
    registry_config_default(&rc);
    registry *reg = registry_create(&rc);
    sched_config sc;
    sched_config_default(&sc);
    sched *s = sched_create(reg, &sc);
    registry_agent **ag = calloc((size_t)n_agents, sizeof *ag);
    double t_chain = 0;
    for (int i = 0; i < n_agents; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"agent_id\":\"00000000-0000-4000-8000-%012d\",\"name\":\"a%d\","
                 "\"models\":[{\"id\":\"m1\"}],\"slots\":{\"total\":1}}",
                 i, i);
        json_t *j = json_loads(body, 0, NULL);
        registry_facts f;
        char err[128];
        if (registry_facts_parse(j, &f, err, sizeof err) != 0) {
            fprintf(stderr, "bench_sched: %s\n", err);
            exit(1);
        }
        json_decref(j);
        ag[i] = registry_heartbeat(reg, &f, 1000000, 0);
        registry_facts_free(&f);
        sched_agent_ready(s, ag[i], 1);
        gp_prefix_chain c;
        double t0 = now_us();
        chain_of(i, TURNS, &c);
        t_chain += now_us() - t0;
        gp_prefix_desc d;
        gp_prefix_desc_of_chain(&c, &d);
        json_t *pc = json_pack("{s:b,s:[{s:i,s:b,s:i,s:o}]}", "enabled", 1, "slots", "slot", 0,
                               "busy", 0, "tokens", 4000, "prefix", gp_prefix_desc_json(&d));
        registry_agent_set_prefix(ag[i], pc, err, sizeof err);
        sched_agent_update(s, ag[i]);
        json_decref(pc);
        gp_prefix_chain_free(&c);
    }
    /* The jobs: next turns of conversations (hit), new conversations (miss). */
    enum { NJ = 256 };
    gp_prefix_chain hit[NJ], miss[NJ];
    for (int k = 0; k < NJ; k++) {
        chain_of(k * (n_agents / NJ), TURNS + 2, &hit[k]);
        chain_of(n_agents + k, 2, &miss[k]);
    }
    const char *names[] = {"no chain (baseline)", "next turn (hit)", "new conversation (miss)"};
    double *t = malloc(sizeof(double) * DECISIONS);
    for (int mode = 0; mode < 3; mode++) {
        long hits = 0;
        for (int i = 0; i < DECISIONS; i++) {
            sched_job j;
            memset(&j, 0, sizeof j);
            j.model = "m1";
            j.prefer_strict = -1;
            j.prefix = mode == 0 ? NULL : mode == 1 ? &hit[i % NJ] : &miss[i % NJ];
            registry_agent *a = NULL;
            double t0 = now_us();
            sched_result r = sched_submit(s, &j, 1000000, &a);
            t[i] = now_us() - t0;
            if (r != SCHED_ASSIGNED) {
                fprintf(stderr, "bench_sched: not assigned\n");
                exit(1);
            }
            hits += j.prefix_units > 0;
            registry_job_end(reg, a, true, 0);
            sched_agent_ready(s, a, 1);
        }
        qsort(t, DECISIONS, sizeof *t, cmp_d);
        printf("%6d agents  %-26s p50 %6.2f us  p99 %6.2f us  (routed by prefix: %ld of %d)\n",
               n_agents, names[mode], t[DECISIONS / 2], t[DECISIONS * 99 / 100], hits,
               DECISIONS);
    }
    printf("%6d agents  chain of a %d-message job: %.2f us (computed once per job)\n", n_agents,
           TURNS, t_chain / n_agents);
    free(t);
    for (int k = 0; k < NJ; k++) {
        gp_prefix_chain_free(&hit[k]);
        gp_prefix_chain_free(&miss[k]);
    }
    sched_destroy(s);
    registry_destroy(reg);
    free(ag);
}

int main(void)
{
    run(1000);
    run(10000);
    return 0;
}
