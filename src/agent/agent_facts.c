/* agent_facts: see agent_facts.h. */
#include "agent/agent_facts.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/gp_json.h"
#include "common/gp_log.h"
#include "common/gp_util.h"

/* ---------------------------------------------------------------------------
 * CPU and platform
 * ------------------------------------------------------------------------ */

static json_t *cpu_facts(void)
{
    char name[256] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0)
                continue;
            char *c = strchr(line, ':');
            if (!c)
                continue;
            c++;
            while (*c == ' ' || *c == '\t')
                c++;
            c[strcspn(c, "\n")] = '\0';
            snprintf(name, sizeof name, "%s", c);
            break;
        }
        fclose(f);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    json_t *n = json_string(name[0] ? name : "unknown");
    if (!n)
        n = json_string("unknown");
    return json_pack("{s:s,s:o,s:I}", "vendor", "cpu", "name", n, "cores",
                     (json_int_t)(cores > 0 ? cores : 1));
}

json_t *agent_facts_static(void)
{
    struct utsname u;
    char platform[160] = "unknown";
    if (uname(&u) == 0) {
        snprintf(platform, sizeof platform, "%s-%s", u.sysname, u.machine);
        for (char *p = platform; *p; p++)
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
    }
    return json_pack("{s:s,s:o}", "platform", platform, "cpu", cpu_facts());
}

/* ---------------------------------------------------------------------------
 * NVML through dlopen. Only the few entry points we need, declared here with
 * the ABI NVML documents (facts, not code: types are opaque pointers and
 * plain structs of unsigned long long / unsigned int).
 * ------------------------------------------------------------------------ */

typedef void *nvml_device;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;
/* nvmlPciInfo_t (v3): the legacy 16-byte bus id, domain, bus, device,
 * two ids, then the 32-byte "00000000:3B:00.0" bus id. */
typedef struct {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
} nvml_pci;

static struct {
    int state; /* 0 untried, 1 ready, -1 absent */
    void *lib;
    int (*init)(void);
    int (*count)(unsigned int *);
    int (*handle)(unsigned int, nvml_device *);
    int (*name)(nvml_device, char *, unsigned int);
    int (*memory)(nvml_device, nvml_memory *);
    int (*util)(nvml_device, nvml_utilization *);
    int (*temp)(nvml_device, int, unsigned int *);
    int (*driver)(char *, unsigned int);
    int (*cc)(nvml_device, int *, int *);
    int (*power)(nvml_device, unsigned int *);   /* milliwatts */
    int (*pci)(nvml_device, nvml_pci *);
} nv;

static void nvml_load(void)
{
    nv.state = -1;
    nv.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nv.lib)
        return;
#define SYM(field, name) *(void **)(&nv.field) = dlsym(nv.lib, name)
    SYM(init, "nvmlInit_v2");
    SYM(count, "nvmlDeviceGetCount_v2");
    SYM(handle, "nvmlDeviceGetHandleByIndex_v2");
    SYM(name, "nvmlDeviceGetName");
    SYM(memory, "nvmlDeviceGetMemoryInfo");
    SYM(util, "nvmlDeviceGetUtilizationRates");
    SYM(temp, "nvmlDeviceGetTemperature");
    SYM(driver, "nvmlSystemGetDriverVersion");
    SYM(cc, "nvmlDeviceGetCudaComputeCapability");
    SYM(power, "nvmlDeviceGetPowerUsage");
    SYM(pci, "nvmlDeviceGetPciInfo_v3");
#undef SYM
    if (!nv.init || !nv.count || !nv.handle || nv.init() != 0) {
        dlclose(nv.lib);
        nv.lib = NULL;
        return;
    }
    nv.state = 1;
}

/* One GPU's facts, whole or NULL (out of memory): a figure NVML gives
 * that memory ran out copying would read as one NVML cannot give. */
static json_t *gpu_facts(nvml_device d, unsigned int i, const char *driver)
{
    json_t *g = json_pack("{s:s,s:I}", "vendor", "nvidia", "index", (json_int_t)i);
    int rc = g ? 0 : -1;
    char name[128] = "";
    if (rc == 0 && nv.name && nv.name(d, name, sizeof name) == 0)
        rc = json_object_set_new(g, "name", json_string(name));
    nvml_memory m;
    if (rc == 0 && nv.memory && nv.memory(d, &m) == 0 &&
        (json_object_set_new(g, "vram_total", json_integer((json_int_t)m.total)) < 0 ||
         json_object_set_new(g, "vram_used", json_integer((json_int_t)m.used)) < 0 ||
         json_object_set_new(g, "vram_free", json_integer((json_int_t)m.free)) < 0))
        rc = -1;
    nvml_utilization u;
    if (rc == 0 && nv.util && nv.util(d, &u) == 0)
        rc = json_object_set_new(g, "utilization", json_real(u.gpu / 100.0));
    unsigned int t = 0;
    if (rc == 0 && nv.temp && nv.temp(d, 0 /* NVML_TEMPERATURE_GPU */, &t) == 0)
        rc = json_object_set_new(g, "temperature", json_integer(t));
    unsigned int mw = 0;
    if (rc == 0 && nv.power && nv.power(d, &mw) == 0)
        rc = json_object_set_new(g, "power_w", json_real(mw / 1000.0));
    nvml_pci pci;
    if (rc == 0 && nv.pci && nv.pci(d, &pci) == 0) {
        /* The same form CUDA reports (cudaDeviceGetPCIBusId): the backend
         * finds its devices in this list by it. */
        char bus[32];
        snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", pci.domain & 0xffff, pci.bus & 0xff,
                 pci.device & 0xff);
        rc = json_object_set_new(g, "pci_bus_id", json_string(bus));
    }
    if (rc == 0 && driver[0])
        rc = json_object_set_new(g, "driver", json_string(driver));
    int ma = 0, mi = 0;
    if (rc == 0 && nv.cc && nv.cc(d, &ma, &mi) == 0) {
        char cc[32];
        snprintf(cc, sizeof cc, "%d.%d", ma, mi);
        rc = json_object_set_new(g, "compute_capability", json_string(cc));
    }
    if (rc < 0) {
        json_decref(g);
        return NULL;
    }
    return g;
}

json_t *agent_facts_gpus(void)
{
    json_t *out = json_array();
    if (nv.state == 0)
        nvml_load();
    if (nv.state != 1 || !out)
        return out;
    unsigned int n = 0;
    if (nv.count(&n) != 0)
        return out;
    char driver[96] = "";
    if (nv.driver)
        nv.driver(driver, sizeof driver);
    for (unsigned int i = 0; i < n && i < 64; i++) {
        nvml_device d = NULL;
        if (nv.handle(i, &d) != 0)
            continue;
        /* A GPU left out would read as one this host no longer has. */
        if (json_array_append_new(out, gpu_facts(d, i, driver)) < 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* ---------------------------------------------------------------------------
 * Model file digest
 * ------------------------------------------------------------------------ */

#define DIGEST_CACHE_FILE "model-digests.json"
#define DIGEST_CACHE_MAX 16          /* entries kept (most recent first) */

static int hash_file(const char *path, char out[65], char *err, size_t errlen)
{
    int rc = -1;
    FILE *f = fopen(path, "rb");
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char *buf = malloc(1u << 20);
    if (!f || !md || !buf || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        snprintf(err, errlen, "cannot hash %s: %s", path, f ? "out of memory" : strerror(errno));
        goto done;
    }
    size_t n;
    while ((n = fread(buf, 1, 1u << 20, f)) > 0)
        if (EVP_DigestUpdate(md, buf, n) != 1)
            break;
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    if (ferror(f) || EVP_DigestFinal_ex(md, d, &dl) != 1 || dl != 32) {
        snprintf(err, errlen, "cannot hash %s: read error", path);
        goto done;
    }
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    rc = 0;
done:
    free(buf);
    EVP_MD_CTX_free(md);
    if (f)
        fclose(f);
    return rc;
}

/* The cache file's path under state_dir; false when there is none. */
static bool cache_path(const char *state_dir, char out[PATH_MAX])
{
    return state_dir && *state_dir &&
           snprintf(out, PATH_MAX, "%s/" DIGEST_CACHE_FILE, state_dir) < PATH_MAX;
}

/* The cache's entries array (borrowed from *doc, which the caller frees).
 * Read checked: jansson 2.14's own load can drop a byte of a path and
 * succeed, and cache_store would write the damaged entry back (a path that
 * may name another file of the same size and mtime: its digest then
 * another's, and a continuation's token ids read against other weights).
 * *unread: memory ran out reading the file (then it must not be rewritten:
 * from nothing, it would lose every other model's digest, hours of hashing
 * at later starts). */
static json_t *cache_load(const char *cache, json_t **doc, bool *unread)
{
    size_t len = 0;
    json_error_t je;
    char *txt = gp_read_file(cache, &len, 1u << 20);
    *unread = !txt && errno == ENOMEM;
    *doc = txt ? gp_json_load_checked(txt, len, 0, &je) : NULL;
    if (txt && !*doc && json_error_code(&je) == json_error_out_of_memory)
        *unread = true;
    free(txt);
    return json_object_get(*doc, "entries");
}

/* Write the cache with (real, st, sha) first, then the other entries of
 * list (minus any older one for this path), at most DIGEST_CACHE_MAX. A
 * cache that cannot be written only costs hashing again at the next start;
 * one short of memory is not written at all (the file stays as it was),
 * never without an entry it had. */
static void cache_store(const char *cache, const char *state_dir, const char *real,
                        const struct stat *st, const char *sha, json_t *list)
{
    long long mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    json_t *nl = json_array();
    int rc = json_array_append_new(nl, json_pack("{s:s,s:I,s:I,s:s}", "path", real, "size",
                                                 (json_int_t)st->st_size, "mtime_ns",
                                                 (json_int_t)mtime_ns, "sha256", sha));
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        const char *p = json_string_value(json_object_get(e, "path"));
        if (rc == 0 && p && strcmp(p, real) != 0 && json_array_size(nl) < DIGEST_CACHE_MAX)
            rc = json_array_append(nl, e);
    }
    json_t *nd = rc == 0 ? json_pack("{s:O}", "entries", nl) : NULL;
    json_decref(nl);
    /* Checked: jansson 2.14's json_dumps can leave a key out ("sha256")
     * and succeed; the file would then not be JSON, and every entry lost. */
    char *txt = nd ? gp_json_dumps_checked(nd, JSON_INDENT(1)) : NULL;
    if (!txt || gp_mkdirs(state_dir, 0700) < 0 ||
        gp_write_file_atomic(cache, txt, strlen(txt), 0600) < 0)
        gp_log_warn("digest_cache", "cannot write %s; the model file will be hashed again "
                    "at the next start", cache);
    free(txt);
    json_decref(nd);
}

int agent_model_digest(const char *path, const char *state_dir, char out[65], bool *from_cache,
                       char *err, size_t errlen)
{
    struct stat st;
    char real[PATH_MAX], cache[PATH_MAX];
    json_t *doc = NULL, *list = NULL;
    *from_cache = false;
    out[0] = '\0';
    if (!realpath(path, real) || stat(real, &st) != 0) {
        snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        return -1;
    }
    long long mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    bool use_cache = cache_path(state_dir, cache);
    bool unread = false;
    if (use_cache) {
        list = cache_load(cache, &doc, &unread);
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) {
            const char *p = json_string_value(json_object_get(e, "path"));
            const char *h = json_string_value(json_object_get(e, "sha256"));
            json_t *sz = json_object_get(e, "size"), *mt = json_object_get(e, "mtime_ns");
            if (p && strcmp(p, real) == 0 && gp_hex64_ok(h) && json_is_integer(sz) &&
                json_integer_value(sz) == (json_int_t)st.st_size && json_is_integer(mt) &&
                json_integer_value(mt) == mtime_ns) {
                memcpy(out, h, 65);
                *from_cache = true;
                json_decref(doc);
                return 0;
            }
        }
    }
    if (hash_file(real, out, err, errlen) < 0) {
        json_decref(doc);
        return -1;
    }
    if (use_cache && !unread)
        cache_store(cache, state_dir, real, &st, out, list);
    json_decref(doc);
    return 0;
}

void agent_model_digest_remember(const char *path, const char *state_dir, const char *sha256)
{
    struct stat st;
    char real[PATH_MAX], cache[PATH_MAX];
    json_t *doc = NULL;
    if (!gp_hex64_ok(sha256) || !cache_path(state_dir, cache) || !realpath(path, real) ||
        stat(real, &st) != 0)
        return;
    bool unread;
    json_t *list = cache_load(cache, &doc, &unread);
    if (!unread)
        cache_store(cache, state_dir, real, &st, sha256, list);
    json_decref(doc);
}
