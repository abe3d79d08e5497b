/*
 * tls: the server's TLS context (HTTPS listener).
 *
 * One gps_tls holds the current SSL_CTX built from a PEM certificate chain
 * and a PEM private key: TLS 1.2 minimum, forward-secret AEAD suites only
 * for TLS 1.2, OpenSSL's TLS 1.3 suites, no compression, no renegotiation.
 * Session tickets stay on (resumption is cheap and harmless here).
 *
 * Reload (SIGHUP) builds a new context from the same files and swaps it in:
 * connections already open keep the old one (each SSL holds a reference to
 * its SSL_CTX), new connections get the new one. A failed reload keeps the
 * old context.
 */
#ifndef GPS_TLS_H
#define GPS_TLS_H

#include <stddef.h>

/* OpenSSL's context type, declared here so that this header does not pull
 * <openssl/ssl.h> (and <sched.h>, whose SCHED_BATCH clashes with sched.h)
 * into every file that includes http.h. */
struct ssl_ctx_st;

typedef struct gps_tls gps_tls;

/* Load cert (chain) and key. NULL with a message in err naming the
 * config key (tls_cert / tls_key) on a missing, unreadable or mismatched
 * file, or on allocation failure. The paths are copied. */
gps_tls *gps_tls_new(const char *cert_file, const char *key_file, char *err, size_t errlen);
void gps_tls_free(gps_tls *t);
/* Rebuild the context from the files. 0, or -1 with err (old context kept). */
int gps_tls_reload(gps_tls *t, char *err, size_t errlen);
/* The current context (borrowed; valid until the next reload or free). */
struct ssl_ctx_st *gps_tls_ctx(gps_tls *t);
/* Subject and notAfter of the loaded certificate, for logs ("" if unknown). */
const char *gps_tls_subject(const gps_tls *t);
const char *gps_tls_not_after(const gps_tls *t);

#endif
