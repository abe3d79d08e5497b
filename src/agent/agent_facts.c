/* agent_facts: see agent_facts.h. */
#include "agent/agent_facts.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

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
#undef SYM
    if (!nv.init || !nv.count || !nv.handle || nv.init() != 0) {
        dlclose(nv.lib);
        nv.lib = NULL;
        return;
    }
    nv.state = 1;
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
        json_t *g = json_pack("{s:s,s:I}", "vendor", "nvidia", "index", (json_int_t)i);
        char name[128] = "";
        if (nv.name && nv.name(d, name, sizeof name) == 0)
            json_object_set_new(g, "name", json_string(name));
        nvml_memory m;
        if (nv.memory && nv.memory(d, &m) == 0) {
            json_object_set_new(g, "vram_total", json_integer((json_int_t)m.total));
            json_object_set_new(g, "vram_used", json_integer((json_int_t)m.used));
        }
        nvml_utilization u;
        if (nv.util && nv.util(d, &u) == 0)
            json_object_set_new(g, "utilization", json_real(u.gpu / 100.0));
        unsigned int t = 0;
        if (nv.temp && nv.temp(d, 0 /* NVML_TEMPERATURE_GPU */, &t) == 0)
            json_object_set_new(g, "temperature", json_integer(t));
        if (driver[0])
            json_object_set_new(g, "driver", json_string(driver));
        int ma = 0, mi = 0;
        if (nv.cc && nv.cc(d, &ma, &mi) == 0) {
            char cc[32];
            snprintf(cc, sizeof cc, "%d.%d", ma, mi);
            json_object_set_new(g, "compute_capability", json_string(cc));
        }
        json_array_append_new(out, g);
    }
    return out;
}
