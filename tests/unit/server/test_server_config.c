/* Server option table: defaults, precedence (default < file < flag < env),
 * bad values named, STATE_DIRECTORY for the default DB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "server/server_config.h"

static int load(gps_config *o, gp_config *cfg, int argc, char **argv, char **envp, char *err)
{
    return gps_config_load(o, cfg, argc, argv, envp, err, 512);
}

static void test_defaults(void **st)
{
    (void)st;
    gps_config o;
    gp_config cfg;
    char err[512];
    char *argv[] = {"gpupool-server", "--config", "/nonexistent-gpupool-test.conf", NULL};
    char *envp[] = {NULL};
    /* an explicitly named config file must exist */
    assert_int_equal(load(&o, &cfg, 3, argv, envp, err), -1);
    assert_non_null(strstr(err, "nonexistent-gpupool-test.conf"));
    gp_config_free(&cfg);

    char *argv2[] = {"gpupool-server", NULL};
    assert_int_equal(load(&o, &cfg, 1, argv2, envp, err), 0);
    assert_string_equal(o.listen, "127.0.0.1:8080");
    assert_string_equal(o.db, "./gpupool.db");
    assert_int_equal(o.max_body_bytes, 4194304);
    assert_int_equal(o.poll_interval_sec, 15);
    assert_int_equal(o.agent_timeout_sec, 90);
    assert_int_equal(o.work_wait_sec, 25);
    assert_int_equal(o.max_queue, 1000);
    assert_int_equal(o.max_attempts, 3);
    assert_string_equal(o.scheduler, "round_robin");
    assert_false(o.log_prompts);
    assert_null(o.port_file);
    gp_config_free(&cfg);
}

static void test_precedence(void **st)
{
    (void)st;
    char path[] = "/tmp/gps-config-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "# test\nmax_queue = 7\nscheduler = weighted\npoll_interval_sec = 3\n"
                       "listen = 127.0.0.1:9000\n";
    assert_int_equal(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
    gps_config o;
    gp_config cfg;
    char err[512];
    char *argv[] = {"gpupool-server", "--config", path, "--max_queue", "8", "--listen",
                    "127.0.0.1:0", "--port-file", "/tmp/x.port", NULL};
    char *envp[] = {"GPUPOOL_MAX_QUEUE=9", "GPUPOOL_LOG_PROMPTS=yes", NULL};
    assert_int_equal(load(&o, &cfg, 9, argv, envp, err), 0);
    assert_int_equal(o.max_queue, 9);              /* env > flag > file */
    assert_string_equal(o.scheduler, "weighted");  /* file > default */
    assert_int_equal(o.poll_interval_sec, 3);
    assert_string_equal(o.listen, "127.0.0.1:0");  /* flag > file; port 0 allowed */
    assert_string_equal(o.port_file, "/tmp/x.port");
    assert_true(o.log_prompts);
    gp_config_free(&cfg);
    unlink(path);
}

static void test_bad_values(void **st)
{
    (void)st;
    struct {
        const char *flag, *val, *key;
    } cases[] = {
        {"--max_queue", "0", "max_queue"},
        {"--max_queue", "many", "max_queue"},
        {"--scheduler", "random", "scheduler"},
        {"--listen", "nohostport", "listen"},
        {"--listen", "127.0.0.1:70000", "listen"},
        {"--log_level", "loud", "log_level"},
        {"--agent_timeout_sec", "-5", "agent_timeout_sec"},
        {"--max_body_bytes", "10", "max_body_bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gps_config o;
        gp_config cfg;
        char err[512] = "";
        char *argv[] = {"gpupool-server", (char *)cases[i].flag, (char *)cases[i].val, NULL};
        char *envp[] = {NULL};
        assert_int_equal(load(&o, &cfg, 3, argv, envp, err), -1);
        if (!strstr(err, cases[i].key))
            fail_msg("error '%s' does not name '%s'", err, cases[i].key);
        gp_config_free(&cfg);
    }
    /* unknown flag */
    gps_config o;
    gp_config cfg;
    char err[512];
    char *argv[] = {"gpupool-server", "--bogus", "1", NULL};
    char *envp[] = {NULL};
    assert_int_equal(load(&o, &cfg, 3, argv, envp, err), -1);
    assert_non_null(strstr(err, "bogus"));
    gp_config_free(&cfg);
}

static void test_state_directory(void **st)
{
    (void)st;
    gps_config o;
    gp_config cfg;
    char err[512];
    char *argv[] = {"gpupool-server", NULL};
    char *envp[] = {"STATE_DIRECTORY=/var/lib/gpupool:/other", NULL};
    assert_int_equal(load(&o, &cfg, 1, argv, envp, err), 0);
    assert_string_equal(o.db, "/var/lib/gpupool/gpupool.db");
    gp_config_free(&cfg);
    char *argv2[] = {"gpupool-server", "--db", "/tmp/explicit.db", NULL};
    assert_int_equal(load(&o, &cfg, 3, argv2, envp, err), 0);
    assert_string_equal(o.db, "/tmp/explicit.db");
    gp_config_free(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_state_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
