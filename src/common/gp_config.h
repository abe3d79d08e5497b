/*
 * gp_config: table-driven configuration shared by every binary.
 *
 * One row per option (name, type, target field, default, bounds, help).
 * Values are layered, lowest to highest precedence:
 *
 *   built-in default  <  config file (key = value, # comments)
 *                     <  command-line flag (--key VALUE, --key=VALUE, --flag, --no-flag)
 *                     <  environment (GPUPOOL_KEY, upper case, '-' -> '_')
 *
 * The environment wins because it is the deployment's last word (systemd
 * Environment=, containers). The config file path is itself the option
 * "config" (--config FILE or GPUPOOL_CONFIG). Every value is validated
 * (type, bounds, choices); a bad one stops start-up with a message naming
 * the key and where the value came from.
 *
 * Typical use:
 *
 *   struct opts { char *listen; long long max_queue; bool verbose; };
 *   static const gp_opt table[] = {
 *     { "listen", GP_OPT_STR, offsetof(struct opts, listen), "127.0.0.1:8080", 0, 0, NULL,
 *       "address to listen on" },
 *     ...
 *   };
 *   gp_config cfg;
 *   if (gp_config_parse(&cfg, table, n, &opts, argc, argv, err, sizeof err) < 0) { ...exit 2 }
 *   if (cfg.print_config) gp_config_print(&cfg, stdout);
 *   ...
 *   gp_config_free(&cfg);   // frees the strings it stored in opts
 */
#ifndef GP_CONFIG_H
#define GP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
    GP_OPT_STR,     /* char * (owned by the gp_config; NULL when unset) */
    GP_OPT_INT,     /* long long */
    GP_OPT_BOOL,    /* bool: true/false/yes/no/on/off/1/0 */
    GP_OPT_DOUBLE,  /* double */
} gp_opt_type;

typedef enum { GP_SRC_DEFAULT = 0, GP_SRC_FILE, GP_SRC_FLAG, GP_SRC_ENV } gp_opt_source;

typedef struct gp_opt {
    const char *name;     /* file key and flag name; env GPUPOOL_<NAME> */
    gp_opt_type type;
    size_t offset;        /* offsetof() the field in the caller's options struct */
    const char *def;      /* default as text; NULL leaves a string unset */
    double min, max;      /* inclusive bounds for INT/DOUBLE; ignored when min >= max */
    const char *choices;  /* "a|b|c": the only accepted values of a STR; NULL = any */
    const char *help;
} gp_opt;

typedef struct gp_config {
    const gp_opt *table;
    size_t n;
    void *target;
    gp_opt_source *src;      /* per row: where the effective value came from */
    char *config_path;       /* the file that was read, or NULL */
    bool print_config;       /* --print-config was given */
    bool help;               /* --help was given */
    char **positional;       /* arguments that are not flags (borrowed from argv) */
    int npositional;
} gp_config;

/* Parse defaults, file, flags and environment into target.
 * Returns 0, or -1 with a message in err naming the key. */
int gp_config_parse(gp_config *cfg, const gp_opt *table, size_t n, void *target, int argc,
                    char **argv, char *err, size_t errlen);
/* Same, but environment taken from envp (NULL-terminated "K=V" strings)
 * instead of the process environment: lets tests control it. */
int gp_config_parse_env(gp_config *cfg, const gp_opt *table, size_t n, void *target, int argc,
                        char **argv, char **envp, char *err, size_t errlen);
/* Print "key = value  # source" for every option. */
void gp_config_print(const gp_config *cfg, FILE *out);
/* Print aligned flag help from the table. */
void gp_config_usage(const gp_opt *table, size_t n, FILE *out);
/* Free strings stored into target and the config's own storage. */
void gp_config_free(gp_config *cfg);
const char *gp_config_source_name(gp_opt_source s);

#endif
