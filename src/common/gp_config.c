/* gp_config: see gp_config.h. */
#include "common/gp_config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"

extern char **environ;

#define CONFIG_FILE_MAX (1u << 20)

static const char *source_names[] = {"default", "file", "flag", "env"};

const char *gp_config_source_name(gp_opt_source s)
{
    return source_names[s];
}

/* Option names compare with '-' and '_' as the same character, so that
 * --max-queue, --max_queue and "max_queue = ..." all name one option. */
static bool name_eq(const char *a, size_t alen, const char *b)
{
    size_t i = 0;
    for (; i < alen && b[i]; i++) {
        char x = a[i] == '-' ? '_' : a[i];
        char y = b[i] == '-' ? '_' : b[i];
        if (x != y)
            return false;
    }
    return i == alen && b[i] == '\0';
}

static const gp_opt *find_opt(const gp_opt *t, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (name_eq(name, len, t[i].name))
            return &t[i];
    return NULL;
}

static bool choice_ok(const char *choices, const char *v)
{
    size_t vl = strlen(v);
    const char *p = choices;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == vl && strncmp(p, v, l) == 0)
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

static int parse_bool(const char *v, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/* Validate and store one value. `where` describes the source for errors. */
static int set_value(gp_config *cfg, const gp_opt *o, const char *v, gp_opt_source src,
                     const char *where, char *err, size_t errlen)
{
    char *field = (char *)cfg->target + o->offset;
    switch (o->type) {
    case GP_OPT_STR: {
        if (o->choices && !choice_ok(o->choices, v)) {
            snprintf(err, errlen, "%s: invalid value '%s' for '%s' (expected one of %s)", where,
                     v, o->name, o->choices);
            return -1;
        }
        char *dup = strdup(v);
        if (!dup) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        free(*(char **)field);
        *(char **)field = dup;
        break;
    }
    case GP_OPT_INT: {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end != '\0') {
            snprintf(err, errlen, "%s: invalid value '%s' for '%s' (expected an integer)", where,
                     v, o->name);
            return -1;
        }
        if (o->min < o->max && ((double)x < o->min || (double)x > o->max)) {
            snprintf(err, errlen, "%s: value %lld for '%s' is out of range [%.0f, %.0f]", where,
                     x, o->name, o->min, o->max);
            return -1;
        }
        *(long long *)field = x;
        break;
    }
    case GP_OPT_DOUBLE: {
        char *end = NULL;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end != '\0' || !isfinite(x)) {
            snprintf(err, errlen, "%s: invalid value '%s' for '%s' (expected a number)", where, v,
                     o->name);
            return -1;
        }
        if (o->min < o->max && (x < o->min || x > o->max)) {
            snprintf(err, errlen, "%s: value %g for '%s' is out of range [%g, %g]", where, x,
                     o->name, o->min, o->max);
            return -1;
        }
        *(double *)field = x;
        break;
    }
    case GP_OPT_BOOL: {
        bool b;
        if (parse_bool(v, &b) < 0) {
            snprintf(err, errlen, "%s: invalid value '%s' for '%s' (expected true or false)",
                     where, v, o->name);
            return -1;
        }
        *(bool *)field = b;
        break;
    }
    }
    cfg->src[o - cfg->table] = src;
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int load_file(gp_config *cfg, const char *path, char *err, size_t errlen)
{
    size_t len;
    int rc = -1;
    char *text = gp_read_file(path, &len, CONFIG_FILE_MAX);
    if (!text) {
        snprintf(err, errlen, "config: cannot read '%s': %s", path, strerror(errno));
        return -1;
    }
    if (strlen(text) != len) {
        snprintf(err, errlen, "config: '%s' contains a NUL byte", path);
        goto done;
    }
    int lineno = 0;
    char *save = NULL;
    /* strtok_r would skip empty lines and miscount; walk by hand. */
    for (char *line = text; line; line = save) {
        char *nl = strchr(line, '\n');
        save = nl ? nl + 1 : NULL;
        if (nl)
            *nl = '\0';
        lineno++;
        char *s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected 'key = value'", path, lineno);
            goto done;
        }
        *eq = '\0';
        char *key = trim(s);
        char *val = trim(eq + 1);
        /* Allow "value  # comment" and quoted values. */
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = '\0';
            val++;
        } else {
            char *hash = strstr(val, " #");
            if (hash) {
                *hash = '\0';
                val = trim(val);
            }
        }
        const gp_opt *o = find_opt(cfg->table, cfg->n, key, strlen(key));
        if (!o || strcmp(o->name, "config") == 0) {
            snprintf(err, errlen, "%s:%d: unknown key '%s'", path, lineno, key);
            goto done;
        }
        char where[300];
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        if (set_value(cfg, o, val, GP_SRC_FILE, where, err, errlen) < 0)
            goto done;
    }
    rc = 0;
done:
    free(text);
    return rc;
}

static void env_name(const char *name, char *out, size_t outlen)
{
    size_t i = (size_t)snprintf(out, outlen, "GPUPOOL_");
    for (const char *p = name; *p && i + 1 < outlen; p++)
        out[i++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    out[i] = '\0';
}

static const char *env_lookup(char **envp, const char *key)
{
    size_t kl = strlen(key);
    for (char **e = envp; e && *e; e++)
        if (strncmp(*e, key, kl) == 0 && (*e)[kl] == '=')
            return *e + kl + 1;
    return NULL;
}

/* Flags pass: when only_config, just find --config; else apply all flags. */
static int scan_flags(gp_config *cfg, int argc, char **argv, bool only_config, char **config,
                      char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            for (int j = i + 1; j < argc && !only_config; j++)
                cfg->positional[cfg->npositional++] = argv[j];
            break;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (!only_config)
                cfg->positional[cfg->npositional++] = a;
            continue;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        if (nl == 4 && strncmp(name, "help", 4) == 0) {
            cfg->help = true;
            continue;
        }
        if (name_eq(name, nl, "print-config")) {
            cfg->print_config = true;
            continue;
        }
        const gp_opt *o = find_opt(cfg->table, cfg->n, name, nl);
        bool negated = false;
        if (!o && nl > 3 && strncmp(name, "no-", 3) == 0) {
            o = find_opt(cfg->table, cfg->n, name + 3, nl - 3);
            if (o && o->type != GP_OPT_BOOL)
                o = NULL;
            negated = o != NULL;
        }
        if (!o) {
            if (!only_config) {
                snprintf(err, errlen, "unknown option '--%.*s' (see --help)", (int)nl, name);
                return -1;
            }
            continue;
        }
        const char *val;
        if (negated) {
            if (eq) {
                snprintf(err, errlen, "option '--%.*s' takes no value", (int)nl, name);
                return -1;
            }
            val = "false";
        } else if (eq) {
            val = eq + 1;
        } else if (o->type == GP_OPT_BOOL) {
            val = "true";
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            snprintf(err, errlen, "option '--%s' needs a value", o->name);
            return -1;
        }
        if (strcmp(o->name, "config") == 0) {
            if (only_config)
                *config = (char *)val;
            if (!only_config)
                cfg->src[o - cfg->table] = GP_SRC_FLAG;
            continue;
        }
        if (only_config)
            continue;
        char where[160];
        snprintf(where, sizeof where, "flag --%s", o->name);
        if (set_value(cfg, o, val, GP_SRC_FLAG, where, err, errlen) < 0)
            return -1;
    }
    return 0;
}

int gp_config_parse_env(gp_config *cfg, const gp_opt *table, size_t n, void *target, int argc,
                        char **argv, char **envp, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->table = table;
    cfg->n = n;
    cfg->target = target;
    cfg->src = calloc(n ? n : 1, sizeof *cfg->src);
    cfg->positional = calloc((size_t)argc + 1, sizeof(char *));
    if (!cfg->src || !cfg->positional) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }

    /* 1. defaults */
    for (size_t i = 0; i < n; i++) {
        char *field = (char *)target + table[i].offset;
        if (table[i].type == GP_OPT_STR)
            *(char **)field = NULL;
        if (!table[i].def)
            continue;
        char where[160];
        snprintf(where, sizeof where, "default of %s", table[i].name);
        if (set_value(cfg, &table[i], table[i].def, GP_SRC_DEFAULT, where, err, errlen) < 0)
            return -1;
    }

    /* 2. file: env GPUPOOL_CONFIG beats --config, which beats the default */
    char *path = NULL;
    const gp_opt *copt = find_opt(table, n, "config", 6);
    if (scan_flags(cfg, argc, argv, true, &path, err, errlen) < 0)
        return -1;
    const char *envpath = env_lookup(envp, "GPUPOOL_CONFIG");
    if (envpath && *envpath)
        path = (char *)envpath;
    bool explicit_path = path != NULL;
    if (!path && copt)
        path = *(char **)((char *)target + copt->offset);
    if (path && *path) {
        /* A default path that does not exist is fine (no file yet); an
         * explicitly named one must be readable. */
        FILE *probe = fopen(path, "r");
        if (probe || explicit_path) {
            if (probe)
                fclose(probe);
            if (load_file(cfg, path, err, errlen) < 0)
                return -1;
            cfg->config_path = strdup(path);
        }
    }
    if (copt && path) {
        char **f = (char **)((char *)target + copt->offset);
        if (*f != path) {
            free(*f);
            *f = strdup(path);
        }
        cfg->src[copt - table] = envpath ? GP_SRC_ENV : explicit_path ? GP_SRC_FLAG
                                                                       : GP_SRC_DEFAULT;
    }

    /* 3. flags */
    if (scan_flags(cfg, argc, argv, false, NULL, err, errlen) < 0)
        return -1;
    if (copt && envpath)
        cfg->src[copt - table] = GP_SRC_ENV;

    /* 4. environment */
    for (size_t i = 0; i < n; i++) {
        if (strcmp(table[i].name, "config") == 0)
            continue;
        char key[128];
        env_name(table[i].name, key, sizeof key);
        const char *v = env_lookup(envp, key);
        if (!v)
            continue;
        char where[160];
        snprintf(where, sizeof where, "environment %s", key);
        if (set_value(cfg, &table[i], v, GP_SRC_ENV, where, err, errlen) < 0)
            return -1;
    }
    return 0;
}

int gp_config_parse(gp_config *cfg, const gp_opt *table, size_t n, void *target, int argc,
                    char **argv, char *err, size_t errlen)
{
    return gp_config_parse_env(cfg, table, n, target, argc, argv, environ, err, errlen);
}

void gp_config_print(const gp_config *cfg, FILE *out)
{
    for (size_t i = 0; i < cfg->n; i++) {
        const gp_opt *o = &cfg->table[i];
        char *field = (char *)cfg->target + o->offset;
        char val[512];
        switch (o->type) {
        case GP_OPT_STR: {
            const char *s = *(char **)field;
            /* Never print secrets back. */
            bool secret = strstr(o->name, "token") || strstr(o->name, "key") ||
                          strstr(o->name, "secret");
            if (!s)
                snprintf(val, sizeof val, "(unset)");
            else if (secret && strstr(o->name, "file") == NULL)
                snprintf(val, sizeof val, "(set, hidden)");
            else
                snprintf(val, sizeof val, "%s", s);
            break;
        }
        case GP_OPT_INT:
            snprintf(val, sizeof val, "%lld", *(long long *)field);
            break;
        case GP_OPT_DOUBLE:
            snprintf(val, sizeof val, "%g", *(double *)field);
            break;
        case GP_OPT_BOOL:
            snprintf(val, sizeof val, "%s", *(bool *)field ? "true" : "false");
            break;
        }
        fprintf(out, "%-22s = %-30s # %s\n", o->name, val, source_names[cfg->src[i]]);
    }
}

void gp_config_usage(const gp_opt *table, size_t n, FILE *out)
{
    for (size_t i = 0; i < n; i++) {
        const gp_opt *o = &table[i];
        char flag[96];
        const char *arg = o->type == GP_OPT_BOOL ? "" : o->type == GP_OPT_STR ? " VALUE" : " N";
        snprintf(flag, sizeof flag, "--%s%s", o->name, arg);
        fprintf(out, "  %-28s %s", flag, o->help ? o->help : "");
        if (o->choices)
            fprintf(out, " (%s)", o->choices);
        if (o->def && o->type != GP_OPT_BOOL)
            fprintf(out, " [default %s]", o->def);
        fputc('\n', out);
    }
    fprintf(out, "  %-28s %s\n", "--print-config", "print each effective value and its source");
    fprintf(out, "  %-28s %s\n", "--help", "show this help");
    fprintf(out, "Every option can also be set in the config file (key = value) or as\n"
                 "GPUPOOL_<KEY> in the environment (environment > flags > file > defaults).\n");
}

void gp_config_free(gp_config *cfg)
{
    if (cfg->table && cfg->target) {
        for (size_t i = 0; i < cfg->n; i++) {
            if (cfg->table[i].type != GP_OPT_STR)
                continue;
            char **f = (char **)((char *)cfg->target + cfg->table[i].offset);
            free(*f);
            *f = NULL;
        }
    }
    free(cfg->src);
    free(cfg->positional);
    free(cfg->config_path);
    memset(cfg, 0, sizeof *cfg);
}
