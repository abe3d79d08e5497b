/*
 * gp_json: JSON texts read into jansson trees without jansson's decoder
 * (issue 24, fourth round: the agent's replies from the server; fifth:
 * the server's request bodies). A /agents/work reply of
 * seven jobs cost json_loadb ~77,000 instructions a job, three quarters of
 * it jansson's lexer, which reads a byte at a time through a stream
 * callback and copies every token into a string buffer (~750 instructions
 * a token, ~80 tokens a job); the agent then spent a sixth of its
 * instructions per relayed request there.
 *
 * gp_json_loadb reads the common case itself: objects, arrays,
 * strings with the short escapes, integers that fit json_int_t, reals,
 * true, false, null, nested at most 64 deep. Anything else (a \u escape,
 * invalid UTF-8, a control byte in a string, an integer past 64 bits, a number
 * jansson would refuse, a scalar at the top, a byte after the value, a
 * duplicate key) goes
 * to json_loadb, which then reads it exactly as before; so the result is
 * always json_loadb's, only cheaper. tests/unit/common/test_gp_json.c
 * compares the two, byte for byte of their dumps, over texts that need
 * every path and random mutations of them.
 */
#ifndef GP_JSON_H
#define GP_JSON_H

#include <stddef.h>

#include <jansson.h>

/* ------------------------------------------------------------------------
 * Checked loads of outside text.
 *
 * jansson 2.14's loader does not survive running out of memory as it says:
 * an allocation it cannot make ends the load with no error set, or with a
 * syntax error ("invalid token") for a valid text (a client's body would
 * be refused 400 where the server failed, 500), and where a long string's
 * token buffer cannot grow it drops a byte and the load succeeds
 * ("home_address_for_mail" read as "home_address_fr_mail"): a request
 * silently changed. The allocator that gp_json_init gives jansson is
 * malloc and free with every malloc that fails counted per thread, and a
 * checked load believes a result only when none failed during it.
 * ------------------------------------------------------------------------ */

/* jansson's allocator for the whole process (json_set_alloc_funcs): malloc
 * and free, failures counted. Once per process whoever calls it
 * (pthread_once); main calls it before any thread starts, and every
 * checked load calls it too (tools, tests). A test that swaps jansson's
 * allocator for its own should call it first, or the first checked load
 * puts this one back over the test's. */
void gp_json_init(void);

/* Allocations of jansson's that failed on the calling thread (through
 * gp_json_init's allocator) since the thread started; never goes down. The
 * engine's counter (gpe_set_json_alloc_failures, engine.h), registered by
 * the binaries that link the engine right after gp_json_init. */
unsigned long gp_json_alloc_failures(void);

/* json_loadb(p, n, flags, err), but a load during which an allocation
 * failed gives NULL with err saying out of memory (json_error_code(err) ==
 * json_error_out_of_memory, text "out of memory") whatever jansson
 * returned: never a tree that may differ from the text, never a syntax
 * error that is not the text's. NULL otherwise means the text is not
 * JSON (err from jansson). err may be NULL. New reference, or NULL. */
json_t *gp_json_load_checked(const char *p, size_t n, size_t flags, json_error_t *err);

/* json_dumps(v, flags), but NULL (as for any other failure: v not an
 * object or array without JSON_ENCODE_ANY, a string not UTF-8) when an
 * allocation failed during it, whatever jansson returned: jansson 2.14's
 * dump can leave an object's key out and still succeed when its buffer
 * cannot grow for the key (seen by the gguf backend's sweep). For the flags
 * gp_json_dumps / gp_json_dump_append do not write (JSON_SORT_KEYS,
 * JSON_INDENT, JSON_ENSURE_ASCII). A new string (caller frees with free),
 * or NULL. */
char *gp_json_dumps_checked(const json_t *v, size_t flags);

/* gp_json_read, else gp_json_load_checked(p, n, 0, err): the same answers,
 * out of memory included. err may be NULL. New reference, or NULL. */
json_t *gp_json_loadb(const char *p, size_t n, json_error_t *err);

/* The reader alone: json_loadb's tree for a text of the common case
 * above (new reference), NULL for anything else, jansson's to read or
 * refuse. gp_json_loadb is this, then the checked load on NULL. (It never
 * hands back a tree built while an allocation failed: any failure is a
 * NULL.) */
json_t *gp_json_read(const char *p, size_t n);

#endif
