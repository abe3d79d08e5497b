/* Test plugin whose dependency (libgpe_test_phantom.so) cannot be found:
 * dlopen() fails before its entry is looked up (see part-45-backend.cmake). */
int gpe_test_phantom(void);
int gpe_test_needs_missing(void);
int gpe_test_needs_missing(void)
{
    return gpe_test_phantom();
}
