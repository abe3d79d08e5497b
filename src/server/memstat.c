/* memstat: see memstat.h. */
#include "server/memstat.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    unsigned long size = 0, resident = 0;
    int n = fscanf(f, "%lu %lu", &size, &resident);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return n == 2 && page > 0 ? (size_t)resident * (size_t)page : 0;
}

void gps_memstat_read(gps_memstat *out)
{
    memset(out, 0, sizeof *out);
    out->rss_bytes = rss_bytes();
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();
    out->heap_inuse_bytes = mi.uordblks + mi.hblkhd;
    out->heap_free_bytes = mi.fordblks;
    out->heap_mmap_bytes = mi.hblkhd;
#endif
}

bool gps_memstat_trim(size_t min_free_bytes, size_t *released)
{
    if (released)
        *released = 0;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    if (min_free_bytes == 0)
        return false;
    struct mallinfo2 mi = mallinfo2();
    if (mi.fordblks < min_free_bytes)
        return false;
    size_t before = rss_bytes();
    malloc_trim(0);
    size_t after = rss_bytes();
    if (released && before > after)
        *released = before - after;
    return true;
#else
    (void)min_free_bytes;
    return false;
#endif
}
