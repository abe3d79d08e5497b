/*
 * jcheck: the engine's jansson loads and dumps, believed only when memory
 * running out did not change them unseen.
 *
 * jansson 2.14 does not always notice an allocation it could not make: a
 * load may drop a byte from a long string ("home_address" read as
 * "home_adress") or report a syntax error for valid text, and a dump may
 * leave an object's key out (its return value is ignored there), and each
 * still "succeeds". The engine does not own jansson's allocator (the
 * process does), so it learns of those failures from the host's counter
 * (gpe_set_json_alloc_failures, engine.h), and guards itself without one.
 * Worse, the 2.14 loader can crash short of memory (a lost closing quote
 * or escape letter, then reads and writes past its buffer): a host with a
 * loader that does not run jansson's gives it to the engine
 * (gpe_set_json_loader), and every load goes there.
 *
 * Depends on jansson only (linked with jschema.c, which the server and
 * the agent's openai backend take alone).
 */
#ifndef GPE_JCHECK_H
#define GPE_JCHECK_H

#include <gpupool/engine.h>
#include <jansson.h>

#include <stddef.h>

/* JSON text (len bytes) as a value (*out: new reference, else NULL;
 * jansson's load flags): GPE_OK; GPE_ERR_ARG, not JSON (je says why);
 * GPE_ERR_NOMEM, memory ran out (je says "out of memory"). With the host's
 * loader (gpe_set_json_loader, engine.h): one load by it, jansson's never
 * run (it can crash short of memory), out of memory where the loader says
 * so. Else jansson's json_loadb: with the host's counter, one load, out of
 * memory when any allocation failed during it; without, two loads,
 * believed only when they agree (the same value, or the same refusal at
 * the same place), which costs a second load and misses a shortage that
 * fails the same allocation both times. je must not be NULL. */
gpe_status gpe_js_load(const char *text, size_t len, size_t flags, json_t **out,
                       json_error_t *je);

/* json_dumps(v, flags), or NULL when it failed (an allocation, or v not
 * dumpable with these flags: callers take NULL as out of memory, as they
 * did json_dumps'). With the host's counter: NULL when any allocation
 * failed during the dump. Without: the text is read back and must be v
 * again (json_equal), which sees a dropped key whatever made it drop; a
 * read-back that itself runs short gives NULL too. For flags that keep
 * every value (not JSON_REAL_PRECISION). Caller frees with free. */
char *gpe_js_dumps(const json_t *v, size_t flags);

#endif
