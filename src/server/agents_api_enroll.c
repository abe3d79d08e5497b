/*
 * agents_api_enroll.c: /agents/enroll (an enrollment token for an agent
 * key) and /agents/check (what a key may do), refused in the agents'
 * error shape.
 */
#include "server/agents_api_priv.h"

#include <stdio.h>
#include <string.h>

#include "common/gp_log.h"
#include "common/gp_util.h"
#include "server/fleet/agent_check.h"
#include "server/fleet/pins.h"
#include "server/fleet/deploy.h"
#include "server/http/held.h"
#include "server/metrics.h"
#include "server/upload_read.h"
#include "server/auth/auth.h"
#include "server/store/store.h"

/* ------------------------------------------------------------------ */
/* Enrollment                                                          */
/* ------------------------------------------------------------------ */

int gps_agents_enroll_parse(const json_t *body, const char **agent_id, const char **name,
                            const char **param, char *err, size_t errlen)
{
    *agent_id = NULL;
    *name = "";
    *param = NULL;
    if (!json_is_object(body)) {
        snprintf(err, errlen, "the body must be a JSON object");
        return -1;
    }
    const json_t *id = json_object_get(body, "agent_id");
    if (!json_is_string(id) || json_string_length(id) != 36 ||
        !gp_uuid_valid(json_string_value(id))) {
        *param = "agent_id";
        snprintf(err, errlen, "'agent_id' must be a UUID string (the id the agent keeps in "
                              "its state dir)");
        return -1;
    }
    const json_t *nm = json_object_get(body, "name");
    if (nm && !json_is_null(nm)) {
        const char *s = json_string_value(nm);
        size_t len = json_string_length(nm);
        *param = "name";
        if (!s) {
            snprintf(err, errlen, "'name' must be a string");
            return -1;
        }
        if (len > 256) {
            snprintf(err, errlen, "'name' must be at most 256 bytes");
            return -1;
        }
        if (len > 0 && !gps_agent_text_ok(s, len, 256)) {
            snprintf(err, errlen, "'name' must be printable text (no control characters)");
            return -1;
        }
        *param = NULL;
        *name = s;
    }
    *agent_id = json_string_value(id);
    return 0;
}

/* Stable code and message of a refused enrollment: the agent tells its
 * operator which (expired, revoked, used up, not an enrollment token). */
static const char *enroll_code(gps_auth_result res)
{
    switch (res) {
    case GPS_AUTH_MISSING: return "UNAUTHORIZED";
    case GPS_AUTH_REVOKED: return "KEY_REVOKED";
    case GPS_AUTH_EXPIRED: return "KEY_EXPIRED";
    case GPS_AUTH_WRONG_ROLE: return "WRONG_ROLE";
    case GPS_AUTH_EXHAUSTED: return "TOKEN_EXHAUSTED";
    default: return "INVALID_API_KEY";
    }
}

static const char *enroll_message(gps_auth_result res, const gps_auth_key *k)
{
    switch (res) {
    case GPS_AUTH_MISSING:
        return "missing enrollment token (Authorization: Bearer <token>)";
    case GPS_AUTH_REVOKED:
        return "this enrollment token was revoked";
    case GPS_AUTH_EXPIRED:
        return "this enrollment token has expired";
    case GPS_AUTH_WRONG_ROLE:
        /* Say which key was given: a client key here is a common mix-up. */
        switch (k ? k->role : GPS_KEY_ROLE_COUNT) {
        case GPS_KEY_CLIENT:
            return "this route needs an enrollment token; the key given is a client key";
        case GPS_KEY_ADMIN:
            return "this route needs an enrollment token; the key given is an admin key "
                   "(make a token with POST /admin/keys {\"role\":\"enrollment\"})";
        case GPS_KEY_AGENT:
            return "this route needs an enrollment token; the key given is an agent key "
                   "(an agent key is used as it is, without enrolling)";
        default:
            return "this route needs an enrollment token";
        }
    case GPS_AUTH_EXHAUSTED:
        return "this enrollment token is used up (no uses left)";
    default:
        return "unknown enrollment token";
    }
}

/* Refuse an enrollment: counted and logged like the auth hook's refusals
 * (never the token itself). */
static void enroll_refuse(gps_agents *g, gps_req *r, gps_auth_result res, const char *key_id,
                          const gps_auth_key *k)
{
    if (g->metrics) {
        char l[64];
        gps_metrics_label(l, sizeof l, "reason", gps_auth_result_name(res), (char *)NULL);
        gps_metrics_add(g->metrics, "auth_failures_total", l, 1);
    }
    gp_log_write(GP_LOG_WARN, "auth_failed", r->correlation_id,
                 json_pack("{s:s,s:s,s:s}", "reason", gps_auth_result_name(res), "key_id",
                           key_id ? key_id : "", "path", "/agents/enroll"),
                 "enrollment refused");
    gps_req_add_header(r, "x-should-retry", "false");
    gps_req_error(r, gps_auth_result_status(res), enroll_code(res), enroll_message(res, k),
                  NULL);
}

/* POST /agents/check: would this credential get an agent in? An agent asks
 * before a long model download, so that a bad key fails in a second, not
 * after hours. Public at the http layer (an enrollment token must get an
 * answer too); changes nothing: no binding, no use spent. 200 {"role":
 * "agent"|"enrollment"|null (auth off)} or the refusal enrollment gives. */
void agents_h_check(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    if (!g->auth || !gps_auth_enabled(g->auth)) {
        gps_http_send_json(r->req, 200, json_pack("{s:n}", "role"));
        return;
    }
    const char *cred = gps_req_header(r, "Authorization");
    const gps_auth_key *k = NULL;
    gps_auth_result res = gps_auth_check(g->auth, cred, GPS_KEY_AGENT, &k);
    if (res == GPS_AUTH_OK) {
        gps_http_send_json(r->req, 200, json_pack("{s:s}", "role", "agent"));
        return;
    }
    if (res == GPS_AUTH_WRONG_ROLE) {
        k = NULL;
        res = gps_auth_check(g->auth, cred, GPS_KEY_ENROLLMENT, &k);
        if (res == GPS_AUTH_OK && k && k->max_uses > 0 && k->uses >= k->max_uses)
            res = GPS_AUTH_EXHAUSTED;
        if (res == GPS_AUTH_OK) {
            gps_http_send_json(r->req, 200, json_pack("{s:s}", "role", "enrollment"));
            return;
        }
    }
    gps_req_add_header(r, "x-should-retry", "false");
    gps_req_error(r, gps_auth_result_status(res), enroll_code(res),
                  res == GPS_AUTH_WRONG_ROLE ? "this key is neither an agent key nor an "
                                               "enrollment token"
                                             : enroll_message(res, k),
                  NULL);
}

/* POST /agents/enroll: public route (the http layer does not check it);
 * the enrollment token is checked here so that each refusal gets its own
 * code. The credential is checked (once) before the body is read, then
 * spent by gps_auth_enroll_checked. */
void agents_h_enroll(gps_req *r, void *arg)
{
    gps_agents *g = arg;
    if (!g->auth || !gps_auth_enabled(g->auth)) {
        gps_req_error(r, 409, "ENROLLMENT_NOT_NEEDED",
                      "auth is off on this server; run the agent without a token", NULL);
        return;
    }
    const char *cred = gps_req_header(r, "Authorization");
    const gps_auth_key *k = NULL;
    gps_auth_result res = gps_auth_check(g->auth, cred, GPS_KEY_ENROLLMENT, &k);
    char token_id[GPS_AUTH_ID_LEN + 1];
    snprintf(token_id, sizeof token_id, "%s", k ? k->id : "");
    if (res != GPS_AUTH_OK) {
        enroll_refuse(g, r, res, token_id, k);
        return;
    }
    json_t *body = gps_req_json(r);
    if (!body)
        return;
    const char *agent_id, *name, *param;
    char err[160];
    if (gps_agents_enroll_parse(body, &agent_id, &name, &param, err, sizeof err) < 0) {
        json_decref(body);
        gps_req_error(r, 400, "INVALID_REQUEST", err, param);
        return;
    }
    /* An agent_id is its first key's for good: a new enrollment must not
     * adopt one (it would take over that agent's jobs and models). */
    if (gps_auth_agent_owner(g->auth, agent_id)) {
        gp_log_write(GP_LOG_WARN, "agent_id_taken", r->correlation_id,
                     json_pack("{s:s,s:s,s:s}", "agent_id", agent_id, "token_id", token_id,
                               "path", "/agents/enroll"),
                     "enrollment refused: the agent_id belongs to another key");
        json_decref(body);
        gps_req_add_header(r, "x-should-retry", "false");
        gps_req_error(r, 403, "AGENT_ID_TAKEN",
                      "this agent_id is already bound to an agent key; a new agent needs a "
                      "new agent_id (the old key must be revoked to free it)",
                      "agent_id");
        return;
    }
    char key[GPS_AUTH_KEY_LEN + 1], key_id[GPS_AUTH_ID_LEN + 1];
    /* k passed the check above; nothing ran since that could free it. */
    res = gps_auth_enroll_checked(g->auth, k, agent_id, name, key, key_id);
    if (res != GPS_AUTH_OK) {
        json_decref(body);
        enroll_refuse(g, r, res, token_id, k);
        return;
    }
    gp_log_write(GP_LOG_INFO, "agent_enrolled", r->correlation_id,
                 json_pack("{s:s,s:s,s:s,s:s}", "agent_id", agent_id, "name", name, "key_id",
                           key_id, "token_id", token_id),
                 "agent %s enrolled", agent_id);
    json_t *reply = json_pack("{s:s,s:s,s:s}", "agent_id", agent_id, "key_id", key_id,
                              "agent_key", key);
    json_decref(body);
    /* The raw key is shown this once: keep it out of any cache. */
    gps_req_add_header(r, "Cache-Control", "no-store");
    gps_http_send_json(r->req, 200, reply);
    explicit_bzero(key, sizeof key);
}
