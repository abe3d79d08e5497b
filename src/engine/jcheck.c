/*
 * jcheck: see jcheck.h. The host's loader when it gave one; else jansson's,
 * judged by the host's counter when it gave one, else by the engine's own
 * cross-checks.
 */
#include "engine/jcheck.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Atomic: a host may register while another thread is already inside the
 * engine; either counter is then read whole. */
static _Atomic(gpe_json_alloc_failures_fn) alloc_failures;

void gpe_set_json_alloc_failures(gpe_json_alloc_failures_fn count)
{
    atomic_store_explicit(&alloc_failures, count, memory_order_release);
}

static gpe_json_alloc_failures_fn counter(void)
{
    return atomic_load_explicit(&alloc_failures, memory_order_acquire);
}

/* Atomic for the same reason. */
static _Atomic(gpe_json_load_fn) host_loader;

void gpe_set_json_loader(gpe_json_load_fn load)
{
    atomic_store_explicit(&host_loader, load, memory_order_release);
}

static gpe_json_load_fn loader(void)
{
    return atomic_load_explicit(&host_loader, memory_order_acquire);
}

/* The error jansson would have set had it noticed (its code sits in the
 * text's last byte: jansson.h json_error_code). */
static void set_oom(json_error_t *je)
{
    memset(je, 0, sizeof *je);
    je->line = je->column = je->position = -1;
    snprintf(je->source, sizeof je->source, "<buffer>");
    snprintf(je->text, sizeof je->text, "out of memory");
    je->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
}

/* A refusal jansson made for want of memory and said so, or said nothing
 * (2.14 ends some failed allocations with no message). */
static bool refused_for_memory(const json_error_t *je)
{
    return !je->text[0] || json_error_code(je) == json_error_out_of_memory;
}

/* One load by the host's loader, whose word is taken: out of memory where
 * it says so (engine.h gpe_set_json_loader). */
static gpe_status load_host(gpe_json_load_fn load, const char *text, size_t len, size_t flags,
                            json_t **out, json_error_t *je)
{
    json_t *v = load(text, len, flags, je);
    if (v) {
        *out = v;
        return GPE_OK;
    }
    if (json_error_code(je) == json_error_out_of_memory) {
        set_oom(je); /* (the engine's own words for it, whatever the host's) */
        return GPE_ERR_NOMEM;
    }
    return GPE_ERR_ARG;
}

/* One load, judged by the host's counter: any allocation that failed
 * during it, even under a tree, is out of memory. */
static gpe_status load_counted(gpe_json_alloc_failures_fn count, const char *text, size_t len,
                               size_t flags, json_t **out, json_error_t *je)
{
    unsigned long before = count();
    json_t *v = json_loadb(text, len, flags, je);
    if (count() != before || (!v && refused_for_memory(je))) {
        json_decref(v);
        set_oom(je);
        return GPE_ERR_NOMEM;
    }
    *out = v;
    return v ? GPE_OK : GPE_ERR_ARG;
}

/* One load without a counter: 1 loaded (*v), 0 refused (je says why), -1
 * out of memory (a refusal for want of memory). */
static int load_once(const char *text, size_t len, size_t flags, json_t **v, json_error_t *je)
{
    *v = json_loadb(text, len, flags, je);
    if (*v)
        return 1;
    return refused_for_memory(je) ? -1 : 0;
}

/* Without a counter, jansson's word is all there is, and it may be wrong
 * either way: an allocation it could not make ends a load with no error
 * text, or, where a token's copy failed, with a syntax error ("invalid
 * token"); and where its token buffer could not grow, a load drops that
 * byte and succeeds. So a refusal is believed only when a second load
 * repeats it, the same message at the same place (text that is not JSON
 * is refused every time, alike), and a tree only when another load agrees
 * with it. */
static gpe_status load_twice(const char *text, size_t len, size_t flags, json_t **out,
                             json_error_t *je)
{
    json_error_t je2;
    json_t *a = NULL, *b = NULL;
    gpe_status st = GPE_ERR_NOMEM;
    int ra = load_once(text, len, flags, &a, je);
    int rb = ra < 0 ? -1 : load_once(text, len, flags, &b, &je2);
    if (ra == 0 && rb == 0) {
        if (je->position == je2.position && strcmp(je->text, je2.text) == 0)
            st = GPE_ERR_ARG;
    } else if (ra == 0 && rb == 1) {
        /* the text is JSON (the first refusal was memory): one more load to
         * agree with */
        a = b;
        rb = load_once(text, len, flags, &b, &je2);
    }
    if (a && rb == 1 && json_equal(a, b)) {
        *out = a;
        a = NULL;
        st = GPE_OK;
    }
    json_decref(a);
    json_decref(b);
    if (st == GPE_ERR_NOMEM)
        set_oom(je);
    return st;
}

gpe_status gpe_js_load(const char *text, size_t len, size_t flags, json_t **out,
                       json_error_t *je)
{
    *out = NULL;
    gpe_json_load_fn load = loader();
    if (load)
        return load_host(load, text, len, flags, out, je);
    gpe_json_alloc_failures_fn count = counter();
    return count ? load_counted(count, text, len, flags, out, je)
                 : load_twice(text, len, flags, out, je);
}

/* Whether text s reads back as v. A dump that lost a key or a piece of a
 * string reads as another value, or as no JSON at all: reading never
 * adds what the dump left out. */
static bool reads_back(const char *s, const json_t *v)
{
    /* (the host's loader when there is one: jansson's can crash short of
     * memory; either one's NULL is a dump not believed) */
    gpe_json_load_fn load = loader();
    size_t flags = JSON_DECODE_ANY | JSON_ALLOW_NUL;
    json_t *r = load ? load(s, strlen(s), flags, NULL) : json_loads(s, flags, NULL);
    bool same = r && json_equal(r, v);
    json_decref(r);
    return same;
}

char *gpe_js_dumps(const json_t *v, size_t flags)
{
    gpe_json_alloc_failures_fn count = counter();
    unsigned long before = count ? count() : 0;
    char *s = json_dumps(v, flags);
    /* Dumping twice would not do without a counter: memory short for one
     * buffer's growth is as short the second time, and both texts would
     * lack the same key. Reading back sees the loss itself. */
    bool ok = s && (count ? count() == before : reads_back(s, v));
    if (!ok) {
        free(s);
        return NULL;
    }
    return s;
}
