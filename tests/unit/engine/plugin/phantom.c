/* A shared library that the broken test plugin depends on; the test
 * plugin is built without a run path to it, so loading that plugin fails
 * exactly as a CUDA plugin does on a machine without libcudart. Loaded by
 * path, this library is also "a shared object that is no gpupool plugin". */
int gpe_test_phantom(void);
int gpe_test_phantom(void)
{
    return 42;
}
