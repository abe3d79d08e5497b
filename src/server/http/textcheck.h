/*
 * textcheck: is a piece of outside text safe to keep, match and show?
 *
 * Names an operator later reads in a terminal (key names) must be
 * printable UTF-8; query values must not smuggle bytes that the C string
 * layer cuts at (a decoded %00 made "x%00y" match "x") or that a terminal
 * interprets (escapes).
 */
#ifndef GPS_TEXTCHECK_H
#define GPS_TEXTCHECK_H

#include <stdbool.h>
#include <stddef.h>

/* True when s[0..n) is valid UTF-8 (shortest form, no surrogates) with no
 * control character: C0 (including NUL, TAB, LF), DEL, or C1 (U+0080..9F). */
bool gps_text_printable_utf8(const char *s, size_t n);
/* True when s[0..n) is valid UTF-8 (shortest form, no surrogates); any
 * character, control ones included (what a JSON string may carry). */
bool gps_text_utf8(const char *s, size_t n);

/* True when a raw (still percent-encoded) query string holds a control
 * byte (0x00..0x1f, 0x7f), raw or as a %XX escape. NULL is fine (false). */
bool gps_query_has_control(const char *raw_query);

#endif
