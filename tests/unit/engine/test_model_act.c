/*
 * model activations (gpe_model_gelu_row, gpe_model_silu_mul_row) called
 * in a process that has loaded no model file: the CUDA self-test builds
 * its models in memory and reached GELU with the F16 table still empty
 * (every |x| < 10 gave 0), so gemma's CPU reference was wrong. Its own
 * executable, so no earlier test has loaded a file and filled the table.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>

#include <cmocka.h>

#include "engine/model.h"

/* GELU-tanh in double: the reference the F16 evaluation approximates */
static double gelu_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(0.79788456080286535587989211986876 * x *
                                 (1.0 + 0.044715 * x * x)));
}

static void test_gelu_without_a_loaded_model(void **state)
{
    (void)state;
    enum { N = 601 };   /* more than one 256-value chunk, not a multiple */
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = -12.0f + 24.0f * (float)i / (float)(N - 1);
    float y[N];
    for (int i = 0; i < N; i++)
        y[i] = x[i];
    gpe_model_gelu_row(y, N);
    for (int i = 0; i < N; i++) {
        const double want = gelu_ref(x[i]);
        /* input and result rounded to F16: ~2^-11 relative each, and the
         * slope of GELU is at most ~1.13 */
        const double tol = 3e-3 * fmax(1.0, fabs(want));
        if (fabs((double)y[i] - want) > tol)
            fail_msg("gelu(%g) = %g, want %g", (double)x[i], (double)y[i], want);
    }
}

static void test_silu_mul(void **state)
{
    (void)state;
    float g[5] = { -8.0f, -1.0f, 0.0f, 1.5f, 9.0f };
    const float u[5] = { 2.0f, -3.0f, 4.0f, 0.5f, -1.0f };
    float want[5];
    for (int i = 0; i < 5; i++)
        want[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * (double)u[i]);
    gpe_model_silu_mul_row(g, u, 5);
    for (int i = 0; i < 5; i++)
        assert_float_equal(g[i], want[i], 1e-5f * fmaxf(1.0f, fabsf(want[i])));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu_without_a_loaded_model),
        cmocka_unit_test(test_silu_mul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
