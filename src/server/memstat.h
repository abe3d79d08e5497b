/*
 * memstat: the server process's own memory figures, for /metrics and for
 * telling a leak from allocator behaviour.
 *
 * RSS is what the kernel charges the process; the heap figures are glibc's
 * (mallinfo2, summed over every malloc arena): bytes in live allocations
 * and bytes malloc holds free. When RSS grows while heap in-use stays flat,
 * nothing is retained: freed memory sits in malloc's free lists (or in an
 * arena's top that was never given back). docs/operations.md "Memory".
 *
 * glibc only (the server targets Linux/glibc); figures are 0 elsewhere.
 */
#ifndef GPS_MEMSTAT_H
#define GPS_MEMSTAT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gps_memstat {
    size_t rss_bytes;        /* resident set, /proc/self/statm (0 if unreadable) */
    size_t heap_inuse_bytes; /* malloc'd and not freed (arena chunks + mmapped chunks) */
    size_t heap_free_bytes;  /* held by malloc, free (free lists and arena tops); pages a
                                trim gave back stay counted (no longer resident) */
    size_t heap_mmap_bytes;  /* of heap_inuse: chunks malloc got with mmap (large ones) */
} gps_memstat;

void gps_memstat_read(gps_memstat *out);

/* Give free heap pages back to the kernel (glibc malloc_trim(0), every
 * arena) when malloc holds at least min_free_bytes free. Why: freed memory
 * below a live chunk is never returned by free() itself, so RSS keeps the
 * high-water of every load peak (e.g. finished jobs and tasks kept for
 * minutes, freed together later). Cheap at these heap sizes (a walk of the
 * free lists and a madvise per free run). Returns true when it trimmed;
 * *released (may be NULL) gets the RSS it gave back (0 when RSS did not
 * drop). min_free_bytes 0: never trims. */
bool gps_memstat_trim(size_t min_free_bytes, size_t *released);

#endif
