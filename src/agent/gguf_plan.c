/* gguf_plan: see gguf_plan.h. */
#include "agent/gguf_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)
#define PLAN_BATCH 256                 /* the backend's n_batch (prompt tokens per step) */
#define MARGIN_MIN (256ull << 20)      /* VRAM left free: at least 256 MiB ... */
#define MARGIN_DIV 20                  /* ... or 5% of what is free */

static double gib(uint64_t b)
{
    return (double)b / GIB;
}

void gguf_plan_free(gguf_plan *p)
{
    for (int e = 0; e < p->n_engines; e++) {
        gpe_model_free(p->engines[e].model);
        p->engines[e].model = NULL;
    }
    p->n_engines = 0;
}

gpe_ctx_params gguf_plan_ctx_params(const agent_options *o, const gguf_plan *p, int e,
                                    int n_batch)
{
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = p->n_ctx;
    cp.n_seq = p->engines[e].n_seq;
    cp.n_threads = (int)o->threads;
    cp.n_batch = n_batch + cp.n_seq;
    cp.kv_f16 = p->kv_f16;
    return cp;
}

static gpe_status load(const char *path, gpe_backend_kind be, int n_devices,
                       const int *devices, gpe_model **out, char *err, size_t errlen)
{
    gpe_model_params mp = gpe_model_default_params();
    mp.backend = be;
    if (n_devices == 1) {
        mp.gpu_device = devices[0];
    } else if (n_devices >= 2) {
        mp.n_devices = n_devices;
        memcpy(mp.devices, devices, (size_t)n_devices * sizeof *devices);
    }
    char e[384];
    gpe_status st = gpe_model_load(path, &mp, out, e, sizeof e);
    if (st != GPE_OK)
        snprintf(err, errlen, "model: %s (%s)", e, gpe_status_name(st));
    return st;
}

/* The slots engine e of n gets from --slots N (spread, the first ones
 * taking the remainder). */
static int given_slots(long long total, int e, int n)
{
    return (int)(total / n + (e < total % n ? 1 : 0));
}

gpe_status gguf_plan_cpu(const agent_options *o, gguf_plan *p, const char *why, char *err,
                         size_t errlen)
{
    gguf_plan_free(p);
    memset(p, 0, sizeof *p);
    p->backend = GPE_BACKEND_CPU;
    p->n_ctx = o->ctx_size > 0 ? (int)o->ctx_size : 0;
    p->kv_f16 = o->kv_f16 && strcmp(o->kv_f16, "on") == 0;
    snprintf(p->why, sizeof p->why, "%s", why);
    int slots = o->slots > 0 ? (int)o->slots : GGUF_PLAN_CPU_SLOTS;
    if (slots > 64)
        slots = 64;
    /* Tests only: GPUPOOL_TEST_ENGINES=N runs the CPU slots as N engines
     * (each its own context and decode thread), as N GPUs would, so that
     * CI without a GPU exercises slots spread over engines. */
    const char *te = getenv("GPUPOOL_TEST_ENGINES");
    int n = te && atoi(te) > 1 ? atoi(te) : 1;
    if (n > slots)
        n = slots;
    if (n > GPE_MAX_DEVICES)
        n = GPE_MAX_DEVICES;
    for (int e = 0; e < n; e++) {
        gpe_status st = load(o->model, GPE_BACKEND_CPU, 0, NULL, &p->engines[e].model, err,
                             errlen);
        if (st != GPE_OK) {
            gguf_plan_free(p);
            return st;
        }
        p->engines[e].n_seq = given_slots(slots, e, n);
        p->n_engines = e + 1;
    }
    return GPE_OK;
}

/* What a context of n_seq slots needs on each device of m's placement. */
static gpe_status estimate(const gguf_plan *p, gpe_model *m, int n_seq, gpe_vram_need *need,
                           int *n, char *err, size_t errlen)
{
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = p->n_ctx;
    cp.n_seq = n_seq;
    cp.n_batch = PLAN_BATCH + n_seq;
    cp.kv_f16 = p->kv_f16;
    return gpe_ctx_vram_estimate(m, &cp, need, n, err, errlen);
}

static uint64_t margin(uint64_t free_bytes)
{
    uint64_t m = free_bytes / MARGIN_DIV;
    return m > MARGIN_MIN ? m : MARGIN_MIN;
}

/* Whether every device has need + margin free; else a line with the
 * numbers of the first that has not (appended to msg). */
static bool fits(const gpe_vram_need *need, int n, int n_seq, int n_ctx, char *msg,
                 size_t msglen)
{
    for (int i = 0; i < n; i++) {
        const gpe_vram_need *d = &need[i];
        if (d->total + margin(d->free_bytes) <= d->free_bytes)
            continue;
        if (msg && msglen) {
            gpe_gpu_info gi;
            char e[128];
            bool named = gpe_gpu_info_get(d->device, &gi, e, sizeof e) == GPE_OK;
            size_t used = strlen(msg);
            snprintf(msg + used, msglen - used,
                     "%sdevice %d%s%s%s needs %.2f GiB (weights %.2f, KV %.2f for %d slot(s) of "
                     "%d positions, scratch %.2f, reserve %.2f) plus a margin of %.2f GiB; "
                     "%.2f GiB free",
                     used ? "; " : "", d->device, named ? " (" : "", named ? gi.name : "",
                     named ? ")" : "", gib(d->total), gib(d->weights), gib(d->kv), n_seq, n_ctx,
                     gib(d->scratch), gib(d->reserve), gib(margin(d->free_bytes)),
                     gib(d->free_bytes));
        }
        return false;
    }
    return true;
}

/* Slots of an engine with --slots auto: as many as fit after the margin
 * (the KV cache grows by the same bytes per slot), 1..AUTO_SLOTS_MAX.
 * 0 when not even one fits (msg says why). */
static int auto_slots(const gguf_plan *p, gpe_model *m, char *msg, size_t msglen)
{
    gpe_vram_need one[GPE_MAX_DEVICES], two[GPE_MAX_DEVICES];
    int n1 = 0, n2 = 0;
    char e[256];
    if (estimate(p, m, 1, one, &n1, e, sizeof e) != GPE_OK) {
        snprintf(msg, msglen, "%s", e);
        return 0;
    }
    if (!fits(one, n1, 1, p->n_ctx, msg, msglen))
        return 0;
    if (estimate(p, m, 2, two, &n2, e, sizeof e) != GPE_OK || n2 != n1)
        return 1;
    long long best = GGUF_PLAN_AUTO_SLOTS_MAX;
    for (int i = 0; i < n1; i++) {
        uint64_t per = two[i].total > one[i].total ? two[i].total - one[i].total : 0;
        uint64_t room = one[i].free_bytes - margin(one[i].free_bytes) - one[i].total;
        long long k = per ? 1 + (long long)(room / per) : GGUF_PLAN_AUTO_SLOTS_MAX;
        if (k < best)
            best = k;
    }
    /* The estimate is linear in slots but confirm it (rounding, scratch). */
    for (int k = (int)best; k > 1; k--) {
        gpe_vram_need nk[GPE_MAX_DEVICES];
        int n = 0;
        if (estimate(p, m, k, nk, &n, e, sizeof e) == GPE_OK && fits(nk, n, k, p->n_ctx, NULL, 0))
            return k;
    }
    return 1;
}

/* Does an engine of n_seq slots fit m? 1 yes, 0 no (msg), -1 estimate failed (msg). */
static int engine_fits(const gguf_plan *p, gpe_model *m, int n_seq, char *msg, size_t msglen)
{
    gpe_vram_need need[GPE_MAX_DEVICES];
    int n = 0;
    char e[256];
    if (estimate(p, m, n_seq, need, &n, e, sizeof e) != GPE_OK) {
        snprintf(msg, msglen, "%s", e);
        return -1;
    }
    return fits(need, n, n_seq, p->n_ctx, msg, msglen) ? 1 : 0;
}

/* The CUDA devices the plan may use: --devices, checked against the count. */
static int plan_devices(const agent_options *o, int count, int *dev, char *err, size_t errlen)
{
    int n = agent_devices_parse(o->devices, dev, err, errlen);
    if (n < 0)
        return -1;
    if (n == 0) {
        for (int i = 0; i < count && i < GPE_MAX_DEVICES; i++)
            dev[i] = i;
        return count < GPE_MAX_DEVICES ? count : GPE_MAX_DEVICES;
    }
    for (int i = 0; i < n; i++)
        if (dev[i] >= count) {
            snprintf(err, errlen, "devices: CUDA device %d does not exist (%d visible: 0..%d)",
                     dev[i], count, count - 1);
            return -1;
        }
    return n;
}

/* One engine per device the model fits on. Returns how many (0: none;
 * msg has the numbers), -1 on a load failure (err, its status in *st). */
static int plan_per_gpu(const agent_options *o, gguf_plan *p, const int *dev, int ndev,
                        char *msg, size_t msglen, gpe_status *st, char *err, size_t errlen)
{
    bool auto_n = o->slots <= 0;
    int want = auto_n ? ndev : (int)(o->slots < ndev ? o->slots : ndev);
    for (int i = 0; i < ndev && p->n_engines < want; i++) {
        gpe_model *m = NULL;
        if ((*st = load(o->model, GPE_BACKEND_CUDA, 1, &dev[i], &m, err, errlen)) != GPE_OK)
            return -1;
        int k = auto_n ? auto_slots(p, m, msg, msglen)
                       : (engine_fits(p, m, given_slots(o->slots, p->n_engines, want), msg,
                                      msglen) == 1
                              ? given_slots(o->slots, p->n_engines, want)
                              : 0);
        if (k <= 0) {
            gpe_model_free(m);
            continue;
        }
        gguf_plan_engine *e = &p->engines[p->n_engines++];
        e->model = m;
        e->n_devices = 1;
        e->devices[0] = dev[i];
        e->n_seq = k;
    }
    /* --slots N with fewer engines than planned: respread over those that fit. */
    for (int e = 0; !auto_n && e < p->n_engines; e++)
        p->engines[e].n_seq = given_slots(o->slots, e, p->n_engines);
    return p->n_engines;
}

/* One engine split by layers over every device (the model fits on none
 * alone). 1 planned, 0 does not fit (msg), -1 load failure (err, its
 * status in *st). */
static int plan_split(const agent_options *o, gguf_plan *p, const int *dev, int ndev, char *msg,
                      size_t msglen, gpe_status *st, char *err, size_t errlen)
{
    gpe_model *m = NULL;
    if ((*st = load(o->model, GPE_BACKEND_CUDA, ndev, dev, &m, err, errlen)) != GPE_OK)
        return -1;
    int k = o->slots <= 0 ? auto_slots(p, m, msg, msglen)
                          : (engine_fits(p, m, (int)o->slots, msg, msglen) == 1 ? (int)o->slots
                                                                                  : 0);
    if (k <= 0) {
        gpe_model_free(m);
        return 0;
    }
    gguf_plan_engine *e = &p->engines[p->n_engines++];
    e->model = m;
    e->n_devices = ndev;
    memcpy(e->devices, dev, (size_t)ndev * sizeof *dev);
    e->n_seq = k;
    return 1;
}

/* The context per slot on a GPU: --ctx, else the model's training
 * context capped (a 128k-context model would otherwise give one slot).
 * 0 with err when memory ran out reading it: the cap in its place would
 * be a quietly different configuration. A file that does not load at all
 * gets the cap here and fails with its own message when the weights load. */
static int gpu_ctx(const agent_options *o, char *err, size_t errlen)
{
    if (o->ctx_size > 0)
        return (int)o->ctx_size;
    gpe_model *m = NULL;
    char e[256];
    gpe_model_params mp = gpe_model_default_params();
    mp.vocab_only = true;
    int n = 0;
    gpe_status st = gpe_model_load(o->model, &mp, &m, e, sizeof e);
    if (st == GPE_ERR_NOMEM) {
        snprintf(err, errlen, "model: %s (%s)", e, gpe_status_name(st));
        return 0;
    }
    if (st == GPE_OK) {
        /* metadata only (no weights read): ARCH.context_length */
        gpe_model_info info;
        gpe_model_get_info(m, &info);
        char key[128], val[64];
        snprintf(key, sizeof key, "%s.context_length", info.arch ? info.arch : "llama");
        if (gpe_model_meta_str(m, key, val, sizeof val))
            n = atoi(val);
        gpe_model_free(m);
    }
    if (n <= 0 || n > GGUF_PLAN_AUTO_CTX_MAX)
        n = GGUF_PLAN_AUTO_CTX_MAX;
    return n;
}

static void describe_cuda(gguf_plan *p, const char *extra)
{
    size_t used = (size_t)snprintf(p->why, sizeof p->why, "cuda: ");
    int slots = 0;
    for (int e = 0; e < p->n_engines; e++)
        slots += p->engines[e].n_seq;
    if (p->n_engines == 1 && p->engines[0].n_devices >= 2) {
        used += (size_t)snprintf(p->why + used, sizeof p->why - used,
                                 "the model is split by layers over devices");
        for (int d = 0; d < p->engines[0].n_devices && used < sizeof p->why; d++)
            used += (size_t)snprintf(p->why + used, sizeof p->why - used, "%s%d", d ? "," : " ",
                                     p->engines[0].devices[d]);
    } else {
        used += (size_t)snprintf(p->why + used, sizeof p->why - used, "one engine on each of "
                                 "device(s)");
        for (int e = 0; e < p->n_engines && used < sizeof p->why; e++)
            used += (size_t)snprintf(p->why + used, sizeof p->why - used, "%s%d",
                                     e ? "," : " ", p->engines[e].devices[0]);
    }
    if (used < sizeof p->why)
        snprintf(p->why + used, sizeof p->why - used,
                 "; %d slot(s) of %d positions, %s KV cache%s%s", slots, p->n_ctx,
                 p->kv_f16 ? "F16" : "F32", extra && *extra ? "; " : "", extra ? extra : "");
}

gpe_status gguf_plan_make(const agent_options *o, gguf_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    /* NULL: options filled by hand (tests, benchmarks): the CPU, as before
     * backends existed. The option table's default is auto. */
    const char *be = o->backend ? o->backend : "cpu";
    if (strcmp(be, "cpu") == 0)
        return gguf_plan_cpu(o, out, "cpu: --backend cpu", err, errlen);
    bool must = strcmp(be, "cuda") == 0;
    char why[384] = "", line[1280];
    /* Number the devices as nvidia-smi and NVML do (CUDA's default puts
     * the fastest first), so that --devices 1 is nvidia-smi's GPU 1.
     * Before the CUDA runtime loads; single-threaded here (start-up). */
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    int count = gpe_gpu_count(why, sizeof why);
    if (count <= 0) {
        if (must) {
            snprintf(err, errlen, "backend cuda: no usable GPU: %s", why[0] ? why : "none found");
            return GPE_ERR_BACKEND;
        }
        snprintf(line, sizeof line, "cpu: no usable GPU (%s)", why[0] ? why : "none found");
        return gguf_plan_cpu(o, out, line, err, errlen);
    }
    int dev[GPE_MAX_DEVICES];
    int ndev = plan_devices(o, count, dev, err, errlen);
    if (ndev < 0)
        return GPE_ERR_ARG;
    out->backend = GPE_BACKEND_CUDA;
    if ((out->n_ctx = gpu_ctx(o, err, errlen)) <= 0)
        return GPE_ERR_NOMEM;
    out->kv_f16 = !(o->kv_f16 && strcmp(o->kv_f16, "off") == 0);
    char msg[1024] = "";
    gpe_status st = GPE_OK;
    int r = plan_per_gpu(o, out, dev, ndev, msg, sizeof msg, &st, err, errlen);
    if (r < 0)
        goto fail;
    if (r > 0) {
        describe_cuda(out, ndev > r ? "the model does not fit on the other device(s)" : "");
        return GPE_OK;
    }
    if (ndev >= 2) {
        char smsg[1024] = "";
        r = plan_split(o, out, dev, ndev, smsg, sizeof smsg, &st, err, errlen);
        if (r < 0)
            goto fail;
        if (r > 0) {
            describe_cuda(out, "it fits on no single device");
            return GPE_OK;
        }
        size_t used = strlen(msg);
        snprintf(msg + used, sizeof msg - used, "; split over %d devices: %s", ndev, smsg);
    }
    if (must) {
        out->refused = true;
        snprintf(out->why, sizeof out->why, "the model does not fit in VRAM: %.1200s", msg);
        return GPE_OK;
    }
    snprintf(line, sizeof line, "cpu: the model does not fit in VRAM (%.1200s)", msg);
    return gguf_plan_cpu(o, out, line, err, errlen);
fail:
    gguf_plan_free(out);
    /* Memory that ran out is no reason to run on the CPU instead (a
     * quietly different configuration): the caller may try again. */
    if (must || st == GPE_ERR_NOMEM)
        return st;
    /* auto: a CUDA load that fails (the plugin, the driver) is the CPU;
     * a file that does not load fails there too, with its own message. */
    snprintf(line, sizeof line, "cpu: the model does not load on CUDA (%.1000s)", err);
    return gguf_plan_cpu(o, out, line, err, errlen);
}
