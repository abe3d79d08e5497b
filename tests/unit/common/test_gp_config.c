/* Unit tests for src/common/gp_config.c: layering defaults < file < flags <
 * environment, validation messages naming the key, --print-config sources. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gp_config.h"

struct opts {
    char *config;
    char *listen;
    long long max_queue;
    bool verbose;
    double ratio;
    char *scheduler;
};

static const gp_opt table[] = {
    {"config", GP_OPT_STR, offsetof(struct opts, config), NULL, 0, 0, NULL, "config file"},
    {"listen", GP_OPT_STR, offsetof(struct opts, listen), "127.0.0.1:8080", 0, 0, NULL, "addr"},
    {"max-queue", GP_OPT_INT, offsetof(struct opts, max_queue), "100", 1, 100000, NULL, "q"},
    {"verbose", GP_OPT_BOOL, offsetof(struct opts, verbose), "false", 0, 0, NULL, "v"},
    {"ratio", GP_OPT_DOUBLE, offsetof(struct opts, ratio), "0.5", 0, 1, NULL, "r"},
    {"scheduler", GP_OPT_STR, offsetof(struct opts, scheduler), "round_robin", 0, 0,
     "round_robin|weighted", "policy"},
};
#define NOPT (sizeof table / sizeof table[0])

static char tmpfile_path[64];

static const char *write_conf(const char *text)
{
    snprintf(tmpfile_path, sizeof tmpfile_path, "/tmp/gp_cfg_test_XXXXXX");
    int fd = mkstemp(tmpfile_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return tmpfile_path;
}

static void test_defaults(void **state)
{
    struct opts o;
    gp_config c;
    char err[256] = "";
    char *argv[] = {"prog", NULL};
    char *envp[] = {NULL};
    assert_int_equal(gp_config_parse_env(&c, table, NOPT, &o, 1, argv, envp, err, sizeof err), 0);
    assert_string_equal(o.listen, "127.0.0.1:8080");
    assert_int_equal(o.max_queue, 100);
    assert_false(o.verbose);
    assert_true(o.ratio == 0.5);
    assert_int_equal(c.src[1], GP_SRC_DEFAULT);
    gp_config_free(&c);
}

static void test_precedence(void **state)
{
    const char *path = write_conf("# comment\nlisten = 0.0.0.0:9000\nmax_queue = 7\n"
                                  "verbose = yes\nratio=0.25  # trailing comment\n");
    struct opts o;
    gp_config c;
    char err[256] = "";
    char *argv[] = {"prog", "--config", (char *)path, "--max_queue", "8", "--ratio=0.75", NULL};
    char *envp[] = {"GPUPOOL_RATIO=0.9", "OTHER=1", NULL};
    assert_int_equal(gp_config_parse_env(&c, table, NOPT, &o, 6, argv, envp, err, sizeof err), 0);
    assert_string_equal(o.listen, "0.0.0.0:9000");   /* file beats default */
    assert_int_equal(o.max_queue, 8);                 /* flag beats file */
    assert_true(o.verbose);                           /* from file */
    assert_true(o.ratio == 0.9);                      /* env beats flag */
    assert_int_equal(c.src[1], GP_SRC_FILE);
    assert_int_equal(c.src[2], GP_SRC_FLAG);
    assert_int_equal(c.src[4], GP_SRC_ENV);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    gp_config_print(&c, f);
    fclose(f);
    assert_non_null(strstr(buf, "listen"));
    assert_non_null(strstr(buf, "# file"));
    assert_non_null(strstr(buf, "# env"));
    assert_non_null(strstr(buf, "# flag"));
    free(buf);
    gp_config_free(&c);
    unlink(path);
}

static void expect_error(int argc, char **argv, char **envp, const char *needle)
{
    struct opts o;
    gp_config c;
    char err[256] = "";
    assert_int_equal(gp_config_parse_env(&c, table, NOPT, &o, argc, argv, envp, err, sizeof err),
                     -1);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
    gp_config_free(&c);
}

static void test_errors_name_the_key(void **state)
{
    char *envp[] = {NULL};
    char *a1[] = {"prog", "--max-queue", "0", NULL};
    expect_error(3, a1, envp, "max-queue");
    char *a2[] = {"prog", "--max-queue", "12x", NULL};
    expect_error(3, a2, envp, "max-queue");
    char *a3[] = {"prog", "--scheduler", "fastest", NULL};
    expect_error(3, a3, envp, "scheduler");
    char *a4[] = {"prog", "--bogus", NULL};
    expect_error(2, a4, envp, "--bogus");
    char *a5[] = {"prog", "--listen", NULL};
    expect_error(2, a5, envp, "listen");
    char *a6[] = {"prog", NULL};
    char *e6[] = {"GPUPOOL_VERBOSE=maybe", NULL};
    expect_error(1, a6, e6, "GPUPOOL_VERBOSE");
    const char *path = write_conf("listen = x\nnot a pair\n");
    char *a7[] = {"prog", "--config", (char *)path, NULL};
    expect_error(3, a7, envp, ":2:");
    unlink(path);
    path = write_conf("unknown_key = 1\n");
    char *a8[] = {"prog", "--config", (char *)path, NULL};
    expect_error(3, a8, envp, "unknown_key");
    unlink(path);
    char *a9[] = {"prog", "--config", "/nonexistent/gpupool.conf", NULL};
    expect_error(3, a9, envp, "/nonexistent/gpupool.conf");
}

static void test_bool_forms_and_positional(void **state)
{
    struct opts o;
    gp_config c;
    char err[256] = "";
    char *argv[] = {"prog", "keys", "--verbose", "create", "--no-verbose", "--print-config", NULL};
    char *envp[] = {NULL};
    assert_int_equal(gp_config_parse_env(&c, table, NOPT, &o, 6, argv, envp, err, sizeof err), 0);
    assert_false(o.verbose);
    assert_true(c.print_config);
    assert_int_equal(c.npositional, 2);
    assert_string_equal(c.positional[0], "keys");
    assert_string_equal(c.positional[1], "create");
    gp_config_free(&c);
}

static void test_env_config_path(void **state)
{
    const char *path = write_conf("max_queue = 42\n");
    char envbuf[128];
    snprintf(envbuf, sizeof envbuf, "GPUPOOL_CONFIG=%s", path);
    struct opts o;
    gp_config c;
    char err[256] = "";
    char *argv[] = {"prog", NULL};
    char *envp[] = {envbuf, NULL};
    assert_int_equal(gp_config_parse_env(&c, table, NOPT, &o, 1, argv, envp, err, sizeof err), 0);
    assert_int_equal(o.max_queue, 42);
    assert_string_equal(o.config, path);
    assert_int_equal(c.src[0], GP_SRC_ENV);
    gp_config_free(&c);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_errors_name_the_key),
        cmocka_unit_test(test_bool_forms_and_positional),
        cmocka_unit_test(test_env_config_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
