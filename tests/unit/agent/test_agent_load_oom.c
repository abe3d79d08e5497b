/*
 * The gguf backend's start (agent_backend_gguf_create_status: the plan,
 * the model load, the engine contexts, the slots) when memory runs out, on
 * stories260K: the backend is whole, or NULL with *nomem set, never NULL
 * as for a damaged file (*nomem false: gpupool-agent would exit 2, which
 * systemd does not restart, and a deployment's replica would be failed for
 * good). The N-th of the agent's, the engine's and jansson's malloc,
 * calloc, realloc and strdup fails (ld --wrap: part-agent-load-oom.cmake,
 * through tests/unit/server/fixture_oom.h arm_libc), for N = 1, 2, ...
 * until a run ends without reaching it. Then what NOMEM must not be
 * mistaken for: a cut file and a missing one are NULL with *nomem false.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "agent/backend.h"
#include "common/gp_json.h"
#include "gpupool/engine.h"

#define GPS_FIXTURE_OOM_LIBC
#define GPS_FIXTURE_OOM_STRDUP
#include "../server/fixture_oom.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"

static agent_options opts(const char *model, const char *backend)
{
    agent_options o;
    memset(&o, 0, sizeof o);
    o.model = (char *)model;
    o.backend = (char *)backend;
    o.slots = 1;
    o.threads = 1;
    o.ctx_size = 128;
    return o;
}

/* The sweep over one start; returns how many runs failed an allocation. */
static int sweep(const char *backend)
{
    agent_options o = opts(STORIES, backend);
    char err[512];
    int n_failed = 0;
    for (size_t n = 1;; n++) {
        bool nomem = false;
        err[0] = '\0';
        arm_libc(n);
        agent_backend *b = agent_backend_gguf_create_status(&o, &nomem, err, sizeof err);
        const bool hit = disarm();
        if (!hit) {
            if (!b)
                fail_msg("run %zu without a failure: %s", n, err);
            assert_false(nomem);
            b->ops->destroy(b);
            break;
        }
        n_failed++;
        if (b) {
            /* a failure the backend got over: it serves the model */
            assert_false(nomem);
            json_t *m = b->ops->models(b);
            assert_int_equal(json_array_size(m), 1);
            json_decref(m);
            b->ops->destroy(b);
            continue;
        }
        if (!nomem)
            fail_msg("%s: allocation %zu failed: \"%s\" taken for a failure a retry cannot fix "
                     "(want *nomem)", backend ? backend : "default", n, err);
    }
    return n_failed;
}

static void test_cpu_sweep(void **state)
{
    (void)state;
    assert_true(sweep("cpu") > 5);
}

/* --backend auto without a GPU (this build): the plan looks for one first */
static void test_auto_sweep(void **state)
{
    (void)state;
    assert_true(sweep("auto") > 5);
}

/* stories260K cut inside its header: NULL, *nomem false (exit 2). */
static void test_damaged_is_not_nomem(void **state)
{
    (void)state;
    FILE *f = fopen(STORIES, "rb");
    assert_non_null(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n == sizeof buf);
    char path[] = "/tmp/gp_agent_load_oom_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *w = fdopen(fd, "wb");
    assert_non_null(w);
    assert_int_equal(fwrite(buf, 1, n, w), n);
    fclose(w);
    agent_options o = opts(path, "cpu");
    char err[512] = "";
    bool nomem = true;
    agent_backend *b = agent_backend_gguf_create_status(&o, &nomem, err, sizeof err);
    unlink(path);
    assert_null(b);
    assert_false(nomem);
    assert_non_null(strstr(err, "FORMAT"));

    o = opts(GP_SOURCE_DIR "/models/no-such-model.gguf", "cpu");
    nomem = true;
    assert_null(agent_backend_gguf_create_status(&o, &nomem, err, sizeof err));
    assert_false(nomem);
}

int main(void)
{
    gp_json_init();
    gpe_set_json_alloc_failures(gp_json_alloc_failures);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_sweep),
        cmocka_unit_test(test_auto_sweep),
        cmocka_unit_test(test_damaged_is_not_nomem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
