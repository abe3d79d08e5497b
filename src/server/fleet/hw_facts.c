/* hw_facts: see hw_facts.h. */
#include "server/fleet/hw_facts.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "server/fleet/agent_check.h"

/* A number member within lo..hi, else dflt. */
static double num(const json_t *o, const char *k, double lo, double hi, double dflt)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_number(v))
        return dflt;
    double d = json_number_value(v);
    return isfinite(d) && d >= lo && d <= hi ? d : dflt;
}

/* Copy a printable string member into buf (truncated), "" when absent or
 * not printable. Truncation may cut a UTF-8 sequence: back off to a
 * character boundary. */
static void str(const json_t *o, const char *k, char *buf, size_t len)
{
    const json_t *v = json_object_get(o, k);
    buf[0] = '\0';
    if (!json_is_string(v) || !gps_agent_text_ok(json_string_value(v), json_string_length(v),
                                                 GPS_AGENT_MAX_MESSAGE))
        return;
    size_t n = json_string_length(v);
    if (n >= len) {
        n = len - 1;
        const unsigned char *s = (const unsigned char *)json_string_value(v);
        while (n > 0 && (s[n] & 0xc0) == 0x80)
            n--;
    }
    memcpy(buf, json_string_value(v), n);
    buf[n] = '\0';
}

#define BYTES_MAX 1125899906842624.0 /* 2^50, as agent_check bounds vram */

static void gpu_parse(const json_t *g, hw_gpu *out)
{
    memset(out, 0, sizeof *out);
    out->index = (int)num(g, "index", 0, 65536, -1);
    str(g, "name", out->name, sizeof out->name);
    out->vram_total = (long long)num(g, "vram_total", 0, BYTES_MAX, -1);
    out->vram_used = (long long)num(g, "vram_used", 0, BYTES_MAX, -1);
    out->vram_model = (long long)num(g, "vram_model", 0, BYTES_MAX, -1);
    out->vram_free = (long long)num(g, "vram_free", 0, BYTES_MAX, -1);
    if (out->vram_free < 0 && out->vram_total >= 0 && out->vram_used >= 0 &&
        out->vram_used <= out->vram_total)
        out->vram_free = out->vram_total - out->vram_used;
    out->utilization = num(g, "utilization", 0, 1, -1);
    out->temperature = num(g, "temperature", -273, 1000, -1000);
    out->power_w = num(g, "power_w", 0, 100000, -1);
    const char *st = json_string_value(json_object_get(g, "state"));
    out->fault = st && strcmp(st, "fault") == 0;
    out->in_use = st && (strcmp(st, "ok") == 0 || out->fault);
}

void hw_facts_parse(const json_t *body, hw_facts *out)
{
    memset(out, 0, sizeof *out);
    char be[16];
    str(body, "backend", be, sizeof be);
    /* A closed set: the value becomes a metrics label. */
    if (strcmp(be, "cuda") == 0 || strcmp(be, "cpu") == 0 || strcmp(be, "openai") == 0)
        snprintf(out->backend, sizeof out->backend, "%s", be);
    const json_t *err = json_object_get(body, "error");
    if (json_is_object(err)) {
        str(err, "code", out->error_code, sizeof out->error_code);
        str(err, "message", out->error_message, sizeof out->error_message);
        if (!out->error_code[0] && out->error_message[0])
            snprintf(out->error_code, sizeof out->error_code, "AGENT_ERROR");
    }
    out->faults = (long long)num(body, "backend_faults", 0, 1e15, -1);
    const json_t *gpus = json_object_get(body, "gpus");
    for (size_t i = 0; i < json_array_size(gpus) && out->n_gpus < HW_MAX_GPUS; i++) {
        const json_t *g = json_array_get(gpus, i);
        if (json_is_object(g))
            gpu_parse(g, &out->gpus[out->n_gpus++]);
    }
}

static json_t *ll_or_null(long long v)
{
    return v >= 0 ? json_integer(v) : json_null();
}

static json_t *real_or_null(double v, double unknown)
{
    return v != unknown ? json_real(v) : json_null();
}

json_t *hw_facts_gpus_json(const hw_facts *f)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < f->n_gpus; i++) {
        const hw_gpu *g = &f->gpus[i];
        json_t *o = json_pack("{s:i,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:s}", "index", g->index,
                              "name", g->name, "vram_total", ll_or_null(g->vram_total),
                              "vram_used", ll_or_null(g->vram_used), "vram_model",
                              ll_or_null(g->vram_model), "vram_free", ll_or_null(g->vram_free),
                              "utilization", real_or_null(g->utilization, -1), "temperature",
                              real_or_null(g->temperature, -1000), "power_w",
                              real_or_null(g->power_w, -1),
                              "state", g->fault ? "fault" : g->in_use ? "ok" : "unused");
        if (!o || json_array_append_new(arr, o) < 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

json_t *hw_facts_error_json(const hw_facts *f)
{
    if (!f->error_code[0])
        return json_null();
    return json_pack("{s:s,s:s}", "code", f->error_code, "message", f->error_message);
}
