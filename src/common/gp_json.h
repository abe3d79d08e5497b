/*
 * gp_json: JSON texts read into jansson trees without jansson's decoder,
 * and jansson's dumps checked.
 *
 * The reader (gp_json_load_checked, gp_json_loadb) accepts exactly what
 * jansson 2.14's json_loadb accepts, for every load flag
 * (JSON_REJECT_DUPLICATES, JSON_DISABLE_EOF_CHECK, JSON_DECODE_ANY,
 * JSON_DECODE_INT_AS_REAL, JSON_ALLOW_NUL), and builds the same tree with
 * jansson's constructors: the same types (an integer where jansson reads
 * one, in long long's range, else refused; a real through strtod in the C
 * locale, an overflow refused), the same strings (\u escapes, surrogate
 * pairs), the same key order, a duplicate key's later value in the
 * earlier one's place; nesting refused past jansson's 2048 values.
 *
 * Why not json_loadb: jansson 2.14's lexer, when an allocation fails while
 * it reads a string, drops the byte it could not save and decodes the
 * token as if whole: where the lost byte is a string's closing quote (its
 * token buffer cannot grow at 16, 32, 64 bytes) it reads and writes past
 * its buffer (heap corruption, SIGSEGV), where it is an escape's letter it
 * hits assert(0) (abort), elsewhere a string silently loses a byte or a
 * valid text is refused as a syntax error. Counting the failures afterwards
 * cannot undo a crash: so no outside text (request bodies, agent uploads,
 * upstream replies, stored rows) goes through it. It began as a fast path
 * (issue 24: json_loadb spent ~750 instructions a token, a byte at a time
 * through a stream callback); tests/unit/common/test_gp_json.c compares it
 * with json_loadb, byte for byte of their dumps, over every case of the
 * grammar and random mutations, and tests/fuzz/fuzz_gp_json.c does so on
 * the fuzzer's texts.
 */
#ifndef GP_JSON_H
#define GP_JSON_H

#include <stddef.h>

#include <jansson.h>

/* ------------------------------------------------------------------------
 * Checked loads of outside text.
 *
 * Out of memory is said as such: never a tree that differs from the text,
 * never a syntax error for valid text, never a crash (above). The
 * allocator that gp_json_init gives jansson is malloc and free with every
 * malloc that fails counted per thread; the reader sees each constructor
 * that fails itself, and a checked load believes a tree only when no
 * count moved during it either. (The count also serves json_dumps,
 * gp_json_dumps_checked, and the engine: gpe_set_json_alloc_failures.)
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

/* What json_loadb(p, n, flags, err) gives, read by this file's reader
 * (json_loadb itself never runs), except that out of memory anywhere in
 * the load gives NULL with err saying so (json_error_code(err) ==
 * json_error_out_of_memory, text "out of memory", line, column and
 * position -1): never a tree that differs from the text, never a syntax
 * error that is not the text's; a tree built in part is freed. NULL
 * otherwise means the text is not JSON (for these flags), and err says why
 * in the reader's own words: its text ("expected ',' or '}' after an
 * object member, not 'x' at line 1, column 12"), line (from 1), column (in
 * characters, from 1), position (bytes up to and with the one at fault;
 * the text's length when it ended too soon), json_error_code (jansson's
 * codes: json_error_invalid_syntax, _invalid_utf8,
 * _premature_end_of_input, _end_of_input_expected, _duplicate_key,
 * _numeric_overflow, _null_character, _null_byte_in_key, _stack_overflow,
 * _invalid_argument for p NULL). On success err is as json_loadb leaves
 * it: an empty text, position the bytes read. err may be NULL. New
 * reference, or NULL. */
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

/* gp_json_load_checked(p, n, 0, err): json_loadb's flags 0 (a duplicate
 * key's later value wins). err may be NULL. New reference, or NULL. */
json_t *gp_json_loadb(const char *p, size_t n, json_error_t *err);

/* gp_json_load_checked(p, n, JSON_REJECT_DUPLICATES, NULL): the tree, or
 * NULL for anything else, out of memory included. (Kept for callers that
 * once read the common case here and asked json_loadb for the rest; a new
 * caller wants gp_json_load_checked and its error.) */
json_t *gp_json_read(const char *p, size_t n);

#endif
