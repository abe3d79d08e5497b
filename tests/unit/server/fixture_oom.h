/* The failing allocator of the out-of-memory sweeps (test_parse_oom.c,
 * test_render_oom.c): jansson's allocator fails the N-th allocation, and the
 * sweeps run N = 1, 2, 3, ... until a run ends without reaching it. libc's
 * malloc (strdup, gp_buf) is not hooked, but in a test built with
 * GPS_FIXTURE_OOM_LIBC and linked with -Wl,--wrap=malloc,--wrap=calloc,
 * --wrap=realloc (its CMakeLists.txt), where arm_libc() counts the calls
 * of malloc, calloc and realloc that the project's code makes (not libc's
 * own: strdup's, ...) with jansson's, and arm_beneath() fails libc's alone
 * beneath gp_json's counting allocator (gp_json.h: the checked load).
 * GPS_FIXTURE_OOM_STRDUP / _STRNDUP (with GPS_FIXTURE_OOM_LIBC and
 * --wrap=strdup / strndup) count strdup and strndup too.
 * Header-only: each test is one file.
 * Needs <cmocka.h> and <jansson.h> included first. */
#ifndef GPS_FIXTURE_OOM_H
#define GPS_FIXTURE_OOM_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static size_t countdown; /* 0: never fail; else fail when it reaches 0 */
static bool injected;    /* the failure was handed out */
static bool libc_armed;  /* libc's allocations count too (arm_libc) */
static bool swapped;     /* arm put failing_malloc in jansson's place */
static json_malloc_t saved_malloc; /* jansson's allocator before arm: disarm's */
static json_free_t saved_free;

/* Whether this allocation is the one to fail (errno ENOMEM then, as libc's
 * allocators set it: code that tells ENOMEM from other errors sees it). */
__attribute__((unused)) static bool fail_now(void)
{
    if (countdown && --countdown == 0) {
        injected = true;
        errno = ENOMEM;
        return true;
    }
    return false;
}

#ifdef GPS_FIXTURE_OOM_LIBC
/* The linker sends the project's malloc, calloc and realloc here, and
 * __real_* to libc's (ld --wrap). */
void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_malloc(size_t n)
{
    return libc_armed && fail_now() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
    return libc_armed && fail_now() ? NULL : __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    return libc_armed && fail_now() ? NULL : __real_realloc(p, n);
}

#ifdef GPS_FIXTURE_OOM_STRDUP
/* strdup and strndup counted with malloc (linked with --wrap=strdup, and
 * with GPS_FIXTURE_OOM_STRNDUP --wrap=strndup): libc's own strdup does not
 * go through the wrapped malloc. */
char *__real_strdup(const char *s);
char *__wrap_strdup(const char *s);

char *__wrap_strdup(const char *s)
{
    return libc_armed && fail_now() ? NULL : __real_strdup(s);
}
#endif

#ifdef GPS_FIXTURE_OOM_STRNDUP
char *__real_strndup(const char *s, size_t n);
char *__wrap_strndup(const char *s, size_t n);

char *__wrap_strndup(const char *s, size_t n)
{
    return libc_armed && fail_now() ? NULL : __real_strndup(s, n);
}
#endif

/* jansson's allocations go to libc's malloc: not counted twice. */
#define FIXTURE_REAL_MALLOC __real_malloc
#else
#define FIXTURE_REAL_MALLOC malloc
#endif

__attribute__((unused)) static void *failing_malloc(size_t n)
{
    return fail_now() ? NULL : FIXTURE_REAL_MALLOC(n);
}

__attribute__((unused)) static void arm(size_t n)
{
    countdown = n;
    injected = false;
    json_get_alloc_funcs(&saved_malloc, &saved_free);
    json_set_alloc_funcs(failing_malloc, free);
    swapped = true;
}

#ifdef GPS_FIXTURE_OOM_LIBC
/* arm(n), the N-th allocation counted among jansson's and libc's. */
__attribute__((unused)) static void arm_libc(size_t n)
{
    arm(n);
    libc_armed = true;
}

/* The N-th of libc's malloc, calloc and realloc fails, jansson's allocator
 * left as it is. When that is gp_json's counting wrapper (gp_json_init:
 * it calls malloc, which --wrap sends here), jansson's allocations are
 * counted through it, and a failure reaches the wrapper's count, as a real
 * one would: what gp_json_load_checked's callers are tested with. */
__attribute__((unused)) static void arm_beneath(size_t n)
{
    countdown = n;
    injected = false;
    libc_armed = true;
}
#endif

/* Back to the allocator jansson had before arm (what the rest of the run
 * uses). Returns whether the failure was reached. */
__attribute__((unused)) static bool disarm(void)
{
    if (swapped)
        json_set_alloc_funcs(saved_malloc, saved_free);
    swapped = false;
    libc_armed = false;
    countdown = 0;
    return injected;
}

__attribute__((unused)) static json_t *J(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s (%s)", e.text, s);
    return j;
}

/* The fields where got and want differ (objects: by key, to any depth). */
__attribute__((unused)) static void print_diff(const char *path, const json_t *got, const json_t *want)
{
    if (json_is_object(got) && json_is_object(want)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)want, k, v)
        {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", path, k);
            if (!json_equal(json_object_get(got, k), v))
                print_diff(sub, json_object_get(got, k), v);
        }
        return;
    }
    char *g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
    char *w = json_dumps(want, JSON_COMPACT | JSON_ENCODE_ANY);
    print_message("  %s: got %.300s\n  %*s want %.300s\n", path, g ? g : "(nothing)",
                  (int)strlen(path), "", w ? w : "(nothing)");
    free(g);
    free(w);
}

#endif
