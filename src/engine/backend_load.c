/*
 * backend_load: finds and loads the CUDA backend plugin (backend.h) once per
 * process, on first use.
 *
 * Where it looks (the first file that exists is loaded; docs/cuda.md):
 *   1. $GPUPOOL_CUDA_PLUGIN (a path; tests point it at broken plugins);
 *   2. next to the binary or library holding this code (dladdr): DIR/NAME,
 *      DIR/../lib/gpupool/NAME (the install layout: P/bin + P/lib/gpupool);
 *   3. the build tree's copy (GPE_CUDA_PLUGIN_BUILD_PATH, CUDA builds only);
 *   4. NAME through the dynamic loader's search path (LD_LIBRARY_PATH,
 *      ld.so.cache).
 * In builds without the CUDA backend only 1. is tried: without the
 * variable the reason is "not built".
 *
 * Any failure (no file, a missing libcudart/libcublas, no entry, another
 * build's plugin) leaves the backend absent with a one-line reason; the
 * engine then has 0 GPUs and runs on the CPU.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const gpe_backend_ops *g_ops;
static char g_why[1024];

static void *try_open(const char *path, char *why, size_t whylen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, whylen, "cannot load %.400s: %.500s", path, e ? e : "unknown error");
    }
    return h;
}

#ifdef GPUPOOL_HAVE_CUDA
/* Directory of the object holding this function ("" when unknown). */
static void self_dir(char *out, size_t outlen)
{
    Dl_info di;
    out[0] = '\0';
    if (dladdr((void *)self_dir, &di) == 0 || !di.dli_fname || !strchr(di.dli_fname, '/'))
        return;
    snprintf(out, outlen, "%s", di.dli_fname);
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
}
#endif

static void *find_plugin(char *why, size_t whylen)
{
    const char *env = getenv("GPUPOOL_CUDA_PLUGIN");
    if (env && *env)
        return try_open(env, why, whylen);
#ifndef GPUPOOL_HAVE_CUDA
    snprintf(why, whylen, "the CUDA backend is not built into this engine");
    return NULL;
#else
    char dir[768], path[1024];
    self_dir(dir, sizeof dir);
    if (*dir) {
        const char *rel[] = {"/", "/../lib/gpupool/"};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
            snprintf(path, sizeof path, "%s%s%s", dir, rel[i], GPE_CUDA_PLUGIN_NAME);
            if (access(path, F_OK) == 0)
                return try_open(path, why, whylen);
        }
    }
#ifdef GPE_CUDA_PLUGIN_BUILD_PATH
    if (access(GPE_CUDA_PLUGIN_BUILD_PATH, F_OK) == 0)
        return try_open(GPE_CUDA_PLUGIN_BUILD_PATH, why, whylen);
#endif
    return try_open(GPE_CUDA_PLUGIN_NAME, why, whylen);
#endif
}

static void load_once(void)
{
    void *h = find_plugin(g_why, sizeof g_why);
    if (!h)
        return;
    gpe_backend_entry_fn entry;
    /* dlsym returns void *; the cast through a union-free memcpy is the
     * portable spelling of a function pointer conversion */
    void *sym = dlsym(h, GPE_CUDA_PLUGIN_ENTRY);
    if (!sym) {
        snprintf(g_why, sizeof g_why, "the CUDA plugin has no %s: not a gpupool plugin",
                 GPE_CUDA_PLUGIN_ENTRY);
        dlclose(h);
        return;
    }
    memcpy(&entry, &sym, sizeof entry);
    const gpe_backend_ops *ops = entry(GPE_BACKEND_ABI);
    if (!ops || ops->abi != GPE_BACKEND_ABI || ops->llama_size != sizeof(gpe_llama)) {
        snprintf(g_why, sizeof g_why,
                 "the CUDA plugin is from another build of gpupool (interface %u, expected %u)",
                 ops ? ops->abi : 0u, GPE_BACKEND_ABI);
        dlclose(h);
        return;
    }
    /* Kept loaded for the life of the process (its code backs every CUDA
     * context; CUDA runtimes do not like being unloaded). */
    g_ops = ops;
}

const gpe_backend_ops *gpe_backend_cuda(char *why, size_t whylen)
{
    pthread_once(&g_once, load_once);
    if (!g_ops && why && whylen > 0)
        snprintf(why, whylen, "%s", g_why);
    return g_ops;
}
