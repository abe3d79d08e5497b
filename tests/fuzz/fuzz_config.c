/*
 * libFuzzer target: the configuration layer (src/common/gp_config.c) with
 * the real option tables of the server (gps_config_load) and the agent
 * (agent_config_load): a config file of arbitrary bytes plus arbitrary
 * flags and environment entries, then --print-config's printer.
 *
 * Input: byte 0 bit 0 picks the agent's table (else the server's); then the
 * file text up to the first NUL; then NUL-separated words, each a flag
 * (argv) or, when it starts with "GPUPOOL_", an environment entry. Words
 * naming another config file are dropped (the fuzzer must not read the
 * machine's files). The file is a memfd, read through /proc/self/fd.
 * Checked: a refusal names what is wrong; everything is freed
 * (gp_config_free, even on error, as the headers say).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent/agent_config.h"
#include "common/gp_config.h"
#include "server/server_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_WORDS 24

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    devnull = fopen("/dev/null", "w");
    return devnull ? 0 : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const bool agent = data[0] & 1;
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    const char *nul = memchr(p, '\0', (size_t)(end - p));
    const char *file_end = nul ? nul : end;

    int fd = memfd_create("fuzz_config", 0);
    if (fd < 0)
        abort();
    size_t flen = (size_t)(file_end - p);
    if (flen && write(fd, p, flen) != (ssize_t)flen)
        abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    /* copy of the words, NUL-terminated */
    size_t wlen = nul ? (size_t)(end - nul - 1) : 0;
    char *words = malloc(wlen + 1);
    if (!words)
        abort();
    if (wlen)
        memcpy(words, nul + 1, wlen);
    words[wlen] = '\0';
    char *argv[MAX_WORDS + 4];
    char *envp[MAX_WORDS + 1];
    int argc = 0, envc = 0;
    argv[argc++] = agent ? "gpupool-agent" : "gpupool-server";
    argv[argc++] = "--config";
    argv[argc++] = path;
    for (char *w = words; w < words + wlen && argc < MAX_WORDS + 3; w += strlen(w) + 1) {
        if (strstr(w, "config") || strstr(w, "CONFIG"))
            continue;
        if (strncmp(w, "GPUPOOL_", 8) == 0 && envc < MAX_WORDS)
            envp[envc++] = w;
        else
            argv[argc++] = w;
    }
    argv[argc] = NULL;
    envp[envc] = NULL;

    char err[512] = "";
    gp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    /* Both outlive the gp_config, which points into them until freed. */
    agent_options ao;
    gps_config so;
    memset(&ao, 0, sizeof ao);
    memset(&so, 0, sizeof so);
    int rc = agent ? agent_config_load(&ao, &cfg, argc, argv, envp, err, sizeof err)
                   : gps_config_load(&so, &cfg, argc, argv, envp, err, sizeof err);
    if (rc < 0 && !err[0])
        abort();
    if (rc == 0 && cfg.table)
        gp_config_print(&cfg, devnull);
    gp_config_free(&cfg);
    free(words);
    close(fd);
    return 0;
}
