/*
 * backend_load: finds and loads the CUDA backend plugin (backend.h) once per
 * process, on first use.
 *
 * Where it looks (the first file that exists is loaded; docs/cuda.md):
 *   1. $GPUPOOL_CUDA_PLUGIN (a path; tests point it at broken plugins);
 *   2. next to the library holding this code (dladdr) and next to the
 *      executable (/proc/self/exe): DIR/NAME, DIR/../lib/gpupool/NAME (the
 *      install layout: P/bin + P/lib/gpupool);
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
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const gpe_backend_ops *g_ops;
static char g_why[1024];
static char g_path[2048];

static void *try_open(const char *path, char *why, size_t whylen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h) {
        snprintf(g_path, sizeof g_path, "%s", path);
    } else {
        const char *e = dlerror();
        snprintf(why, whylen, "cannot load %.400s: %.500s", path, e ? e : "unknown error");
    }
    return h;
}

#ifdef GPUPOOL_HAVE_CUDA
/* Strips the last path component of path (in place); false when it has none. */
static bool to_dir(char *path)
{
    char *slash = strrchr(path, '/');
    if (!slash)
        return false;
    *slash = '\0';
    return true;
}

/* Directories to look in: that of the shared object holding this code
 * (dladdr), and that of the executable (/proc/self/exe: dladdr names the
 * main program by its argv[0], which is a bare name when it was started
 * through PATH). Returns how many were written (0..2). */
static int self_dirs(char out[2][768])
{
    int n = 0;
    Dl_info di;
    if (dladdr((void *)self_dirs, &di) != 0 && di.dli_fname && di.dli_fname[0] == '/') {
        snprintf(out[n], sizeof out[n], "%s", di.dli_fname);
        if (to_dir(out[n]))
            n++;
    }
    char exe[768];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        if (to_dir(exe) && (n == 0 || strcmp(exe, out[0]) != 0))
            snprintf(out[n++], sizeof out[0], "%s", exe);
    }
    return n;
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
    char dirs[2][768], path[2048];
    const int n_dirs = self_dirs(dirs);
    for (int d = 0; d < n_dirs; d++) {
        const char *rel[] = {"/", "/../lib/gpupool/"};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
            snprintf(path, sizeof path, "%s%s%s", dirs[d], rel[i], GPE_CUDA_PLUGIN_NAME);
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

const char *gpe_backend_cuda_path(void)
{
    return g_ops ? g_path : NULL;
}

const gpe_backend_ops *gpe_backend_cuda(char *why, size_t whylen)
{
    pthread_once(&g_once, load_once);
    if (!g_ops && why && whylen > 0)
        snprintf(why, whylen, "%s", g_why);
    return g_ops;
}
