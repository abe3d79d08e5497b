/*
 * ids: identifiers that must be unique, not secret (job, response, item and
 * correlation ids), made without a call into OpenSSL per id.
 *
 * RAND_bytes per id was 4-7 % of the server's instructions per relayed
 * token (a request makes four or five ids, an agent upload one). These ids
 * are a 64-bit counter pushed through a bijective mixer, keyed by 128 bits
 * read once from RAND_bytes: distinct within a process (the mixer is a
 * permutation of the counter), different across restarts (the key), and
 * not sequential to the eye past their time (gps_id_new). They are not capabilities: nothing is
 * authorised by knowing one (tasks check the key that created them), and
 * key material still comes from gp_random_hex (auth.c).
 */
#ifndef GPS_IDS_H
#define GPS_IDS_H

#include <stddef.h>
#include <stdint.h>

/* Write nbytes * 2 lowercase hex digits and a NUL to out. */
void gps_id_hex(char *out, size_t nbytes);
/* out = prefix + 24 hex digits (truncated to outlen): 12 of the wall clock
 * in milliseconds, then 12 of the counter through a 48-bit bijection.
 * Ids made later sort after (jobs, responses): a store's primary-key index
 * then grows at its end instead of taking each new row on a random leaf
 * page, which at 64 clients cost the server ~8 % of its CPU a request
 * (docs/persistence.md "Ids in time order"). */
void gps_id_new(const char *prefix, char *out, size_t outlen);
/* 64 bits from the same sequence (a job's sampler seed when the request
 * gives none: it must differ between jobs, not be secret). */
uint64_t gps_id_u64(void);

#endif
