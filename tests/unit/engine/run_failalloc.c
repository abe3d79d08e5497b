/* An LD_PRELOAD library for test_run_long_token: the N-th call of malloc,
 * calloc or realloc in the process (GP_FAIL_ALLOC=N) fails with ENOMEM, and
 * the file GP_FAIL_ALLOC_HIT names gets a byte when it did (a sweep ends at
 * the first N the run does not reach). The real gpupool-run binary is swept
 * this way: --wrap needs the test linked with the code, and this is a
 * separate process. glibc's __libc_* are the allocators underneath. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);

static unsigned long calls, fail_at;
static int ready;

/* Whether this call is the one to fail. getenv allocates nothing. */
static int fail_now(void)
{
    if (!ready) {
        ready = 1;
        const char *s = getenv("GP_FAIL_ALLOC");
        fail_at = s ? strtoul(s, NULL, 10) : 0;
    }
    if (++calls != fail_at)
        return 0;
    const char *hit = getenv("GP_FAIL_ALLOC_HIT");
    int fd = hit ? open(hit, O_WRONLY | O_TRUNC) : -1;
    if (fd >= 0) {
        ssize_t w = write(fd, "1", 1);
        (void)w;
        close(fd);
    }
    errno = ENOMEM;
    return 1;
}

void *malloc(size_t n)
{
    return fail_now() ? NULL : __libc_malloc(n);
}

void *calloc(size_t k, size_t n)
{
    return fail_now() ? NULL : __libc_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
    return fail_now() ? NULL : __libc_realloc(p, n);
}
