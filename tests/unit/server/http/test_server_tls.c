/* TLS context (server/tls.c) and the listener options of server_config:
 * certificates made in-process with OpenSSL (self-signed, P-256) in a temp
 * dir; mismatched, missing and garbage files named by key; reload swaps the
 * context or keeps the old one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "server/server_config.h"
#include "server/http/tls.h"

static char dir[64];
static char crt1[128], key1[128], crt2[128], key2[128], junk[128];

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

/* A self-signed certificate for CN=cn and its key, as PEM files. */
static void make_pair(const char *crt, const char *key, const char *cn)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    assert_non_null(k);
    X509 *x = X509_new();
    assert_non_null(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, n);
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    FILE *f = fopen(crt, "w");
    assert_non_null(f);
    PEM_write_X509(f, x);
    fclose(f);
    f = fopen(key, "w");
    assert_non_null(f);
    PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(k);
}

static int setup(void **st)
{
    (void)st;
    snprintf(dir, sizeof dir, "/tmp/gps-tls-unit-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(crt1, sizeof crt1, "%s/one.crt", dir);
    snprintf(key1, sizeof key1, "%s/one.key", dir);
    snprintf(crt2, sizeof crt2, "%s/two.crt", dir);
    snprintf(key2, sizeof key2, "%s/two.key", dir);
    snprintf(junk, sizeof junk, "%s/junk.pem", dir);
    make_pair(crt1, key1, "one");
    make_pair(crt2, key2, "two");
    write_text(junk, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n");
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    const char *files[] = {crt1, key1, crt2, key2, junk};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(files[i]);
    rmdir(dir);
    return 0;
}

static void test_good_pair(void **st)
{
    (void)st;
    char err[512] = "";
    gps_tls *t = gps_tls_new(crt1, key1, err, sizeof err);
    assert_non_null(t);
    assert_non_null(strstr(gps_tls_subject(t), "CN=one"));
    assert_true(strlen(gps_tls_not_after(t)) > 0);
    SSL_CTX *ctx = gps_tls_ctx(t);
    assert_int_equal(SSL_CTX_get_min_proto_version(ctx), TLS1_2_VERSION);
    assert_true(SSL_CTX_get_options(ctx) & SSL_OP_NO_COMPRESSION);
    assert_true(SSL_CTX_get_options(ctx) & SSL_OP_NO_RENEGOTIATION);
    /* Only forward-secret AEAD suites for TLS 1.2. */
    SSL *ssl = SSL_new(ctx);
    assert_non_null(ssl);
    STACK_OF(SSL_CIPHER) *cs = SSL_get_ciphers(ssl);
    for (int i = 0; i < sk_SSL_CIPHER_num(cs); i++) {
        const SSL_CIPHER *c = sk_SSL_CIPHER_value(cs, i);
        const char *name = SSL_CIPHER_get_name(c);
        if (strncmp(name, "TLS_", 4) == 0)
            continue; /* TLS 1.3 suites */
        assert_true(strncmp(name, "ECDHE-", 6) == 0);
        assert_true(strstr(name, "GCM") || strstr(name, "CHACHA20"));
    }
    SSL_free(ssl);
    gps_tls_free(t);
}

static void test_bad_files_named(void **st)
{
    (void)st;
    char err[512];
    struct {
        const char *crt, *key, *want;
    } cases[] = {
        {crt1, key2, "tls_key"},                 /* mismatched pair */
        {crt1, "/nonexistent/x.key", "tls_key"}, /* missing key */
        {"/nonexistent/x.crt", key1, "tls_cert"},
        {junk, key1, "tls_cert"},                /* garbage certificate */
        {key1, key1, "tls_cert"},                /* a key is no certificate */
        {crt1, crt1, "tls_key"},                 /* a certificate is no key */
        {"", key1, "tls_cert"},
        {crt1, NULL, "tls_key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        gps_tls *t = gps_tls_new(cases[i].crt, cases[i].key, err, sizeof err);
        if (t)
            fail_msg("case %zu accepted", i);
        if (strncmp(err, cases[i].want, strlen(cases[i].want)) != 0)
            fail_msg("case %zu: '%s' does not start with %s", i, err, cases[i].want);
    }
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "r"), *b = fopen(to, "w");
    assert_non_null(a);
    assert_non_null(b);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        fwrite(buf, 1, n, b);
    fclose(a);
    fclose(b);
}

static void test_reload(void **st)
{
    (void)st;
    char err[512], lc[160], lk[160];
    snprintf(lc, sizeof lc, "%s/live.crt", dir);
    snprintf(lk, sizeof lk, "%s/live.key", dir);
    copy_file(crt1, lc);
    copy_file(key1, lk);
    gps_tls *t = gps_tls_new(lc, lk, err, sizeof err);
    assert_non_null(t);
    copy_file(crt2, lc);
    copy_file(key2, lk);
    assert_int_equal(gps_tls_reload(t, err, sizeof err), 0);
    assert_non_null(strstr(gps_tls_subject(t), "CN=two"));
    SSL_CTX *before = gps_tls_ctx(t);
    copy_file(key1, lk); /* now mismatched: the reload fails, the old context stays */
    assert_int_equal(gps_tls_reload(t, err, sizeof err), -1);
    assert_non_null(strstr(err, "tls_key"));
    assert_ptr_equal(gps_tls_ctx(t), before);
    assert_non_null(strstr(gps_tls_subject(t), "CN=two"));
    gps_tls_free(t);
    unlink(lc);
    unlink(lk);
}

static int load(gps_config *o, gp_config *cfg, char **argv, char *err)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    char *envp[] = {NULL};
    return gps_config_load(o, cfg, argc, argv, envp, err, 512);
}

static void test_config_listeners(void **st)
{
    (void)st;
    gps_config o;
    gp_config cfg;
    char err[512];
    struct {
        char *argv[12];
        const char *want; /* NULL = accepted */
    } cases[] = {
        {{"s", "--listen", "none", NULL}, "listen"},
        {{"s", "--listen", "", NULL}, "listen"},
        {{"s", "--listen_tls", "127.0.0.1:0", NULL}, "tls_cert"},
        {{"s", "--listen_tls", "127.0.0.1:0", "--tls_cert", "c", NULL}, "tls_key"},
        {{"s", "--listen_tls", "nohostport", "--tls_cert", "c", "--tls_key", "k", NULL},
         "invalid value 'nohostport' for 'listen_tls'"},
        {{"s", "--listen", "none", "--listen_tls", "127.0.0.1:8443", "--tls_cert", "c",
          "--tls_key", "k", "--tls-port-file", "p", NULL},
         NULL},
        {{"s", "--listen_tls", "none", NULL}, NULL}, /* explicitly off */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        int rc = load(&o, &cfg, cases[i].argv, err);
        if (cases[i].want) {
            if (rc != -1 || !strstr(err, cases[i].want))
                fail_msg("case %zu: rc %d err '%s' (want %s)", i, rc, err, cases[i].want);
        } else if (rc != 0) {
            fail_msg("case %zu refused: %s", i, err);
        }
        if (i == 5) {
            assert_null(o.listen);
            assert_string_equal(o.listen_tls, "127.0.0.1:8443");
            assert_string_equal(o.tls_port_file, "p");
        }
        if (i == 6) {
            assert_null(o.listen_tls);
            assert_string_equal(o.listen, "127.0.0.1:8080");
        }
        gp_config_free(&cfg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_pair),
        cmocka_unit_test(test_bad_files_named),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_config_listeners),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
