/*
 * agent_facts: what the agent reports about its host in /agents/poll.
 *
 * GPUs come from NVML, loaded at run time with dlopen("libnvidia-ml.so.1")
 * (never linked: the agent must run on hosts without NVIDIA drivers); a host
 * without it reports "gpus": [] and its CPU under "cpu".
 */
#ifndef AGENT_FACTS_H
#define AGENT_FACTS_H

#include <jansson.h>

/* Facts that do not change while the agent runs: {"platform":"linux-x86_64",
 * "cpu":{"vendor":"cpu","name":...,"cores":N}}. New reference. */
json_t *agent_facts_static(void);
/* Live GPU list (NVML), [] when NVML is absent or fails. New reference.
 * Call from one thread only (the agent loop). */
json_t *agent_facts_gpus(void);

#endif
