/*
 * gp_stop: finding a request's stop strings in text that arrives in pieces
 * (the Anthropic dialect's relay on the server, the openai backend's reply
 * reader on the agent). The caller keeps the text it has not emitted yet,
 * scans it after each piece, emits what is safe and holds back the rest.
 * Pure functions: no I/O, no allocation.
 *
 *   gp_buf_append(&pending, piece, n);
 *   int hit = gp_stop_scan(pending.data, pending.len, stops, &safe, &at);
 *   emit(pending.data, safe);
 *   if (hit >= 0) -> the reply ends here, on json_array_get(stops, hit)
 *   else gp_buf_consume(&pending, safe);
 *
 * The engine has its own matcher (gpe_stop_*, which also holds back half a
 * UTF-8 character of a byte-fallback token); this one serves code that
 * receives whole JSON strings and must not link the engine.
 */
#ifndef GP_STOP_H
#define GP_STOP_H

#include <stddef.h>

#include <jansson.h>

/* Stop-string scan of not-yet-emitted text t[0..len) against stops (an
 * array of strings; borrowed; others and empty strings are skipped).
 * Returns the index of the stop string that occurs first (*match_at = its
 * offset; *safe_len = the same: the text before it may be emitted), or -1
 * when none occurs: then *safe_len bytes may be emitted and the rest (a
 * possible start of a stop string) must be held back until more text
 * arrives. A held tail starts where a stop string starts, so valid UTF-8
 * is never cut inside a character. */
int gp_stop_scan(const char *t, size_t len, const json_t *stops, size_t *safe_len,
                 size_t *match_at);

#endif
