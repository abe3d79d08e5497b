/* Keeps the engine archive non-empty while parts are added; also the
 * library's version string for tools. */
const char *gpe_version(void);
const char *gpe_version(void)
{
    return "0.1.0";
}
