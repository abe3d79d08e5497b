/*
 * gpupool-run: command-line front of the engine (generate, tokenize, info,
 * bench, selftest), like llama-cli / llama-bench without any server.
 *
 * One file per subcommand (cmd_*.c), each exporting a descriptor; main.c
 * dispatches on argv[1]. Helpers shared by the subcommands live in util.c.
 * Exit codes: 0 success, 1 runtime failure (file missing, bad model), 2
 * usage error (bad option or number).
 */
#ifndef GPR_RUN_H
#define GPR_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gpupool/engine.h"

typedef struct gpr_cmd {
    const char *name;
    const char *summary;                 /* one line for the top-level usage */
    int (*exec)(int argc, char **argv);  /* argv[0] is the subcommand name */
    void (*usage)(FILE *out);
} gpr_cmd;

extern const gpr_cmd gpr_cmd_generate;
extern const gpr_cmd gpr_cmd_tokenize;
extern const gpr_cmd gpr_cmd_info;
extern const gpr_cmd gpr_cmd_bench;
extern const gpr_cmd gpr_cmd_selftest;

/* Number parsing for options: the whole string must be a number inside
 * [lo, hi]; otherwise prints "gpupool-run CMD: OPT: ..." and returns false. */
bool gpr_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
bool gpr_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi,
                     double *out);
bool gpr_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);

/* Loads a model, printing a clear message on failure (NULL then).
 * backend: NULL or "cpu" for the CPU, "cuda" for the CUDA backend (device
 * `device`, or the devices of `devices`, a --devices list: "0,1" splits
 * the layers over devices 0 and 1; NULL = just `device`). */
gpe_model *gpr_load_model(const char *cmd, const char *path, bool vocab_only);
gpe_model *gpr_load_model_on(const char *cmd, const char *path, const char *backend,
                             int device, const char *devices);
/* Parses a --devices list (comma-separated device indexes, 1 to
 * GPE_MAX_DEVICES of them, repeats allowed); prints the error. */
bool gpr_parse_devices(const char *cmd, const char *s, int *out, int *n);
/* Validates a --backend value ("cpu" or "cuda"); prints the error. */
bool gpr_check_backend(const char *cmd, const char *s);

/* Monotonic seconds. */
double gpr_now(void);

/* Number of leading bytes of s[0..n) that form complete UTF-8 sequences
 * (an incomplete sequence at the end is held back; invalid bytes count as
 * complete so that nothing is held forever). */
size_t gpr_utf8_complete(const char *s, size_t n);

/* The text of token tok into *buf, however long: a vocabulary's token may
 * be any length (real ones have long whitespace runs), and a fixed buffer
 * lost the text of one longer than it (-(needed) taken for ""). *buf (NULL
 * at first, *cap 0) grows to the longest token met; the caller frees it.
 * Returns the length, or -1 when memory ran out (the growth, or the
 * tokenizer's own scratch: INT32_MIN). */
int gpr_piece(const gpe_model *m, int32_t tok, bool special, char **buf, size_t *cap);

/* Human-readable byte count ("1.23 MiB") into buf. */
const char *gpr_bytes(uint64_t n, char *buf, size_t len);

#endif
