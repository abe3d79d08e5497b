/* gpupool-run: helpers shared by the subcommands (see run.h). */
#include "run/run.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

bool gpr_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0') {
        fprintf(stderr, "gpupool-run %s: %s: '%s' is not an integer\n", cmd, opt, s);
        return false;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "gpupool-run %s: %s: %ld is out of range [%ld, %ld]\n", cmd, opt, v, lo,
                hi);
        return false;
    }
    *out = v;
    return true;
}

bool gpr_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi,
                     double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v)) {
        fprintf(stderr, "gpupool-run %s: %s: '%s' is not a number\n", cmd, opt, s);
        return false;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "gpupool-run %s: %s: %g is out of range [%g, %g]\n", cmd, opt, v, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool gpr_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-') {
        fprintf(stderr, "gpupool-run %s: %s: '%s' must not be negative\n", cmd, opt, s);
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end != '\0') {
        fprintf(stderr, "gpupool-run %s: %s: '%s' is not an unsigned integer\n", cmd, opt, s);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

bool gpr_parse_devices(const char *cmd, const char *s, int *out, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 1024 || (*end != ',' && *end != '\0') ||
            *n >= GPE_MAX_DEVICES) {
            fprintf(stderr,
                    "gpupool-run %s: --devices: '%s' is not a list of 1 to %d device indexes "
                    "(e.g. 0,1)\n", cmd, s, GPE_MAX_DEVICES);
            return false;
        }
        out[(*n)++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && !*p) {
            fprintf(stderr, "gpupool-run %s: --devices: '%s' ends with a comma\n", cmd, s);
            return false;
        }
    }
    if (*n == 0) {
        fprintf(stderr, "gpupool-run %s: --devices: empty list\n", cmd);
        return false;
    }
    return true;
}

static gpe_model *load(const char *cmd, const char *path, bool vocab_only, bool cuda,
                       int device, const char *devices)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "gpupool-run %s: %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    char err[512];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    mp.vocab_only = vocab_only;
    mp.backend = cuda ? GPE_BACKEND_CUDA : GPE_BACKEND_CPU;
    mp.gpu_device = device;
    if (devices && !gpr_parse_devices(cmd, devices, mp.devices, &mp.n_devices))
        return NULL;
    gpe_status st = gpe_model_load(path, &mp, &m, err, sizeof err);
    if (st != GPE_OK) {
        fprintf(stderr, "gpupool-run %s: cannot load model (%s): %s\n", cmd, gpe_status_name(st),
                err);
        return NULL;
    }
    return m;
}

gpe_model *gpr_load_model(const char *cmd, const char *path, bool vocab_only)
{
    return load(cmd, path, vocab_only, false, 0, NULL);
}

gpe_model *gpr_load_model_on(const char *cmd, const char *path, const char *backend, int device,
                             const char *devices)
{
    return load(cmd, path, false, backend && strcmp(backend, "cuda") == 0, device, devices);
}

bool gpr_check_backend(const char *cmd, const char *s)
{
    if (strcmp(s, "cpu") == 0 || strcmp(s, "cuda") == 0)
        return true;
    fprintf(stderr, "gpupool-run %s: --backend must be cpu or cuda (got '%s')\n", cmd, s);
    return false;
}

double gpr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t gpr_utf8_complete(const char *s, size_t n)
{
    /* Look at most 3 bytes back for the start of a sequence that is cut. */
    size_t i = n;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80)
            continue;              /* continuation: keep looking */
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        if (need > back)
            i = n - back;          /* lead byte whose sequence is not complete yet */
        break;
    }
    return i;
}

int gpr_piece(const gpe_model *m, int32_t tok, bool special, char **buf, size_t *cap)
{
    if (!*buf) {
        *buf = malloc(256);   /* nearly every token fits: one growth at most */
        if (!*buf)
            return -1;
        *cap = 256;
    }
    int n = gpe_token_to_piece(m, tok, *buf, *cap, special);
    if (n >= 0 || n == INT32_MIN)
        return n >= 0 ? n : -1;
    size_t need = (size_t)-(int64_t)n;
    char *p = realloc(*buf, need);
    if (!p)
        return -1;
    *buf = p;
    *cap = need;
    n = gpe_token_to_piece(m, tok, *buf, *cap, special);
    return n >= 0 ? n : -1;
}

const char *gpr_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}
