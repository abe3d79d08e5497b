/* gp_prefix: prompt-prefix descriptors (see gp_prefix.h). */
#include "common/gp_prefix.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gp_util.h"

/* Hex of SHA-256(prev "\n" data) into out (the chain links full
 * 64-digit hashes; only the reported form is short). out may be prev.
 * Returns false when memory is short. */
static bool chain_link(const char *prev, const char *data, size_t len, char out[65])
{
    size_t pl = strlen(prev);
    char *buf = malloc(pl + 1 + len + 1);
    if (!buf)
        return false;
    memcpy(buf, prev, pl);
    buf[pl] = '\n';
    memcpy(buf + pl + 1, data, len);
    gp_sha256_hex(buf, pl + 1 + len, out);
    free(buf);
    return true;
}

static bool push(gp_prefix_chain *c, const char full[65], long *cap)
{
    if (c->units == *cap) {
        long nc = *cap ? 2 * *cap : 16;
        gp_prefix_hash *h = realloc(c->h, (size_t)nc * sizeof *h);
        if (!h)
            return false;
        c->h = h;
        *cap = nc;
    }
    memcpy(c->h[c->units], full, GP_PREFIX_HEX);
    c->h[c->units][GP_PREFIX_HEX] = '\0';
    c->units++;
    return true;
}

int gp_prefix_chain_of_job(const json_t *job, gp_prefix_chain *out)
{
    memset(out, 0, sizeof *out);
    const json_t *msgs = json_object_get(job, "messages");
    const char *prompt = json_string_value(json_object_get(job, "prompt"));
    bool chat = json_is_array(msgs);
    if (!chat && !prompt)
        return -1;
    snprintf(out->kind, sizeof out->kind, "%s", chat ? "messages" : "text");

    /* h_0 binds what the template writes before the first message. */
    const json_t *tools = json_object_get(job, "tools");
    const char *choice = json_string_value(json_object_get(job, "tool_choice"));
    char *tj = NULL;
    if (chat && json_is_array(tools) && json_array_size(tools) > 0 &&
        !(choice && strcmp(choice, "none") == 0))
        tj = json_dumps(tools, JSON_COMPACT | JSON_SORT_KEYS);
    char h[65];
    bool ok = chain_link("gpupool-prefix-v1", out->kind, strlen(out->kind), h) &&
              chain_link(h, tj ? tj : "null", strlen(tj ? tj : "null"), h);
    free(tj);
    /* A tenant's chain shares no hash with another tenant's, so neither
     * the server's routing nor an agent's advertised slots match across
     * tenants (the agent also compares the tag itself before reusing). */
    const char *tenant = json_string_value(json_object_get(job, "tenant"));
    if (ok && tenant && *tenant)
        ok = chain_link(h, tenant, strlen(tenant), h);
    if (!ok)
        goto fail;

    long cap = 0;
    if (chat) {
        size_t i;
        const json_t *m;
        json_array_foreach(msgs, i, m) {
            char *mj = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
            if (!mj)
                goto fail;
            ok = chain_link(h, mj, strlen(mj), h);
            free(mj);
            if (!ok || !push(out, h, &cap))
                goto fail;
        }
    } else {
        size_t len = strlen(prompt);
        for (size_t off = 0; off + GP_PREFIX_BLOCK <= len; off += GP_PREFIX_BLOCK) {
            if (!chain_link(h, prompt + off, GP_PREFIX_BLOCK, h) || !push(out, h, &cap))
                goto fail;
        }
    }
    return 0;
fail:
    gp_prefix_chain_free(out);
    return -1;
}

void gp_prefix_chain_free(gp_prefix_chain *c)
{
    if (!c)
        return;
    free(c->h);
    memset(c, 0, sizeof *c);
}

void gp_prefix_desc_of_chain(const gp_prefix_chain *c, gp_prefix_desc *out)
{
    memset(out, 0, sizeof *out);
    if (!c || c->units <= 0)
        return;
    snprintf(out->kind, sizeof out->kind, "%s", c->kind);
    out->units = c->units;
    /* 1, 2, 4, ... below units, then units: at most 63 + 1 for a long, and
     * GP_PREFIX_MAX_POINTS (40) covers 2^38 units. */
    for (long n = 1; n < c->units && out->n_pts < GP_PREFIX_MAX_POINTS - 1; n *= 2) {
        out->pts[out->n_pts].n = n;
        memcpy(out->pts[out->n_pts++].h, c->h[n - 1], sizeof(gp_prefix_hash));
    }
    out->pts[out->n_pts].n = c->units;
    memcpy(out->pts[out->n_pts++].h, c->h[c->units - 1], sizeof(gp_prefix_hash));
}

json_t *gp_prefix_desc_json(const gp_prefix_desc *d)
{
    json_t *pts = json_array();
    for (int i = 0; pts && i < d->n_pts; i++)
        json_array_append_new(pts, json_pack("{s:I,s:s}", "n", (json_int_t)d->pts[i].n, "h",
                                             d->pts[i].h));
    return json_pack("{s:s,s:I,s:o}", "kind", d->kind, "units", (json_int_t)d->units,
                     "points", pts);
}

static bool is_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int gp_prefix_desc_parse(const json_t *j, gp_prefix_desc *out)
{
    memset(out, 0, sizeof *out);
    const char *kind = json_string_value(json_object_get(j, "kind"));
    const json_t *units = json_object_get(j, "units");
    const json_t *pts = json_object_get(j, "points");
    if (!kind || (strcmp(kind, "messages") != 0 && strcmp(kind, "text") != 0 && *kind) ||
        !json_is_integer(units) || json_integer_value(units) < 0 || !json_is_array(pts) ||
        json_array_size(pts) > GP_PREFIX_MAX_POINTS)
        goto bad;
    long prev = 0;
    size_t i;
    const json_t *p;
    json_array_foreach(pts, i, p) {
        const json_t *n = json_object_get(p, "n");
        const char *h = json_string_value(json_object_get(p, "h"));
        if (!json_is_integer(n) || json_integer_value(n) <= prev ||
            json_integer_value(n) > json_integer_value(units) || !h || !is_hex(h, GP_PREFIX_HEX))
            goto bad;
        prev = (long)json_integer_value(n);
        out->pts[i].n = prev;
        memcpy(out->pts[i].h, h, sizeof(gp_prefix_hash));
    }
    snprintf(out->kind, sizeof out->kind, "%s", kind);
    out->units = (long)json_integer_value(units);
    out->n_pts = (int)json_array_size(pts);
    return 0;
bad:
    memset(out, 0, sizeof *out);
    return -1;
}

long gp_prefix_match(const gp_prefix_chain *req, const gp_prefix_desc *have)
{
    if (!req || !have || req->units <= 0 || strcmp(req->kind, have->kind) != 0)
        return 0;
    for (int i = have->n_pts - 1; i >= 0; i--) {
        long n = have->pts[i].n;
        if (n <= req->units && strcmp(req->h[n - 1], have->pts[i].h) == 0)
            return n;
    }
    return 0;
}
