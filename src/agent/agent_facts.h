/*
 * agent_facts: what the agent reports about its host in /agents/poll.
 *
 * GPUs come from NVML, loaded at run time with dlopen("libnvidia-ml.so.1")
 * (never linked: the agent must run on hosts without NVIDIA drivers); a host
 * without it reports "gpus": [] and its CPU under "cpu".
 */
#ifndef AGENT_FACTS_H
#define AGENT_FACTS_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* Facts that do not change while the agent runs: {"platform":"linux-x86_64",
 * "cpu":{"vendor":"cpu","name":...,"cores":N}}. New reference. */
json_t *agent_facts_static(void);
/* Live GPU list (NVML), [] when NVML is absent or fails. New reference;
 * NULL only when memory ran out (never a GPU or a figure left out).
 * Each entry: vendor, index (NVML's, as nvidia-smi shows), name,
 * vram_total/used/free (bytes), utilization (0..1), temperature (C),
 * power_w, pci_bus_id ("0000:3b:00.0", lower case), driver,
 * compute_capability; a figure NVML cannot give is absent. The gguf
 * backend adds what it knows of the GPUs it uses (vram_model, state,
 * cuda_device) in its poll_facts. Call from one thread only (the agent
 * loop). */
json_t *agent_facts_gpus(void);

/* SHA-256 (64 lowercase hex chars) of the model file at path, reported as
 * the model's "digest" in /agents/poll: agents with the same digest run the
 * same weights and tokenizer, so a job can continue from token ids on
 * another one (docs/protocol.md). Hashing a multi-GB file takes seconds, so
 * the result is cached in state_dir/model-digests.json keyed by the file's
 * real path, size and mtime (state_dir NULL: no cache). *from_cache says
 * whether it was. Returns 0, or -1 with a message in err. */
int agent_model_digest(const char *path, const char *state_dir, char out[65], bool *from_cache,
                       char *err, size_t errlen);

/* Record sha256 (64 lower-case hex) as path's digest in state_dir's cache,
 * keyed by the file's current size and mtime: a file this agent has just
 * downloaded and verified need not be hashed again at load. Best effort. */
void agent_model_digest_remember(const char *path, const char *state_dir, const char *sha256);

#endif
