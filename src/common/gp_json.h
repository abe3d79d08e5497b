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

/* json_loadb(p, n, 0, NULL). New reference, or NULL. */
json_t *gp_json_loadb(const char *p, size_t n);

/* The reader alone: json_loadb's tree for a text of the common case
 * above (new reference), NULL for anything else, jansson's to read or
 * refuse. gp_json_loadb is this, then json_loadb on NULL. */
json_t *gp_json_read(const char *p, size_t n);

#endif
