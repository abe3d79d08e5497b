/* tls: see tls.h. */
#include "server/http/tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

struct gps_tls {
    SSL_CTX *ctx;
    char *cert_file;
    char *key_file;
    char subject[256];
    char not_after[64];
};

/* TLS 1.2 suites: ECDHE key exchange (forward secrecy) with AEAD ciphers
 * only; the usual "modern/intermediate" choice. TLS 1.3 keeps OpenSSL's
 * default suites (all AEAD). */
#define TLS12_CIPHERS                                                                    \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                         \
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"                         \
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define TLS13_SUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

/* The first queued OpenSSL error as text (and clear the queue). */
static void ossl_err(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "unknown error");
    ERR_clear_error();
}

/* Build a context; NULL with err naming the key at fault. */
static SSL_CTX *ctx_build(const char *cert, const char *key, char *subject, size_t slen,
                          char *not_after, size_t nlen, char *err, size_t errlen)
{
    char oe[256];
    ERR_clear_error();
    FILE *f = fopen(cert, "r");
    if (!f) {
        snprintf(err, errlen, "tls_cert: cannot open '%s'", cert);
        return NULL;
    }
    fclose(f);
    if (!(f = fopen(key, "r"))) {
        snprintf(err, errlen, "tls_key: cannot open '%s'", key);
        return NULL;
    }
    fclose(f);
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        ossl_err(oe, sizeof oe);
        snprintf(err, errlen, "cannot create a TLS context: %s", oe);
        return NULL;
    }
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1 ||
        SSL_CTX_set_cipher_list(ctx, TLS12_CIPHERS) != 1 ||
        SSL_CTX_set_ciphersuites(ctx, TLS13_SUITES) != 1) {
        ossl_err(oe, sizeof oe);
        snprintf(err, errlen, "cannot configure TLS: %s", oe);
        goto fail;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_RENEGOTIATION);
    /* Needed by bufferevent_openssl: its write buffer moves between calls. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        ossl_err(oe, sizeof oe);
        snprintf(err, errlen, "tls_cert: '%s' is not a usable PEM certificate: %s", cert, oe);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        ossl_err(oe, sizeof oe);
        snprintf(err, errlen, "tls_key: '%s' is not a usable PEM private key: %s", key, oe);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "tls_key: '%s' does not match the certificate in tls_cert '%s'",
                 key, cert);
        goto fail;
    }
    subject[0] = not_after[0] = '\0';
    X509 *x = SSL_CTX_get0_certificate(ctx);
    if (x) {
        X509_NAME_oneline(X509_get_subject_name(x), subject, (int)slen);
        BIO *b = BIO_new(BIO_s_mem());
        if (b && ASN1_TIME_print(b, X509_get0_notAfter(x)) == 1) {
            int n = BIO_read(b, not_after, (int)nlen - 1);
            not_after[n > 0 ? n : 0] = '\0';
        }
        BIO_free(b);
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

gps_tls *gps_tls_new(const char *cert_file, const char *key_file, char *err, size_t errlen)
{
    if (!cert_file || !*cert_file) {
        snprintf(err, errlen, "tls_cert: required with listen_tls");
        return NULL;
    }
    if (!key_file || !*key_file) {
        snprintf(err, errlen, "tls_key: required with listen_tls");
        return NULL;
    }
    gps_tls *t = calloc(1, sizeof *t);
    if (!t || !(t->cert_file = strdup(cert_file)) || !(t->key_file = strdup(key_file))) {
        snprintf(err, errlen, "out of memory");
        gps_tls_free(t);
        return NULL;
    }
    t->ctx = ctx_build(cert_file, key_file, t->subject, sizeof t->subject, t->not_after,
                       sizeof t->not_after, err, errlen);
    if (!t->ctx) {
        gps_tls_free(t);
        return NULL;
    }
    return t;
}

int gps_tls_reload(gps_tls *t, char *err, size_t errlen)
{
    char subject[sizeof t->subject], not_after[sizeof t->not_after];
    SSL_CTX *ctx = ctx_build(t->cert_file, t->key_file, subject, sizeof subject, not_after,
                             sizeof not_after, err, errlen);
    if (!ctx)
        return -1;
    /* Open connections hold their own reference to the old context. */
    SSL_CTX_free(t->ctx);
    t->ctx = ctx;
    memcpy(t->subject, subject, sizeof subject);
    memcpy(t->not_after, not_after, sizeof not_after);
    return 0;
}

void gps_tls_free(gps_tls *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ctx);
    free(t->cert_file);
    free(t->key_file);
    free(t);
}

SSL_CTX *gps_tls_ctx(gps_tls *t)
{
    return t->ctx;
}

const char *gps_tls_subject(const gps_tls *t)
{
    return t->subject;
}

const char *gps_tls_not_after(const gps_tls *t)
{
    return t->not_after;
}
