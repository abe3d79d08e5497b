/*
 * gpupool-run: entry point. Dispatches to one subcommand (run.h).
 */
#include <stdio.h>
#include <string.h>

#include <gpupool/engine.h>

#include "common/gp_json.h"
#include "run/run.h"

static const gpr_cmd *const cmds[] = {
    &gpr_cmd_generate, &gpr_cmd_tokenize, &gpr_cmd_info, &gpr_cmd_bench, &gpr_cmd_selftest,
};
#define N_CMDS (sizeof cmds / sizeof cmds[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: gpupool-run COMMAND [options]\n\n"
                 "Run a GGUF model with the gpupool engine, without any server.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < N_CMDS; i++)
        fprintf(out, "  %-10s %s\n", cmds[i]->name, cmds[i]->summary);
    fprintf(out, "\n'gpupool-run COMMAND --help' shows the options of a command.\n");
}

int main(int argc, char **argv)
{
    /* jansson's counting allocator (gp_json.h) before anything uses
     * jansson, its count for the engine's JSON (engine.h
     * gpe_set_json_alloc_failures) and gp_json's reader for the engine's
     * loads (gpe_set_json_loader: jansson's can crash short of memory), as
     * the agent does. */
    gp_json_init();
    gpe_set_json_alloc_failures(gp_json_alloc_failures);
    gpe_set_json_loader(gp_json_load_checked);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        if (argc >= 3)
            for (size_t i = 0; i < N_CMDS; i++)
                if (strcmp(argv[2], cmds[i]->name) == 0) {
                    cmds[i]->usage(stdout);
                    return 0;
                }
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < N_CMDS; i++)
        if (strcmp(argv[1], cmds[i]->name) == 0)
            return cmds[i]->exec(argc - 1, argv + 1);
    fprintf(stderr, "gpupool-run: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
