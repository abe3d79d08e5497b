/*
 * gpupoolctl: the operator's command line for the admin API (/admin/...).
 *
 *   gpupoolctl [--server URL] [--key KEY | --key-file F] [--json] [--ca-file F] [--insecure]
 *              COMMAND ...
 *
 * Server: --server > $GPUPOOL_SERVER > the config file > http://127.0.0.1:8080.
 * Admin key: --key > $GPUPOOL_ADMIN_KEY > --key-file > $GPUPOOL_ADMIN_KEY_FILE >
 * the config file's key_file > $GPUPOOL_STATE_DIR/admin.key >
 * /var/lib/gpupool/admin.key (the last two read when readable; no key at all
 * is fine for a loopback server with auth off). CA: --ca-file >
 * $GPUPOOL_CA_FILE > the config file's ca_file. Global options may come
 * anywhere. The config file ($GPUPOOL_CTL_CONFIG or
 * ~/.config/gpupool/ctl.conf) holds "name = value" lines.
 *
 * Output: aligned tables for people; --json prints the server's JSON as is
 * (pretty). Exit codes: 0 ok, 1 the server refused (its message and code
 * on stderr) or could not be reached, 2 usage error.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "common/gp_util.h"
#include "ctl/ctl_fmt.h"
#include "ctl/ctl_http.h"

#define DEFAULT_SERVER "http://127.0.0.1:8080"
#define DEFAULT_KEY_FILE "/var/lib/gpupool/admin.key"
#define EXIT_USAGE 2

static const char usage_text[] =
    "usage: gpupoolctl [--server URL] [--key KEY | --key-file F] [--json] [--ca-file F]\n"
    "                  [--insecure] COMMAND\n"
    "\n"
    "commands:\n"
    "  keys list [--role R]\n"
    "  keys create --role client|agent|admin|enrollment [--name N] [--expires-in D]\n"
    "              [--rpm N] [--tokens-per-day N] [--max-concurrent N]\n"
    "  keys revoke ID\n"
    "  keys limits ID [--rpm N] [--tokens-per-day N] [--max-concurrent N]\n"
    "  tokens create [--name N] [--max-uses N] [--expires-in D]\n"
    "  tokens list\n"
    "  tokens revoke ID\n"
    "  agents list\n"
    "  agents drain AGENT [--undo]      AGENT: id, name or unique id prefix\n"
    "  agents remove AGENT [--force]\n"
    "  models pins\n"
    "  models pin NAME SHA256       refuse agents whose file for NAME has another sha256\n"
    "  models unpin NAME\n"
    "  models deploy SOURCE --name N [--replicas R] [--labels k=v,...] [--sha256 H]\n"
    "                [--bytes SIZE]   SOURCE: https://.../F.gguf, hf:OWNER/REPO/F.gguf\n"
    "  models undeploy NAME\n"
    "  models scale NAME --replicas R\n"
    "  models list                  deployments (state and progress per replica), local models\n"
    "  models show NAME             one deployment; why agents were refused when it is short\n"
    "  jobs list [--status S] [--model M] [--agent A] [--key-id ID] [--limit N]\n"
    "  jobs show ID\n"
    "  status\n"
    "\n"
    "D is a duration: 30d, 12h, 15m, 3600s. Server: --server, $GPUPOOL_SERVER, the\n"
    "config file's server or " DEFAULT_SERVER ". Key: --key, $GPUPOOL_ADMIN_KEY,\n"
    "--key-file, $GPUPOOL_ADMIN_KEY_FILE, the config file's key_file,\n"
    "$GPUPOOL_STATE_DIR/admin.key or " DEFAULT_KEY_FILE ". CA: --ca-file,\n"
    "$GPUPOOL_CA_FILE or the config file's ca_file. Config file: $GPUPOOL_CTL_CONFIG or\n"
    "~/.config/gpupool/ctl.conf (server = URL, key_file = F, ca_file = F, insecure = true).\n";

typedef struct ctl {
    ctl_conn conn;
    bool json;
    char *key_buf;        /* key read from a file (owned) */
    char *file_buf;       /* the config file's text; cfg_* point into it (owned) */
    const char *cfg_server, *cfg_key_file, *cfg_ca_file;
    bool cfg_insecure;
} ctl;

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

/* Options of one command: names it accepts (flags have no value). */
typedef struct opt_spec {
    const char *name;     /* "--rpm" */
    bool flag;
} opt_spec;

#define MAX_OPTS 8
#define MAX_POS 4

typedef struct parsed {
    const char *val[MAX_OPTS];   /* by index in the spec; NULL = absent; flags "1" */
    const char *pos[MAX_POS];
    int npos;
} parsed;

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "gpupoolctl: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see gpupoolctl --help)\n");
    return -1;
}

/* Parse argv[0..argc) against spec (nspec entries); at most maxpos
 * positionals. 0, or -1 after printing a usage error. */
static int parse_opts(int argc, char **argv, const opt_spec *spec, size_t nspec, int maxpos,
                      parsed *p)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || strcmp(a, "--") == 0) {
            if (p->npos >= maxpos || p->npos >= MAX_POS)
                return usage_error("unexpected argument '%s'", a);
            p->pos[p->npos++] = a;
            continue;
        }
        size_t k = 0;
        while (k < nspec && strcmp(spec[k].name, a) != 0)
            k++;
        if (k == nspec)
            return usage_error("unknown option '%s'", a);
        if (spec[k].flag) {
            p->val[k] = "1";
        } else {
            if (i + 1 >= argc)
                return usage_error("option '%s' needs a value", a);
            p->val[k] = argv[++i];
        }
    }
    return 0;
}

/* A count option (>= 0) into body under key. 0, or -1 after a usage error. */
static int put_count(json_t *body, const char *key, const char *opt, const char *v)
{
    if (!v)
        return 0;
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < 0) {
        fprintf(stderr, "gpupoolctl: invalid value '%s' for %s (a non-negative integer)\n", v,
                opt);
        return -1;
    }
    json_object_set_new(body, key, json_integer(n));
    return 0;
}

static int put_duration(json_t *body, const char *v)
{
    if (!v)
        return 0;
    int64_t sec = ctl_duration_parse(v);
    if (sec < 0) {
        fprintf(stderr, "gpupoolctl: invalid value '%s' for --expires-in "
                        "(a duration such as 30d, 12h, 15m, 3600s)\n", v);
        return -1;
    }
    json_object_set_new(body, "expires_in_sec", json_integer(sec));
    return 0;
}

/* Percent-encode s for a query value. New string, NULL on ENOMEM. */
static char *qenc(const char *s)
{
    char *e = curl_easy_escape(NULL, s, 0);
    char *out = e ? strdup(e) : NULL;
    curl_free(e);
    return out;
}

/* prefix + the percent-encoded id + suffix into path: the URL of one
 * item. 0, or -1 after a message (out of memory, or too long). */
static int id_path(char *path, size_t len, const char *prefix, const char *id,
                   const char *suffix)
{
    char *e = qenc(id);
    int n = e ? snprintf(path, len, "%s%s%s", prefix, e, suffix) : -1;
    free(e);
    if (n < 0 || (size_t)n >= len) {
        fprintf(stderr, "gpupoolctl: cannot build the URL for '%s'\n", id);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Calls and output                                                    */
/* ------------------------------------------------------------------ */

static void print_json(const json_t *v)
{
    /* ENSURE_ASCII: jansson escapes C0 controls but would write C1 ones
     * (U+0080..9F) raw; as \uXXXX no byte of a name reaches the terminal
     * as a control. */
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY |
                                JSON_ENSURE_ASCII);
    if (s) {
        puts(s);
        free(s);
    }
}

/* One call. Returns 0 with *out (new reference) on a 2xx, or 1 after
 * printing why not (server error with its message and code, or transport
 * failure naming the URL). */
static int call(ctl *c, const char *method, const char *path, const json_t *body, json_t **out)
{
    char err[CURL_ERROR_SIZE + 64];
    json_t *resp = NULL;
    int st = ctl_http_call(&c->conn, method, path, body, &resp, err, sizeof err);
    if (st < 0) {
        fprintf(stderr, "gpupoolctl: cannot reach the server at %s: %s\n", c->conn.server, err);
        return 1;
    }
    /* Every text path prints strings of this reply (names agents and
     * operators chose, error messages): escaped here once, for all of them.
     * --json prints the data itself, escaped by print_json. */
    if (resp && !c->json && ctl_fmt_sanitize_json(resp) < 0) {
        fprintf(stderr, "gpupoolctl: out of memory\n");
        json_decref(resp);
        return 1;
    }
    if (st >= 200 && st < 300) {
        *out = resp ? resp : json_object();
        return 0;
    }
    json_t *e = json_object_get(resp, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *code = json_string_value(json_object_get(e, "code"));
    if (c->json && resp)
        print_json(resp);
    if (msg)
        fprintf(stderr, "gpupoolctl: %s (%s, HTTP %d)\n", msg, code ? code : "ERROR", st);
    else
        fprintf(stderr, "gpupoolctl: %s %s: HTTP %d\n", method, path, st);
    if (st == 401)
        fprintf(stderr, "gpupoolctl: check the admin key (--key, $GPUPOOL_ADMIN_KEY, "
                        "--key-file, $GPUPOOL_STATE_DIR/admin.key)\n");
    json_decref(resp);
    return 1;
}

static int64_t jint(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

static const char *jstr(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static int print_table(ctl_table *t)
{
    char *s = t ? ctl_table_render(t) : NULL;
    if (!s) {
        fprintf(stderr, "gpupoolctl: out of memory\n");
        ctl_table_free(t);
        return 1;
    }
    fputs(s, stdout);
    free(s);
    ctl_table_free(t);
    return 0;
}

static const char *limit_str(int64_t v, char *buf, size_t len)
{
    if (v <= 0)
        return "-";
    snprintf(buf, len, "%lld", (long long)v);
    return buf;
}

static const char *key_state(const json_t *k, int64_t now)
{
    const char *s = jstr(k, "state"); /* the server's word, when it sends one */
    if (s)
        return strcmp(s, "used_up") == 0 ? "used up" : s;
    if (jint(k, "revoked_at"))
        return "revoked";
    int64_t exp = jint(k, "expires_at");
    if (exp && exp <= now)
        return "expired";
    if (jint(k, "max_uses") > 0 && jint(k, "uses") >= jint(k, "max_uses"))
        return "used up";
    return "active";
}

/* ------------------------------------------------------------------ */
/* keys / tokens                                                       */
/* ------------------------------------------------------------------ */

static int keys_table(const json_t *keys, bool tokens)
{
    static const char *const kh[] = {"ID", "ROLE", "NAME", "STATE", "RPM", "TOKENS/DAY",
                                     "CONCURRENT", "REQS TODAY", "LAST USED", "EXPIRES"};
    static const char *const th[] = {"ID", "NAME", "STATE", "USES", "CREATED", "EXPIRES"};
    ctl_table *t = tokens ? ctl_table_new(6, th) : ctl_table_new(10, kh);
    int64_t now = gp_now_wall_ms();
    size_t i;
    const json_t *k;
    json_array_foreach(keys, i, k)
    {
        if (!t)
            break;
        bool enr = jstr(k, "role") && strcmp(jstr(k, "role"), "enrollment") == 0;
        if (tokens && !enr)
            continue;
        const json_t *l = json_object_get(k, "limits");
        char a[32], b[32], c[32], d[32], u[48], e[48], lu[48];
        if (tokens) {
            int64_t max = jint(k, "max_uses");
            if (max > 0)
                snprintf(u, sizeof u, "%lld/%lld", (long long)jint(k, "uses"), (long long)max);
            else
                snprintf(u, sizeof u, "%lld/unlimited", (long long)jint(k, "uses"));
            const char *row[] = {jstr(k, "id"), jstr(k, "name"), key_state(k, now), u,
                                 ctl_fmt_ago(jint(k, "created_at"), now, lu, sizeof lu),
                                 jint(k, "expires_at") ? ctl_fmt_iso(jint(k, "expires_at"), e,
                                                                     sizeof e)
                                                       : "never"};
            ctl_table_add(t, row);
        } else {
            snprintf(d, sizeof d, "%lld",
                     (long long)jint(json_object_get(k, "usage_today"), "requests"));
            const char *row[] = {jstr(k, "id"), jstr(k, "role"), jstr(k, "name"),
                                 key_state(k, now), limit_str(jint(l, "rpm"), a, sizeof a),
                                 limit_str(jint(l, "tokens_per_day"), b, sizeof b),
                                 limit_str(jint(l, "max_concurrent"), c, sizeof c), d,
                                 ctl_fmt_ago(jint(k, "last_used_at"), now, lu, sizeof lu),
                                 jint(k, "expires_at") ? ctl_fmt_iso(jint(k, "expires_at"), e,
                                                                     sizeof e)
                                                       : "never"};
            ctl_table_add(t, row);
        }
    }
    return print_table(t);
}

static int keys_list(ctl *c, const char *role, bool tokens)
{
    char path[128] = "/admin/keys";
    char *r = role ? qenc(role) : NULL;
    if (r)
        snprintf(path, sizeof path, "/admin/keys?role=%s", r);
    free(r);
    json_t *out = NULL;
    int rc = call(c, "GET", path, NULL, &out);
    if (rc)
        return rc;
    if (c->json)
        print_json(out);
    else
        rc = keys_table(json_object_get(out, "keys"), tokens);
    json_decref(out);
    return rc;
}

/* keys create / tokens create: the raw key alone on stdout (scripts
 * capture it), the details on stderr. */
static int key_create(ctl *c, json_t *body)
{
    json_t *out = NULL;
    int rc = call(c, "POST", "/admin/keys", body, &out);
    if (rc)
        return rc;
    if (c->json) {
        print_json(out);
    } else {
        char e[48];
        printf("%s\n", jstr(out, "key") ? jstr(out, "key") : "");
        fprintf(stderr,
                "created %s key %s (name '%s', expires %s); store it now, it will not be "
                "shown again\n",
                jstr(out, "role") ? jstr(out, "role") : "?", jstr(out, "id") ? jstr(out, "id") : "?",
                jstr(out, "name") ? jstr(out, "name") : "",
                jint(out, "expires_at") ? ctl_fmt_iso(jint(out, "expires_at"), e, sizeof e)
                                        : "never");
    }
    /* Even with --json: the operator must see that auth just turned on. */
    const char *on = jstr(json_object_get(out, "auth_turned_on"), "message");
    if (on)
        fprintf(stderr, "gpupoolctl: NOTE: %s\n", on);
    json_decref(out);
    return 0;
}

static int key_revoke(ctl *c, const char *id)
{
    char path[256];
    if (id_path(path, sizeof path, "/admin/keys/", id, "") < 0)
        return 1;
    json_t *out = NULL;
    int rc = call(c, "DELETE", path, NULL, &out);
    if (rc)
        return rc;
    if (c->json)
        print_json(out);
    else
        printf("revoked %s\n", id);
    json_decref(out);
    return 0;
}

static int cmd_keys(ctl *c, int argc, char **argv, bool tokens)
{
    const char *what = tokens ? "tokens" : "keys";
    if (argc < 1)
        return usage_error("'%s' needs a subcommand", what), EXIT_USAGE;
    const char *sub = argv[0];
    static const opt_spec create_keys[] = {{"--role", false},           {"--name", false},
                                           {"--expires-in", false},     {"--rpm", false},
                                           {"--tokens-per-day", false}, {"--max-concurrent", false}};
    static const opt_spec create_tokens[] = {
        {"--name", false}, {"--max-uses", false}, {"--expires-in", false}};
    static const opt_spec limits[] = {
        {"--rpm", false}, {"--tokens-per-day", false}, {"--max-concurrent", false}};
    static const opt_spec list[] = {{"--role", false}};
    parsed p;
    if (strcmp(sub, "list") == 0) {
        if (parse_opts(argc - 1, argv + 1, list, tokens ? 0 : 1, 0, &p) < 0)
            return EXIT_USAGE;
        return keys_list(c, tokens ? "enrollment" : p.val[0], tokens);
    }
    if (strcmp(sub, "revoke") == 0) {
        if (parse_opts(argc - 1, argv + 1, NULL, 0, 1, &p) < 0)
            return EXIT_USAGE;
        if (p.npos != 1)
            return usage_error("'%s revoke' needs an ID", what), EXIT_USAGE;
        return key_revoke(c, p.pos[0]);
    }
    if (strcmp(sub, "create") == 0) {
        json_t *body = json_object();
        int rc = EXIT_USAGE;
        if (tokens) {
            if (parse_opts(argc - 1, argv + 1, create_tokens, 3, 0, &p) < 0)
                goto create_done;
            json_object_set_new(body, "role", json_string("enrollment"));
            if (p.val[0])
                json_object_set_new(body, "name", json_string(p.val[0]));
            if (put_count(body, "max_uses", "--max-uses", p.val[1]) < 0 ||
                put_duration(body, p.val[2]) < 0)
                goto create_done;
        } else {
            if (parse_opts(argc - 1, argv + 1, create_keys, 6, 0, &p) < 0)
                goto create_done;
            if (!p.val[0]) {
                usage_error("%s", "'keys create' needs --role");
                goto create_done;
            }
            json_object_set_new(body, "role", json_string(p.val[0]));
            if (p.val[1])
                json_object_set_new(body, "name", json_string(p.val[1]));
            if (put_duration(body, p.val[2]) < 0 ||
                put_count(body, "rpm", "--rpm", p.val[3]) < 0 ||
                put_count(body, "tokens_per_day", "--tokens-per-day", p.val[4]) < 0 ||
                put_count(body, "max_concurrent", "--max-concurrent", p.val[5]) < 0)
                goto create_done;
        }
        rc = key_create(c, body);
    create_done:
        json_decref(body);
        return rc;
    }
    if (!tokens && strcmp(sub, "limits") == 0) {
        if (parse_opts(argc - 1, argv + 1, limits, 3, 1, &p) < 0)
            return EXIT_USAGE;
        if (p.npos != 1)
            return usage_error("%s", "'keys limits' needs an ID"), EXIT_USAGE;
        if (!p.val[0] && !p.val[1] && !p.val[2])
            return usage_error("%s", "'keys limits' needs --rpm, --tokens-per-day or "
                                     "--max-concurrent"),
                   EXIT_USAGE;
        json_t *body = json_object();
        if (put_count(body, "rpm", "--rpm", p.val[0]) < 0 ||
            put_count(body, "tokens_per_day", "--tokens-per-day", p.val[1]) < 0 ||
            put_count(body, "max_concurrent", "--max-concurrent", p.val[2]) < 0) {
            json_decref(body);
            return EXIT_USAGE;
        }
        char path[256];
        if (id_path(path, sizeof path, "/admin/keys/", p.pos[0], "") < 0) {
            json_decref(body);
            return 1;
        }
        json_t *out = NULL;
        int rc = call(c, "PATCH", path, body, &out);
        json_decref(body);
        if (rc)
            return rc;
        if (c->json) {
            print_json(out);
        } else {
            json_t *arr = json_array();
            json_array_append(arr, out);
            rc = keys_table(arr, false);
            json_decref(arr);
        }
        json_decref(out);
        return rc;
    }
    return usage_error("unknown subcommand '%s'", sub), EXIT_USAGE;
}

/* ------------------------------------------------------------------ */
/* agents                                                              */
/* ------------------------------------------------------------------ */

/* The `field` of each object of arr, comma-separated ("-" when none; a
 * list too long for out is cut at an element boundary). */
static void join_field(const json_t *arr, const char *field, char *out, size_t len)
{
    out[0] = '\0';
    size_t i, used = 0;
    const json_t *m;
    json_array_foreach(arr, i, m)
    {
        const char *v = jstr(m, field);
        int n = snprintf(out + used, len - used, "%s%s", i ? "," : "", v ? v : "?");
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
    if (!out[0])
        snprintf(out, len, "-");
}

static int agents_table(const json_t *agents)
{
    static const char *const h[] = {"ID", "NAME", "STATE", "SLOTS", "JOBS", "MODELS", "GPUS",
                                    "VERSION", "LAST SEEN"};
    ctl_table *t = ctl_table_new(9, h);
    int64_t now = gp_now_wall_ms();
    size_t i;
    const json_t *a;
    json_array_foreach(agents, i, a)
    {
        if (!t)
            break;
        char slots[32], jobs[16], models[256], gpus[256], seen[32];
        snprintf(slots, sizeof slots, "%lld/%lld", (long long)jint(a, "slots_busy"),
                 (long long)jint(a, "slots_total"));
        snprintf(jobs, sizeof jobs, "%lld", (long long)jint(a, "jobs_running"));
        join_field(json_object_get(a, "models"), "id", models, sizeof models);
        /* Models a pin refused: listed, marked, so that the operator sees why
         * the agent gets no work for them (--json has the reason). */
        size_t k;
        const json_t *rf;
        json_array_foreach(json_object_get(a, "refused_models"), k, rf)
        {
            size_t used = strcmp(models, "-") == 0 ? 0 : strlen(models);
            snprintf(models + used, sizeof models - used, "%s%s(REFUSED)", used ? "," : "",
                     jstr(rf, "model"));
        }
        /* An agent error (a model it refused to run): in place of the
         * models it would serve; --json has the message with the numbers. */
        const char *ecode = json_string_value(json_object_get(json_object_get(a, "error"),
                                                              "code"));
        if (ecode) {
            size_t used = strcmp(models, "-") == 0 ? 0 : strlen(models);
            snprintf(models + used, sizeof models - used, "%sERROR:%s", used ? "," : "", ecode);
        }
        join_field(json_object_get(a, "gpus"), "name", gpus, sizeof gpus);
        const char *row[] = {jstr(a, "id"), jstr(a, "name"), jstr(a, "state"), slots, jobs,
                             models, gpus, jstr(a, "version"),
                             ctl_fmt_ago(jint(a, "last_seen"), now, seen, sizeof seen)};
        ctl_table_add(t, row);
    }
    return print_table(t);
}

/* An agent named on the command line: its full id, its name, or a prefix
 * of its id that only it has. The id goes to out; 0, or 1 after a message
 * (no such agent, or several match: they are listed). */
static int resolve_agent(ctl *c, const char *arg, char *out, size_t outlen)
{
    json_t *list = NULL;
    int rc = call(c, "GET", "/admin/agents", NULL, &list);
    if (rc)
        return rc;
    const json_t *agents = json_object_get(list, "agents");
    const char *by_name = NULL, *by_prefix = NULL;
    int n_name = 0, n_prefix = 0;
    size_t al = strlen(arg), i;
    json_t *a;
    json_array_foreach(agents, i, a) {
        const char *id = jstr(a, "id"), *name = jstr(a, "name");
        if (!id)
            continue;
        if (strcmp(id, arg) == 0) {
            snprintf(out, outlen, "%s", id);
            json_decref(list);
            return 0;
        }
        if (name && strcmp(name, arg) == 0) {
            by_name = id;
            n_name++;
        }
        if (strncmp(id, arg, al) == 0) {
            by_prefix = id;
            n_prefix++;
        }
    }
    const char *pick = n_name == 1 ? by_name : n_name == 0 && n_prefix == 1 ? by_prefix : NULL;
    if (pick) {
        snprintf(out, outlen, "%s", pick);
        json_decref(list);
        return 0;
    }
    if (n_name + n_prefix == 0) {
        fprintf(stderr, "gpupoolctl: no agent has the id, name or id prefix '%s' "
                        "(gpupoolctl agents list)\n", arg);
    } else {
        fprintf(stderr, "gpupoolctl: '%s' names several agents; give the id:\n", arg);
        json_array_foreach(agents, i, a) {
            const char *id = jstr(a, "id"), *name = jstr(a, "name");
            if (id && ((n_name && name && strcmp(name, arg) == 0) ||
                       (!n_name && strncmp(id, arg, al) == 0)))
                fprintf(stderr, "  %s  %s\n", id, name ? name : "");
        }
    }
    json_decref(list);
    return 1;
}

static int cmd_agents(ctl *c, int argc, char **argv)
{
    if (argc < 1)
        return usage_error("%s", "'agents' needs a subcommand"), EXIT_USAGE;
    const char *sub = argv[0];
    static const opt_spec drain[] = {{"--undo", true}};
    static const opt_spec rm[] = {{"--force", true}};
    parsed p;
    json_t *out = NULL;
    int rc;
    if (strcmp(sub, "list") == 0) {
        if (parse_opts(argc - 1, argv + 1, NULL, 0, 0, &p) < 0)
            return EXIT_USAGE;
        if ((rc = call(c, "GET", "/admin/agents", NULL, &out)))
            return rc;
        if (c->json)
            print_json(out);
        else
            rc = agents_table(json_object_get(out, "agents"));
        json_decref(out);
        return rc;
    }
    bool is_drain = strcmp(sub, "drain") == 0, is_rm = strcmp(sub, "remove") == 0;
    if (!is_drain && !is_rm)
        return usage_error("unknown subcommand '%s'", sub), EXIT_USAGE;
    if (parse_opts(argc - 1, argv + 1, is_drain ? drain : rm, 1, 1, &p) < 0)
        return EXIT_USAGE;
    if (p.npos != 1)
        return usage_error("'agents %s' needs an ID", sub), EXIT_USAGE;
    char path[256], id[128];
    json_t *body = NULL;
    if ((rc = resolve_agent(c, p.pos[0], id, sizeof id)))
        return rc;
    if (id_path(path, sizeof path, "/admin/agents/", id,
                is_drain ? "/drain" : p.val[0] ? "?force=1" : "") < 0)
        return 1;
    if (is_drain) {
        body = json_pack("{s:b}", "on", !p.val[0]);
        rc = call(c, "POST", path, body, &out);
    } else {
        rc = call(c, "DELETE", path, NULL, &out);
    }
    json_decref(body);
    if (rc)
        return rc;
    if (c->json)
        print_json(out);
    else if (is_drain)
        printf("agent %s: %s (%s)\n", id, p.val[0] ? "undrained" : "draining",
               jstr(out, "state") ? jstr(out, "state") : "?");
    else
        printf("removed agent %s\n", id);
    json_decref(out);
    return 0;
}

/* ------------------------------------------------------------------ */
/* models                                                              */
/* ------------------------------------------------------------------ */

/* "12.3 MiB" */
static char *fmt_bytes(int64_t b, char *out, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", v, u[i]);
    return out;
}

/* A replica's progress cell: "45% of 4.1 GiB, 12.0 MiB/s, ETA 3m20s". */
static char *fmt_progress(const json_t *r, char *out, size_t n)
{
    int64_t have = jint(r, "bytes"), total = jint(r, "total"), rate = jint(r, "rate");
    const char *st = jstr(r, "state");
    char a[32], b[32];
    if (st && strcmp(st, "downloading") != 0) {
        snprintf(out, n, "%s", total > 0 ? fmt_bytes(total, a, sizeof a) : "-");
        return out;
    }
    if (total > 0)
        snprintf(out, n, "%d%% of %s", (int)(have * 100 / total), fmt_bytes(total, a, sizeof a));
    else
        snprintf(out, n, "%s", fmt_bytes(have, a, sizeof a));
    size_t l = strlen(out);
    if (rate > 0 && l < n)
        snprintf(out + l, n - l, ", %s/s", fmt_bytes(rate, b, sizeof b));
    l = strlen(out);
    const json_t *eta = json_object_get(r, "eta_sec");
    if (json_is_integer(eta) && l < n)
        snprintf(out + l, n - l, ", ETA %llds", (long long)json_integer_value(eta));
    return out;
}

/* Rows for one deployment: one per replica (a deployment with none: one
 * row that says how many are unplaced). */
static void deployment_rows(ctl_table *t, const json_t *d)
{
    char want[48], prog[96];
    snprintf(want, sizeof want, "%lld/%lld", (long long)jint(d, "ready"),
             (long long)jint(d, "replicas"));
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(d, "placed"), i, r)
    {
        const char *agent = jstr(r, "agent") ? jstr(r, "agent") : jstr(r, "agent_id");
        const char *row[] = {i == 0 ? jstr(d, "name") : "", i == 0 ? want : "", agent,
                             jstr(r, "state"), fmt_progress(r, prog, sizeof prog),
                             jstr(r, "reason") ? jstr(r, "reason") : ""};
        ctl_table_add(t, row);
    }
    if (jint(d, "unplaced") > 0) {
        char un[64];
        snprintf(un, sizeof un, "%lld unplaced", (long long)jint(d, "unplaced"));
        const char *row[] = {i == 0 ? jstr(d, "name") : "", i == 0 ? want : "", "-", un, "",
                             json_object_get(d, "refusals") ? "fits no agent: models show NAME"
                                                            : ""};
        ctl_table_add(t, row);
    }
}

static int deploy_list(ctl *c)
{
    json_t *out = NULL;
    int rc = call(c, "GET", "/admin/deployments", NULL, &out);
    if (rc)
        return rc;
    if (c->json) {
        print_json(out);
        json_decref(out);
        return 0;
    }
    static const char *const h[] = {"NAME", "READY", "AGENT", "STATE", "PROGRESS", "REASON"};
    ctl_table *t = ctl_table_new(6, h);
    size_t i;
    const json_t *d;
    json_array_foreach(json_object_get(out, "deployments"), i, d)
    {
        if (t)
            deployment_rows(t, d);
    }
    json_array_foreach(json_object_get(out, "local"), i, d)
    {
        const char *row[] = {jstr(d, "model"), "local", jstr(d, "agent") ? jstr(d, "agent")
                             : jstr(d, "agent_id"), jstr(d, "agent_state"), "", ""};
        if (t)
            ctl_table_add(t, row);
    }
    rc = print_table(t);
    json_decref(out);
    return rc;
}

static int deploy_show(ctl *c, const char *name)
{
    char path[1024];
    json_t *out = NULL;
    if (id_path(path, sizeof path, "/admin/deployments/", name, "") < 0)
        return 1;
    int rc = call(c, "GET", path, NULL, &out);
    if (rc)
        return rc;
    if (c->json) {
        print_json(out);
        json_decref(out);
        return 0;
    }
    char sz[32], labels[512] = "";
    const char *k;
    const json_t *v;
    json_object_foreach(json_object_get(out, "labels"), k, v)
    {
        size_t l = strlen(labels);
        snprintf(labels + l, sizeof labels - l, "%s%s=%s", l ? "," : "", k,
                 json_string_value(v));
    }
    printf("name:     %s\nsource:   %s\nsha256:   %s\nsize:     %s\nlabels:   %s\n"
           "replicas: %lld wanted, %lld ready, %lld unplaced\n\n", jstr(out, "name"),
           jstr(out, "source"), jstr(out, "sha256") ? jstr(out, "sha256") : "-",
           jint(out, "bytes") > 0 ? fmt_bytes(jint(out, "bytes"), sz, sizeof sz) : "unknown",
           labels[0] ? labels : "-", (long long)jint(out, "replicas"),
           (long long)jint(out, "ready"), (long long)jint(out, "unplaced"));
    static const char *const h[] = {"NAME", "READY", "AGENT", "STATE", "PROGRESS", "REASON"};
    ctl_table *t = ctl_table_new(6, h);
    if (t)
        deployment_rows(t, out);
    rc = print_table(t);
    size_t i;
    const json_t *ref = json_object_get(out, "refusals");
    if (json_is_array(ref) && json_array_size(ref) == 0)
        printf("\nno agent offers itself to deployments (agents started without --model "
               "and --upstream do)\n");
    json_array_foreach(ref, i, v)
    {
        if (i == 0)
            printf("\nagents considered and refused:\n");
        printf("  %s: %s\n", jstr(v, "agent") && *jstr(v, "agent") ? jstr(v, "agent")
               : jstr(v, "agent_id"), jstr(v, "reason"));
    }
    json_decref(out);
    return rc;
}

/* --labels k=v,k2=v2 -> {"k":"v","k2":"v2"}. 0, or -1 after a usage error. */
static int put_labels(json_t *body, const char *v)
{
    if (!v)
        return 0;
    json_t *l = json_object();
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv || !eq[1]) {
            json_decref(l);
            return usage_error("--labels: '%s' is not k=v", kv);
        }
        *eq = '\0';
        json_object_set_new(l, kv, json_string(eq + 1));
    }
    json_object_set_new(body, "labels", l);
    return 0;
}

/* Without --bytes, ask an http(s) source for its size (HEAD) so that the
 * server checks the fit before any agent downloads. hf: specs resolve on
 * the agents (their --hf-endpoint): the first download tells the server. */
static void put_source_size(ctl *c, json_t *body, const char *source, const char *given)
{
    if (given || (strncmp(source, "http://", 7) != 0 && strncmp(source, "https://", 8) != 0))
        return;
    char err[256];
    long long n = ctl_http_content_length(source, c->conn.ca_file, err, sizeof err);
    if (n > 0)
        json_object_set_new(body, "bytes", json_integer(n));
    else
        fprintf(stderr, "gpupoolctl: the size of %s is unknown (%s); the first download "
                        "will tell the server\n", source, err);
}

static int cmd_deploy(ctl *c, const char *sub, int argc, char **argv)
{
    static const opt_spec spec[] = {{"--name", false}, {"--replicas", false},
                                    {"--labels", false}, {"--sha256", false},
                                    {"--bytes", false}};
    bool deploy = strcmp(sub, "deploy") == 0, scale = strcmp(sub, "scale") == 0;
    parsed p;
    if (parse_opts(argc, argv, spec, deploy ? 5 : scale ? 2 : 0, 1, &p) < 0)
        return EXIT_USAGE;
    if (strcmp(sub, "list") == 0)
        return deploy_list(c);
    if (p.npos != 1)
        return usage_error("'models %s' needs one argument (see --help)", sub), EXIT_USAGE;
    if (strcmp(sub, "show") == 0)
        return deploy_show(c, p.pos[0]);
    char path[1024];
    json_t *out = NULL, *body = json_object();
    int rc = EXIT_USAGE;
    if (deploy && !p.val[0]) {
        usage_error("%s", "'models deploy' needs --name (the model name clients use)");
        goto done;
    }
    if (scale && !p.val[1]) {
        usage_error("%s", "'models scale' needs --replicas");
        goto done;
    }
    if (put_count(body, "replicas", "--replicas", p.val[1]) < 0 || put_labels(body, p.val[2]) < 0
        || put_count(body, "bytes", "--bytes", p.val[4]) < 0)
        goto done;
    if (deploy) {
        json_object_set_new(body, "name", json_string(p.val[0]));
        json_object_set_new(body, "source", json_string(p.pos[0]));
        if (p.val[3])
            json_object_set_new(body, "sha256", json_string(p.val[3]));
        put_source_size(c, body, p.pos[0], p.val[4]);
    }
    rc = 1;
    if (id_path(path, sizeof path, "/admin/deployments/", p.pos[0], "") < 0)
        goto done;
    if (deploy)
        rc = call(c, "POST", "/admin/deployments", body, &out);
    else if (scale)
        rc = call(c, "PATCH", path, body, &out);
    else
        rc = call(c, "DELETE", path, NULL, &out);
    if (rc)
        goto done;
    if (c->json)
        print_json(out);
    else if (!deploy && !scale)
        printf("undeployed %s (its agents unload it)\n", p.pos[0]);
    else
        printf("%s %s: %lld replica(s) wanted, %lld placed%s\n", deploy ? "deployed" : "scaled",
               jstr(out, "name"), (long long)jint(out, "replicas"),
               (long long)json_array_size(json_object_get(out, "placed")),
               jint(out, "unplaced") > 0 ? " (see gpupoolctl models show: not all fit)" : "");
done:
    json_decref(body);
    json_decref(out);
    return rc;
}

static int cmd_models(ctl *c, int argc, char **argv)
{
    if (argc < 1)
        return usage_error("%s", "'models' needs a subcommand"), EXIT_USAGE;
    const char *sub = argv[0];
    static const char *const deploy_subs[] = {"deploy", "undeploy", "scale", "list", "show"};
    for (size_t k = 0; k < sizeof deploy_subs / sizeof deploy_subs[0]; k++)
        if (strcmp(sub, deploy_subs[k]) == 0)
            return cmd_deploy(c, sub, argc - 1, argv + 1);
    parsed p;
    json_t *out = NULL, *body = NULL;
    int rc;
    bool list = strcmp(sub, "pins") == 0, pin = strcmp(sub, "pin") == 0,
         unpin = strcmp(sub, "unpin") == 0;
    if (!list && !pin && !unpin)
        return usage_error("unknown subcommand '%s'", sub), EXIT_USAGE;
    if (parse_opts(argc - 1, argv + 1, NULL, 0, pin ? 2 : unpin ? 1 : 0, &p) < 0)
        return EXIT_USAGE;
    if ((pin && p.npos != 2) || (unpin && p.npos != 1))
        return usage_error("%s", pin ? "'models pin' needs NAME and SHA256"
                                     : "'models unpin' needs NAME"),
               EXIT_USAGE;
    if (list) {
        if ((rc = call(c, "GET", "/admin/models/pins", NULL, &out)))
            return rc;
        if (c->json) {
            print_json(out);
        } else {
            static const char *const h[] = {"NAME", "SHA256", "PINNED", "BY"};
            ctl_table *t = ctl_table_new(4, h);
            int64_t now = gp_now_wall_ms();
            size_t i;
            const json_t *x;
            json_array_foreach(json_object_get(out, "pins"), i, x)
            {
                char ago[32];
                const char *row[] = {jstr(x, "name"), jstr(x, "sha256"),
                                     ctl_fmt_ago(jint(x, "created_at"), now, ago, sizeof ago),
                                     jstr(x, "created_by")};
                if (t)
                    ctl_table_add(t, row);
            }
            rc = print_table(t);
        }
        json_decref(out);
        return rc;
    }
    char path[1024];
    if (pin) {
        body = json_pack("{s:s,s:s}", "name", p.pos[0], "sha256", p.pos[1]);
        rc = call(c, "POST", "/admin/models/pins", body, &out);
        json_decref(body);
    } else {
        if (id_path(path, sizeof path, "/admin/models/pins?name=", p.pos[0], "") < 0)
            return 1;
        rc = call(c, "DELETE", path, NULL, &out);
    }
    if (rc)
        return rc;
    if (c->json)
        print_json(out);
    else if (pin)
        printf("pinned %s to sha256 %s\n", jstr(out, "name"), jstr(out, "sha256"));
    else
        printf("unpinned %s\n", p.pos[0]);
    json_decref(out);
    return 0;
}

/* ------------------------------------------------------------------ */
/* jobs                                                                */
/* ------------------------------------------------------------------ */

static const char *num_or_dash(const json_t *o, const char *k, char *buf, size_t len)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_integer(v))
        return "-";
    snprintf(buf, len, "%lld", (long long)json_integer_value(v));
    return buf;
}

static int jobs_table(const json_t *jobs)
{
    static const char *const h[] = {"ID", "STATUS", "MODEL", "AGENT", "KEY", "TOKENS",
                                    "TOTAL MS", "CREATED", "ERROR"};
    ctl_table *t = ctl_table_new(9, h);
    int64_t now = gp_now_wall_ms();
    size_t i;
    const json_t *j;
    json_array_foreach(jobs, i, j)
    {
        if (!t)
            break;
        char tok[48], p[24], cpl[24], total[24], created[32];
        snprintf(tok, sizeof tok, "%s/%s", num_or_dash(j, "prompt_tokens", p, sizeof p),
                 num_or_dash(j, "completion_tokens", cpl, sizeof cpl));
        const char *row[] = {jstr(j, "id"), jstr(j, "status"), jstr(j, "model"),
                             jstr(j, "agent_id"), jstr(j, "key_id"), tok,
                             num_or_dash(j, "total_ms", total, sizeof total),
                             ctl_fmt_ago(jint(j, "created_at"), now, created, sizeof created),
                             jstr(j, "error_code")};
        ctl_table_add(t, row);
    }
    return print_table(t);
}

/* "key: value" lines of an object, in the server's order. */
static void print_fields(const json_t *o)
{
    const char *k;
    const json_t *v;
    size_t w = 0;
    json_object_foreach((json_t *)o, k, v) if (strlen(k) > w) w = strlen(k);
    int64_t now = gp_now_wall_ms();
    json_object_foreach((json_t *)o, k, v)
    {
        char buf[64], ago[32];
        const char *k_end = k + strlen(k);
        bool is_time = (strlen(k) > 3 && strcmp(k_end - 3, "_at") == 0) ||
                       strcmp(k, "last_seen") == 0;
        if (is_time && json_is_integer(v)) {
            printf("%-*s  %s (%s)\n", (int)w, k,
                   ctl_fmt_iso((int64_t)json_integer_value(v), buf, sizeof buf),
                   ctl_fmt_ago((int64_t)json_integer_value(v), now, ago, sizeof ago));
        } else if (json_is_string(v)) {
            printf("%-*s  %s\n", (int)w, k, json_string_value(v));
        } else {
            char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            printf("%-*s  %s\n", (int)w, k, s ? s : "?");
            free(s);
        }
    }
}

static int cmd_jobs(ctl *c, int argc, char **argv)
{
    if (argc < 1)
        return usage_error("%s", "'jobs' needs a subcommand"), EXIT_USAGE;
    const char *sub = argv[0];
    static const opt_spec list[] = {{"--status", false}, {"--model", false}, {"--agent", false},
                                    {"--key-id", false}, {"--limit", false}};
    static const char *const qnames[] = {"status", "model", "agent", "key", "limit"};
    parsed p;
    json_t *out = NULL;
    int rc;
    if (strcmp(sub, "list") == 0) {
        if (parse_opts(argc - 1, argv + 1, list, 5, 0, &p) < 0)
            return EXIT_USAGE;
        gp_buf path;
        gp_buf_init(&path);
        gp_buf_appendf(&path, "/admin/jobs");
        char sep = '?';
        for (size_t i = 0; i < 5; i++) {
            if (!p.val[i])
                continue;
            char *e = qenc(p.val[i]);
            gp_buf_appendf(&path, "%c%s=%s", sep, qnames[i], e ? e : "");
            free(e);
            sep = '&';
        }
        rc = path.data ? call(c, "GET", path.data, NULL, &out) : 1;
        gp_buf_free(&path);
        if (rc)
            return rc;
        if (c->json)
            print_json(out);
        else
            rc = jobs_table(json_object_get(out, "jobs"));
        json_decref(out);
        return rc;
    }
    if (strcmp(sub, "show") == 0) {
        if (parse_opts(argc - 1, argv + 1, NULL, 0, 1, &p) < 0)
            return EXIT_USAGE;
        if (p.npos != 1)
            return usage_error("%s", "'jobs show' needs an ID"), EXIT_USAGE;
        char path[256];
        if (id_path(path, sizeof path, "/admin/jobs/", p.pos[0], "") < 0)
            return 1;
        if ((rc = call(c, "GET", path, NULL, &out)))
            return rc;
        if (c->json)
            print_json(out);
        else
            print_fields(out);
        json_decref(out);
        return 0;
    }
    return usage_error("unknown subcommand '%s'", sub), EXIT_USAGE;
}

/* ------------------------------------------------------------------ */
/* status                                                              */
/* ------------------------------------------------------------------ */

static int cmd_status(ctl *c, int argc, char **argv)
{
    parsed p;
    if (parse_opts(argc, argv, NULL, 0, 0, &p) < 0)
        return EXIT_USAGE;
    json_t *out = NULL;
    int rc = call(c, "GET", "/admin/status", NULL, &out);
    if (rc)
        return rc;
    if (c->json) {
        print_json(out);
        json_decref(out);
        return 0;
    }
    const json_t *ag = json_object_get(out, "agents");
    const json_t *sl = json_object_get(out, "slots");
    const json_t *tp = json_object_get(out, "throughput");
    printf("version      %s (up %llds)\n", jstr(out, "version") ? jstr(out, "version") : "?",
           (long long)jint(out, "uptime_sec"));
    printf("auth         %s\n", json_is_true(json_object_get(out, "auth")) ? "on" : "off");
    printf("agents       %lld healthy, %lld draining, %lld suspect, %lld dead, %lld offline "
           "(%lld total)\n",
           (long long)jint(ag, "healthy"), (long long)jint(ag, "draining"),
           (long long)jint(ag, "suspect"), (long long)jint(ag, "dead"),
           (long long)jint(ag, "offline"), (long long)jint(ag, "total"));
    printf("slots        %lld busy of %lld\n", (long long)jint(sl, "busy"),
           (long long)jint(sl, "total"));
    printf("jobs active  %lld (%lld queued)\n", (long long)jint(out, "jobs_active"),
           (long long)jint(out, "queued_total"));
    printf("throughput   %.1f requests/min, %.1f tokens/s (last 60 s)\n",
           json_number_value(json_object_get(tp, "requests_per_min")),
           json_number_value(json_object_get(tp, "tokens_per_sec")));
    const json_t *q = json_object_get(out, "queue");
    if (json_object_size(q) > 0) {
        static const char *const h[] = {"MODEL", "QUEUED"};
        ctl_table *t = ctl_table_new(2, h);
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)q, k, v)
        {
            char n[24];
            snprintf(n, sizeof n, "%lld", (long long)json_integer_value(v));
            const char *row[] = {k, n};
            if (t)
                ctl_table_add(t, row);
        }
        printf("\n");
        rc = print_table(t);
    }
    json_decref(out);
    return rc;
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

/* The admin key from a file: its first line, trimmed. NULL when missing or
 * unreadable (not an error: the next source is tried, or none is sent). */
static char *key_from_file(const char *path)
{
    size_t len = 0;
    char *s = gp_read_file(path, &len, 4096);
    if (!s)
        return NULL;
    s[strcspn(s, "\r\n")] = '\0';
    char *p = s;
    while (*p == ' ' || *p == '\t')
        p++;
    memmove(s, p, strlen(p) + 1);
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    if (!*s) {
        free(s);
        return NULL;
    }
    return s;
}

/* The config file: $GPUPOOL_CTL_CONFIG, else $XDG_CONFIG_HOME/gpupool/ctl.conf
 * or ~/.config/gpupool/ctl.conf; "name = value" lines (server, key_file,
 * ca_file, insecure = true), # comments. A missing file is fine; a named
 * one missing, or an unknown name, is a usage error (-1). */
static int read_config(ctl *c)
{
    char path[4096];
    const char *named = getenv("GPUPOOL_CTL_CONFIG"), *xdg = getenv("XDG_CONFIG_HOME"),
               *home = getenv("HOME");
    if (named && *named)
        snprintf(path, sizeof path, "%s", named);
    else if (xdg && *xdg)
        snprintf(path, sizeof path, "%s/gpupool/ctl.conf", xdg);
    else if (home && *home)
        snprintf(path, sizeof path, "%s/.config/gpupool/ctl.conf", home);
    else
        return 0;
    size_t len = 0;
    c->file_buf = gp_read_file(path, &len, 65536);
    if (!c->file_buf) {
        if (named && *named) {
            fprintf(stderr, "gpupoolctl: cannot read %s ($GPUPOOL_CTL_CONFIG): %s\n", path,
                    strerror(errno));
            return -1;
        }
        return 0;
    }
    int lineno = 0;
    for (char *line = c->file_buf, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        line[strcspn(line, "#")] = '\0';
        char *eq = strchr(line, '=');
        char *name = line + strspn(line, " \t\r");
        if (!*name)
            continue;
        if (!eq) {
            fprintf(stderr, "gpupoolctl: %s:%d: expected name = value\n", path, lineno);
            return -1;
        }
        char *v = eq + 1;
        *eq = '\0';
        for (size_t nl = strlen(name); nl > 0 && strchr(" \t", name[nl - 1]); nl--)
            name[nl - 1] = '\0';
        v += strspn(v, " \t");
        size_t vl = strlen(v);
        while (vl > 0 && strchr(" \t\r", v[vl - 1]))
            v[--vl] = '\0';
        if (strcmp(name, "server") == 0)
            c->cfg_server = v;
        else if (strcmp(name, "key_file") == 0)
            c->cfg_key_file = v;
        else if (strcmp(name, "ca_file") == 0)
            c->cfg_ca_file = v;
        else if (strcmp(name, "insecure") == 0)
            c->cfg_insecure = strcmp(v, "true") == 0 || strcmp(v, "1") == 0;
        else {
            fprintf(stderr, "gpupoolctl: %s:%d: unknown setting '%s' (server, key_file, "
                            "ca_file, insecure)\n", path, lineno, name);
            return -1;
        }
    }
    return 0;
}

/* --key > $GPUPOOL_ADMIN_KEY > --key-file > $GPUPOOL_ADMIN_KEY_FILE >
 * key_file in the config file > $GPUPOOL_STATE_DIR/admin.key > the
 * default file. A key file named explicitly must be readable (-1). */
static int resolve_key(ctl *c, const char *flag, const char *file_flag)
{
    const char *env = getenv("GPUPOOL_ADMIN_KEY");
    if (flag || (env && *env)) {
        c->conn.key = flag ? flag : env;
        return 0;
    }
    const char *env_file = getenv("GPUPOOL_ADMIN_KEY_FILE");
    const char *named = file_flag                  ? file_flag
                        : (env_file && *env_file) ? env_file
                                                   : c->cfg_key_file;
    if (named) {
        c->conn.key = c->key_buf = key_from_file(named);
        if (!c->key_buf) {
            fprintf(stderr, "gpupoolctl: cannot read an admin key from %s\n", named);
            return -1;
        }
        return 0;
    }
    const char *dir = getenv("GPUPOOL_STATE_DIR");
    if (dir && *dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/admin.key", dir);
        c->key_buf = key_from_file(path);
    }
    if (!c->key_buf)
        c->key_buf = key_from_file(DEFAULT_KEY_FILE);
    c->conn.key = c->key_buf;
    return 0;
}

int main(int argc, char **argv)
{
    ctl c;
    memset(&c, 0, sizeof c);
    const char *server = NULL, *key = NULL, *key_file = NULL;
    /* Global options come out first, wherever they are; the rest is the
     * command and its own options. */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0, rc = EXIT_USAGE;
    if (!rest)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = strcmp(a, "--server") == 0    ? &server
                           : strcmp(a, "--key") == 0     ? &key
                           : strcmp(a, "--key-file") == 0 ? &key_file
                           : strcmp(a, "--ca-file") == 0 ? &c.conn.ca_file
                                                         : NULL;
        if (dst) {
            if (i + 1 >= argc) {
                usage_error("option '%s' needs a value", a);
                goto done;
            }
            *dst = argv[++i];
        } else if (strcmp(a, "--json") == 0) {
            c.json = true;
        } else if (strcmp(a, "--insecure") == 0) {
            c.conn.insecure = true;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage_text, stdout);
            rc = 0;
            goto done;
        } else {
            rest[nrest++] = argv[i];
        }
    }
    if (nrest == 0) {
        fputs(usage_text, stderr);
        goto done;
    }
    if (read_config(&c) < 0)
        goto done;
    const char *env_server = getenv("GPUPOOL_SERVER"), *env_ca = getenv("GPUPOOL_CA_FILE");
    c.conn.server = server                        ? server
                    : (env_server && *env_server) ? env_server
                    : c.cfg_server                ? c.cfg_server
                                                  : DEFAULT_SERVER;
    if (!c.conn.ca_file)
        c.conn.ca_file = (env_ca && *env_ca) ? env_ca : c.cfg_ca_file;
    if (c.cfg_insecure)
        c.conn.insecure = true;
    if (resolve_key(&c, key, key_file) < 0)
        goto done;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "gpupoolctl: cannot initialise libcurl\n");
        rc = 1;
        goto done;
    }
    const char *cmd = rest[0];
    if (strcmp(cmd, "keys") == 0)
        rc = cmd_keys(&c, nrest - 1, rest + 1, false);
    else if (strcmp(cmd, "tokens") == 0)
        rc = cmd_keys(&c, nrest - 1, rest + 1, true);
    else if (strcmp(cmd, "agents") == 0)
        rc = cmd_agents(&c, nrest - 1, rest + 1);
    else if (strcmp(cmd, "jobs") == 0)
        rc = cmd_jobs(&c, nrest - 1, rest + 1);
    else if (strcmp(cmd, "models") == 0)
        rc = cmd_models(&c, nrest - 1, rest + 1);
    else if (strcmp(cmd, "status") == 0)
        rc = cmd_status(&c, nrest - 1, rest + 1);
    else {
        usage_error("unknown command '%s'", cmd);
        rc = EXIT_USAGE;
    }
    curl_global_cleanup();
done:
    if (c.key_buf) {
        explicit_bzero(c.key_buf, strlen(c.key_buf));
        free(c.key_buf);
    }
    free(c.file_buf);
    free(rest);
    return rc;
}
