/* Unit tests for src/agent/agent_config.c: layering and the cross-field
 * rules (one backend, URLs, labels), with a controlled environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "agent/agent_config.h"

static char *noenv[] = {"GPUPOOL_CONFIG=", NULL};

static int load(agent_options *o, gp_config *cfg, char **env, char *err, size_t errlen, int argc,
                char **argv)
{
    return agent_config_load(o, cfg, argc, argv, env ? env : noenv, err, errlen);
}

#define ARGV(...) (char *[]){"gpupool-agent", __VA_ARGS__, NULL}
#define ARGC(...) ((int)(sizeof((char *[]){"gpupool-agent", __VA_ARGS__}) / sizeof(char *)))

static void openai_ok_and_defaults(void **st)
{
    (void)st;
    agent_options o;
    gp_config cfg;
    char err[300] = "";
    int rc = load(&o, &cfg, NULL, err, sizeof err,
                  ARGC("--upstream", "http://127.0.0.1:9", "--upstream-model", "m"),
                  ARGV("--upstream", "http://127.0.0.1:9", "--upstream-model", "m"));
    assert_int_equal(rc, 0);
    assert_string_equal(o.server, "http://127.0.0.1:8080");
    assert_int_equal(o.slots, 0); /* auto: 1 for openai (agent_jobs.c), from VRAM on GPUs */
    assert_string_equal(o.slots_opt, "auto");
    assert_string_equal(o.backend, "auto");
    assert_string_equal(o.devices, "all");
    assert_string_equal(o.kv_f16, "auto");
    assert_null(o.token);
    assert_null(o.model);
    assert_string_equal(o.upstream_model, "m");
    gp_config_free(&cfg);
}

static void env_beats_flag(void **st)
{
    (void)st;
    agent_options o;
    gp_config cfg;
    char err[300] = "";
    char *env[] = {"GPUPOOL_CONFIG=", "GPUPOOL_SLOTS=9", "GPUPOOL_STATE_DIR=/x", NULL};
    int rc = load(&o, &cfg, env, err, sizeof err,
                  ARGC("--slots", "2", "--upstream", "http://h:1", "--upstream-model", "m"),
                  ARGV("--slots", "2", "--upstream", "http://h:1", "--upstream-model", "m"));
    assert_int_equal(rc, 0);
    assert_int_equal(o.slots, 9);
    assert_string_equal(o.state_dir, "/x");
    gp_config_free(&cfg);
}

static void gpu_options(void **st)
{
    (void)st;
    agent_options o;
    gp_config cfg;
    char err[300] = "";
    int rc = load(&o, &cfg, NULL, err, sizeof err,
                  ARGC("--model", "x.gguf", "--backend", "cuda", "--devices", "2,0",
                       "--slots", "12", "--kv-f16", "off"),
                  ARGV("--model", "x.gguf", "--backend", "cuda", "--devices", "2,0",
                       "--slots", "12", "--kv-f16", "off"));
    assert_int_equal(rc, 0);
    assert_int_equal(o.slots, 12);
    assert_string_equal(o.backend, "cuda");
    assert_string_equal(o.kv_f16, "off");
    int dev[AGENT_MAX_DEVICES];
    assert_int_equal(agent_devices_parse(o.devices, dev, err, sizeof err), 2);
    assert_int_equal(dev[0], 2);
    assert_int_equal(dev[1], 0);
    assert_int_equal(agent_devices_parse("all", dev, err, sizeof err), 0);
    gp_config_free(&cfg);
}

/* Neither --model nor --upstream is no longer an error (issue 27): the
 * agent offers itself to the server's deployments. */
static void no_backend_means_deployments(void **st)
{
    (void)st;
    agent_options o;
    gp_config cfg;
    char err[300] = "";
    char **argv = ARGV("--slots", "2");
    assert_int_equal(load(&o, &cfg, NULL, err, sizeof err, ARGC("--slots", "2"), argv), 0);
    assert_null(o.model);
    assert_null(o.upstream);
    gp_config_free(&cfg);
}

static void rule_errors_name_the_key(void **st)
{
    (void)st;
    struct {
        int argc;
        char **argv;
        const char *want;
    } cases[] = {
        {ARGC("--upstream", "http://h:1"), ARGV("--upstream", "http://h:1"), "upstream-model"},
        {ARGC("--upstream", "h:1", "--upstream-model", "m"),
         ARGV("--upstream", "h:1", "--upstream-model", "m"), "upstream"},
        {ARGC("--upstream", "http://h:1", "--upstream-model", "m", "--model", "x.gguf"),
         ARGV("--upstream", "http://h:1", "--upstream-model", "m", "--model", "x.gguf"),
         "choose one"},
        {ARGC("--server", "ftp://x", "--model", "x.gguf"),
         ARGV("--server", "ftp://x", "--model", "x.gguf"), "server"},
        {ARGC("--labels", "a", "--model", "x.gguf"), ARGV("--labels", "a", "--model", "x.gguf"),
         "labels"},
        {ARGC("--slots", "0", "--model", "x.gguf"), ARGV("--slots", "0", "--model", "x.gguf"),
         "slots"},
        {ARGC("--slots", "many", "--model", "x.gguf"),
         ARGV("--slots", "many", "--model", "x.gguf"), "slots: 'many' must be auto"},
        {ARGC("--slots", "1025", "--model", "x.gguf"),
         ARGV("--slots", "1025", "--model", "x.gguf"), "slots"},
        {ARGC("--backend", "gpu", "--model", "x.gguf"),
         ARGV("--backend", "gpu", "--model", "x.gguf"), "backend"},
        {ARGC("--devices", "0,x", "--model", "x.gguf"),
         ARGV("--devices", "0,x", "--model", "x.gguf"), "devices: '0,x'"},
        {ARGC("--devices", "1,1", "--model", "x.gguf"),
         ARGV("--devices", "1,1", "--model", "x.gguf"), "listed twice"},
        {ARGC("--devices", "", "--model", "x.gguf"), ARGV("--devices", "", "--model", "x.gguf"),
         "devices"},
        {ARGC("--kv-f16", "yes", "--model", "x.gguf"),
         ARGV("--kv-f16", "yes", "--model", "x.gguf"), "kv-f16"},
        {ARGC("--model", "x.gguf", "stray"), ARGV("--model", "x.gguf", "stray"), "stray"},
        {ARGC("--model", "x.gguf", "--alias", ""), ARGV("--model", "x.gguf", "--alias", ""),
         "alias"},
        {ARGC("--bogus", "1"), ARGV("--bogus", "1"), "bogus"},
        /* A token goes into a header: no spaces or line breaks. */
        {ARGC("--token", "Bearer gpk_x", "--model", "x.gguf"),
         ARGV("--token", "Bearer gpk_x", "--model", "x.gguf"), "token"},
        {ARGC("--token", "gpk_x\r\nX-Evil: 1", "--model", "x.gguf"),
         ARGV("--token", "gpk_x\r\nX-Evil: 1", "--model", "x.gguf"), "token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        agent_options o;
        gp_config cfg;
        char err[300] = "";
        int rc = load(&o, &cfg, NULL, err, sizeof err, cases[i].argc, cases[i].argv);
        if (rc != -1 || !strstr(err, cases[i].want))
            fail_msg("case %zu: rc %d err '%s' (want '%s')", i, rc, err, cases[i].want);
        gp_config_free(&cfg);
    }
}

/* --server URL1,URL2: trimmed, in order; one URL is a list of one. */
static void server_lists(void **st)
{
    (void)st;
    char **l = NULL;
    char err[300] = "";
    int n = agent_servers_parse("http://a:1/", &l, err, sizeof err);
    assert_int_equal(n, 1);
    assert_string_equal(l[0], "http://a:1");
    agent_servers_free(l, n);
    n = agent_servers_parse("http://a:1, https://b:2/ ,http://c", &l, err, sizeof err);
    assert_int_equal(n, 3);
    assert_string_equal(l[0], "http://a:1");
    assert_string_equal(l[1], "https://b:2");
    assert_string_equal(l[2], "http://c");
    agent_servers_free(l, n);
}

/* A bad list is refused at start-up with the item that is wrong. */
static void server_list_errors(void **st)
{
    (void)st;
    static const struct {
        const char *spec;
        const char *needle;
    } cases[] = {
        {"", "must be an http"},
        {",http://a", "item 1 of the list is empty"},
        {"http://a,", "item 2 of the list is empty"},
        {"http://a,,http://b", "item 2 of the list is empty"},
        {"http://a, ,http://b", "item 2 of the list is empty"},
        {"http://a,ftp://b", "'ftp://b' must be an http:// or https:// URL"},
        {"http://a,b:80", "'b:80' must be an http"},
        {"http://", "must be an http"},
        {"http://a,http://b,http://a/", "'http://a' is listed twice"},
        {"http://1,http://2,http://3,http://4,http://5,http://6,http://7,http://8,http://9,"
         "http://10,http://11,http://12,http://13,http://14,http://15,http://16,http://17",
         "at most 16 servers"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char **l = (char **)&l; /* must come back NULL */
        char err[300] = "";
        assert_int_equal(agent_servers_parse(cases[i].spec, &l, err, sizeof err), -1);
        assert_null(l);
        if (!strstr(err, cases[i].needle))
            fail_msg("'%s': error '%s' lacks '%s'", cases[i].spec, err, cases[i].needle);
    }
}

/* The flag, GPUPOOL_SERVER and the config file all go through the same check. */
static void server_list_from_env_and_start_up(void **st)
{
    (void)st;
    agent_options o;
    gp_config cfg;
    char err[300] = "";
    char *env[] = {"GPUPOOL_CONFIG=", "GPUPOOL_SERVER=http://a:1,http://b:2", NULL};
    int rc = load(&o, &cfg, env, err, sizeof err, ARGC("--model", "x.gguf"),
                  ARGV("--model", "x.gguf"));
    assert_int_equal(rc, 0);
    assert_string_equal(o.server, "http://a:1,http://b:2");
    gp_config_free(&cfg);
    rc = load(&o, &cfg, NULL, err, sizeof err, ARGC("--server", "http://a,,http://b", "--model",
                                                    "x.gguf"),
              ARGV("--server", "http://a,,http://b", "--model", "x.gguf"));
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "server: item 2 of the list is empty"));
    gp_config_free(&cfg);
    rc = load(&o, &cfg, NULL, err, sizeof err,
              ARGC("--server", "http://a:1,http://a:1", "--model", "x.gguf"),
              ARGV("--server", "http://a:1,http://a:1", "--model", "x.gguf"));
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "listed twice"));
    gp_config_free(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(openai_ok_and_defaults),
        cmocka_unit_test(env_beats_flag),
        cmocka_unit_test(gpu_options),
        cmocka_unit_test(rule_errors_name_the_key),
        cmocka_unit_test(no_backend_means_deployments),
        cmocka_unit_test(server_lists),
        cmocka_unit_test(server_list_errors),
        cmocka_unit_test(server_list_from_env_and_start_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
