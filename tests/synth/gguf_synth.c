/*
 * gguf-synth: regenerate a random-weight test model (GGUF) from its recipe,
 * and check it against the sha256 recorded there.
 *
 *   gguf-synth --data tests/data --out BUILD/tests/data/arch/x.gguf \
 *              tests/data/recipes/x.json
 *
 * The test models were first made with numpy + llama.cpp's gguf-py (and
 * llama-quantize for the Q8_0 ones); llama.cpp's reference outputs were
 * computed on those exact bytes. Storing them cost 65 MB of the checkout, so
 * each is now a small recipe: the metadata (literal values, or entries
 * copied unchanged from a tokenizer file under --data), and per tensor its
 * shape, type and how its values were drawn. Weights are
 * mean + std * numpy.random.default_rng(seed).standard_normal(n, float32),
 * drawn tensor after tensor in file order (np_random reproduces numpy's
 * numbers bit for bit), rounded to the stored type. A recipe with
 * "quantize" instead builds its base recipe and converts it the way
 * llama-quantize did (synth_quant: its reference quantizers, its tensor
 * order, its key order).
 *
 * Recipe (JSON):
 *   {"file": "arch/x.gguf", "bytes": N, "sha256": "hex",
 *    "seed": S, "sources": {"vocab": "vocab/ggml-vocab-gpt-2.gguf"},
 *    "kv": [[key, "string"|"u32"|"i32"|"u64"|"f32"|"bool", value] | [key, "copy", source]],
 *    "tensors": [tensor | {"layers": L, "tensors": [tensor...]}]}
 *   tensor: {"name", "ne": [ne0, ...], "type": "f16"|"f32", and one of
 *            "std" (+ "mean", default 0; "round": "f16" to pass the value
 *            through F16 before storing F32), "fill": v, "values": [...]}
 *   Inside "layers", names get the prefix "blk.N." for N = 0..L-1, layer
 *   after layer.
 *   Quantized: {"file", "bytes", "sha256", "quantize": {"from": "base.json",
 *     "type": "q4_k", "types": {"output.weight": "q6_k", ...}, "file_type": 15}}
 *   ("from" is relative to the recipe's directory; "type" is the default for
 *   F16 tensors of 2+ dims, "types" the exceptions llama-quantize's mix chose,
 *   "file_type" the general.file_type it wrote).
 *
 * Exit status 0 when the file was written and matches; 1 with a message
 * naming the recipe otherwise (a mismatching file is not left behind unless
 * --keep is given, for debugging a recipe).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "np_random.h"
#include "synth_gguf.h"
#include "synth_quant.h"

#define ERRLEN 8192
#define MAX_SOURCES 8

typedef struct synth_ctx {
    const char *data_dir;
    const char *recipe_path;
    char err[ERRLEN];
} synth_ctx;

typedef struct sources {
    const char *name[MAX_SOURCES];
    synth_src *src[MAX_SOURCES];
    int n;
} sources;

static void sources_close(sources *s)
{
    for (int i = 0; i < s->n; i++)
        synth_src_close(s->src[i]);
    s->n = 0;
}

static bool sources_open(synth_ctx *c, json_t *obj, sources *s)
{
    const char *name;
    json_t *v;
    if (!obj)
        return true;
    if (!json_is_object(obj)) {
        snprintf(c->err, ERRLEN, "\"sources\" must be an object of name: path");
        return false;
    }
    json_object_foreach(obj, name, v) {
        char path[4096];
        if (!json_is_string(v) || s->n == MAX_SOURCES) {
            snprintf(c->err, ERRLEN, "source '%s': a path string expected (at most %d sources)",
                     name, MAX_SOURCES);
            return false;
        }
        snprintf(path, sizeof path, "%s/%s", c->data_dir, json_string_value(v));
        if (!synth_src_open(path, &s->src[s->n], c->err, ERRLEN))
            return false;
        s->name[s->n++] = name;
    }
    return true;
}

/* ----------------------------------------------------------- metadata */

static bool kv_add_one(synth_ctx *c, synth_gguf *g, const sources *srcs, json_t *e)
{
    const char *key = json_string_value(json_array_get(e, 0));
    const char *type = json_string_value(json_array_get(e, 1));
    json_t *v = json_array_get(e, 2);
    if (!json_is_array(e) || json_array_size(e) != 3 || !key || !type) {
        snprintf(c->err, ERRLEN, "each \"kv\" entry must be [key, type, value]");
        return false;
    }
    if (strcmp(type, "copy") == 0) {
        for (int i = 0; i < srcs->n; i++)
            if (json_is_string(v) && strcmp(srcs->name[i], json_string_value(v)) == 0)
                return synth_gguf_copy_kv(g, srcs->src[i], key, c->err, ERRLEN);
        snprintf(c->err, ERRLEN, "key '%s': no source named in \"sources\"", key);
        return false;
    }
    if (strcmp(type, "string") == 0 && json_is_string(v))
        return synth_gguf_add_str(g, key, json_string_value(v), c->err, ERRLEN);
    if (strcmp(type, "bool") == 0 && json_is_boolean(v))
        return synth_gguf_add_bool(g, key, json_is_true(v), c->err, ERRLEN);
    if (strcmp(type, "f32") == 0 && json_is_number(v))
        return synth_gguf_add_f32(g, key, (float)json_number_value(v), c->err, ERRLEN);
    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        if (strcmp(type, "u32") == 0 && n >= 0 && n <= 0xffffffffll)
            return synth_gguf_add_u32(g, key, (uint32_t)n, c->err, ERRLEN);
        if (strcmp(type, "i32") == 0 && n >= INT32_MIN && n <= INT32_MAX)
            return synth_gguf_add_i32(g, key, (int32_t)n, c->err, ERRLEN);
        if (strcmp(type, "u64") == 0 && n >= 0)
            return synth_gguf_add_u64(g, key, (uint64_t)n, c->err, ERRLEN);
    }
    snprintf(c->err, ERRLEN, "key '%s': value does not fit type '%s'", key, type);
    return false;
}

/* All "kv" entries in order, leaving out skip (NULL: none). */
static bool kv_build(synth_ctx *c, synth_gguf *g, const sources *srcs, json_t *kv,
                     const char *skip)
{
    size_t i;
    json_t *e;
    if (!json_is_array(kv)) {
        snprintf(c->err, ERRLEN, "\"kv\" must be an array");
        return false;
    }
    json_array_foreach(kv, i, e) {
        const char *key = json_string_value(json_array_get(e, 0));
        if (skip && key && strcmp(key, skip) == 0)
            continue;
        if (!kv_add_one(c, g, srcs, e))
            return false;
    }
    return true;
}

/* ------------------------------------------------------------ tensors */

/* How one tensor's values are made. */
typedef struct tensor_rule {
    enum { RULE_NORMAL, RULE_FILL, RULE_VALUES } kind;
    float mean, std, fill;
    bool round_f16;
    json_t *values;   /* borrowed */
} tensor_rule;

static bool rule_parse(synth_ctx *c, const char *name, json_t *t, tensor_rule *r)
{
    memset(r, 0, sizeof *r);
    json_t *std = json_object_get(t, "std"), *fill = json_object_get(t, "fill");
    const char *round = json_string_value(json_object_get(t, "round"));
    r->values = json_object_get(t, "values");
    if (std && json_is_number(std)) {
        r->kind = RULE_NORMAL;
        r->std = (float)json_number_value(std);
        r->mean = (float)json_number_value(json_object_get(t, "mean"));
    } else if (fill && json_is_number(fill)) {
        r->kind = RULE_FILL;
        r->fill = (float)json_number_value(fill);
    } else if (json_is_array(r->values)) {
        r->kind = RULE_VALUES;
    } else {
        snprintf(c->err, ERRLEN, "tensor '%s': needs \"std\", \"fill\" or \"values\"", name);
        return false;
    }
    if (round && strcmp(round, "f16") != 0) {
        snprintf(c->err, ERRLEN, "tensor '%s': \"round\" can only be \"f16\"", name);
        return false;
    }
    r->round_f16 = round != NULL;
    return true;
}

static float rule_value(const tensor_rule *r, np_rng *rng, int64_t i)
{
    float v;
    if (r->kind == RULE_FILL)
        return r->fill;
    if (r->kind == RULE_VALUES)
        return (float)json_number_value(json_array_get(r->values, (size_t)i));
    /* numpy: np.float32(mean) + x * np.float32(std), in float32; with mean
     * 0 the product alone (adding +0 would turn -0 into +0). */
    v = np_rng_normal_f32(rng) * r->std;
    if (r->mean != 0.0f)
        v = r->mean + v;
    if (r->round_f16)
        v = synth_f16_to_f32(synth_f32_to_f16(v));
    return v;
}

static bool tensor_add(synth_ctx *c, synth_gguf *g, np_rng *rng, const char *name, json_t *t)
{
    json_t *ne = json_object_get(t, "ne");
    const char *type = json_string_value(json_object_get(t, "type"));
    int64_t dims[SYNTH_MAX_DIMS], n = 1;
    size_t nd = json_array_size(ne);
    tensor_rule r;
    if (nd < 1 || nd > SYNTH_MAX_DIMS || !type ||
        (strcmp(type, "f16") != 0 && strcmp(type, "f32") != 0)) {
        snprintf(c->err, ERRLEN, "tensor '%s': needs \"ne\" (1-4 dims) and \"type\" f16|f32", name);
        return false;
    }
    for (size_t d = 0; d < nd; d++) {
        json_t *x = json_array_get(ne, d);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > (1 << 24)) {
            snprintf(c->err, ERRLEN, "tensor '%s': bad dimension %zu", name, d);
            return false;
        }
        dims[d] = json_integer_value(x);
        n *= dims[d];
    }
    if (n > ((int64_t)1 << 28) || !rule_parse(c, name, t, &r))
        return false;
    if (r.kind == RULE_VALUES && (int64_t)json_array_size(r.values) != n) {
        snprintf(c->err, ERRLEN, "tensor '%s': %zu values for %lld elements", name,
                 json_array_size(r.values), (long long)n);
        return false;
    }
    bool f16 = strcmp(type, "f16") == 0;
    size_t nbytes = (size_t)n * (f16 ? 2 : 4);
    uint8_t *data = malloc(nbytes);
    if (!data) {
        snprintf(c->err, ERRLEN, "tensor '%s': out of memory", name);
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = rule_value(&r, rng, i);
        if (f16) {
            uint16_t h = synth_f32_to_f16(v);
            memcpy(data + 2 * i, &h, 2);
        } else {
            memcpy(data + 4 * i, &v, 4);
        }
    }
    return synth_gguf_add_tensor(g, name, (int)nd, dims, f16 ? SYNTH_T_F16 : SYNTH_T_F32, data,
                                 nbytes, c->err, ERRLEN);
}

static bool tensors_build(synth_ctx *c, synth_gguf *g, np_rng *rng, json_t *list)
{
    size_t i, j;
    json_t *t, *lt;
    if (!json_is_array(list)) {
        snprintf(c->err, ERRLEN, "\"tensors\" must be an array");
        return false;
    }
    json_array_foreach(list, i, t) {
        json_t *layers = json_object_get(t, "layers");
        if (!layers) {
            const char *name = json_string_value(json_object_get(t, "name"));
            if (!name) {
                snprintf(c->err, ERRLEN, "tensor %zu has no \"name\"", i);
                return false;
            }
            if (!tensor_add(c, g, rng, name, t))
                return false;
            continue;
        }
        json_int_t nl = json_integer_value(layers);
        json_t *tl = json_object_get(t, "tensors");
        if (!json_is_integer(layers) || nl < 1 || nl > 1024 || !json_is_array(tl)) {
            snprintf(c->err, ERRLEN, "\"layers\" needs a count 1-1024 and \"tensors\"");
            return false;
        }
        for (json_int_t l = 0; l < nl; l++)
            json_array_foreach(tl, j, lt) {
                const char *base = json_string_value(json_object_get(lt, "name"));
                char name[256];
                if (!base) {
                    snprintf(c->err, ERRLEN, "layer tensor %zu has no \"name\"", j);
                    return false;
                }
                snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, base);
                if (!tensor_add(c, g, rng, name, lt))
                    return false;
            }
    }
    return true;
}

/* Build the model a plain (unquantized) recipe describes. skip_key: a key
 * left out of the metadata (see quantized_build), or NULL. */
static bool plain_build(synth_ctx *c, json_t *rec, synth_gguf *g, const char *skip_key)
{
    sources srcs = {0};
    np_rng rng;
    bool ok = false;
    json_t *seed = json_object_get(rec, "seed");
    if (!json_is_integer(seed) || json_integer_value(seed) < 0 ||
        json_integer_value(seed) > 0xffffffffll) {
        snprintf(c->err, ERRLEN, "\"seed\" must be an integer 0..2^32-1");
        return false;
    }
    np_rng_seed(&rng, (uint32_t)json_integer_value(seed));
    if (!sources_open(c, json_object_get(rec, "sources"), &srcs))
        goto done;
    if (!kv_build(c, g, &srcs, json_object_get(rec, "kv"), skip_key))
        goto done;
    ok = tensors_build(c, g, &rng, json_object_get(rec, "tensors"));
done:
    sources_close(&srcs);
    return ok;
}

/* ------------------------------------------------------------ quantize */

static int layer_of(const char *name)
{
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1)
        l = -1;
    return l;
}

/* llama-quantize writes tensors sorted by layer (non-layer tensors first),
 * then by name. */
static int tensor_order(const void *a, const void *b)
{
    const synth_tensor *x = a, *y = b;
    int lx = layer_of(x->name), ly = layer_of(y->name);
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The type a tensor gets: its entry in "types", else the default. */
static bool tensor_qtype(synth_ctx *c, json_t *q, const char *name, synth_qtype *out)
{
    const char *t = json_string_value(json_object_get(json_object_get(q, "types"), name));
    if (!t)
        t = json_string_value(json_object_get(q, "type"));
    if (!t || !synth_qtype_parse(t, out)) {
        snprintf(c->err, ERRLEN, "tensor '%s': no known quantized type (q4_0, q8_0, q4_k, q5_k, q6_k)",
                 name);
        return false;
    }
    return true;
}

/* Quantize one F16 tensor t (its data in *data, *nbytes long) to the type
 * the recipe gives it: on success *data is replaced by the quantized bytes
 * (the F16 buffer freed) and *type set; on failure *data is left alone. */
static bool quantize_one(synth_ctx *c, json_t *q, const synth_tensor *t, void **data,
                         size_t *nbytes, uint32_t *type)
{
    synth_qtype qt;
    if (!tensor_qtype(c, q, t->name, &qt))
        return false;
    const int64_t n = (int64_t)(*nbytes / 2);
    const int qk = synth_qtype_block(qt);
    if (t->ne[0] % qk != 0) {
        snprintf(c->err, ERRLEN, "tensor '%s': rows of %lld are not whole blocks of %d", t->name,
                 (long long)t->ne[0], qk);
        return false;
    }
    const size_t qbytes = (size_t)(n / qk) * synth_qtype_block_bytes(qt);
    float *f = malloc((size_t)n * sizeof *f);
    uint8_t *out = malloc(qbytes);
    if (!f || !out) {
        snprintf(c->err, ERRLEN, "tensor '%s': out of memory", t->name);
        free(f);
        free(out);
        return false;
    }
    for (int64_t j = 0; j < n; j++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)*data + 2 * j, 2);
        f[j] = synth_f16_to_f32(h);   /* llama-quantize widens F16 to F32 first */
    }
    synth_quantize(qt, f, n, out);
    free(f);
    free(*data);
    *data = out;
    *nbytes = qbytes;
    *type = (uint32_t)qt;
    return true;
}

/* F16 tensors of two or more dimensions are quantized; the others stay as
 * they are. Takes the data out of base (left with NULL pointers). */
static bool quantize_tensors(synth_ctx *c, json_t *q, synth_gguf *base, synth_gguf *g)
{
    qsort(base->t, base->n_t, sizeof *base->t, tensor_order);
    for (size_t i = 0; i < base->n_t; i++) {
        synth_tensor *t = &base->t[i];
        void *data = t->data;
        size_t nbytes = t->nbytes;
        uint32_t type = t->type;
        t->data = NULL;
        if (t->type == SYNTH_T_F16 && t->n_dims >= 2 &&
            !quantize_one(c, q, t, &data, &nbytes, &type)) {
            free(data);
            return false;
        }
        /* add_tensor takes data, also when it fails */
        if (!synth_gguf_add_tensor(g, t->name, t->n_dims, t->ne, type, data, nbytes, c->err,
                                   ERRLEN))
            return false;
    }
    return true;
}

static json_t *recipe_load(synth_ctx *c, const char *path)
{
    json_error_t je;
    json_t *rec = json_load_file(path, 0, &je);
    if (!rec)
        snprintf(c->err, ERRLEN, "%s:%d: %s", path, je.line, je.text);
    else if (!json_is_object(rec)) {
        snprintf(c->err, ERRLEN, "%s: not a JSON object", path);
        json_decref(rec);
        rec = NULL;
    }
    return rec;
}

/* llama-quantize keeps every key of its input but re-sets
 * general.file_type after adding general.quantization_version, which moves
 * both to the end. */
static bool quantized_build(synth_ctx *c, json_t *q, synth_gguf *g)
{
    const char *from = json_string_value(json_object_get(q, "from"));
    json_t *ftype = json_object_get(q, "file_type");
    char path[4096];
    json_t *base_rec = NULL;
    synth_gguf base;
    bool ok = false;
    synth_gguf_init(&base);
    if (!from || !json_is_string(json_object_get(q, "type")) || !json_is_integer(ftype) ||
        json_integer_value(ftype) < 0 || json_integer_value(ftype) > 1000) {
        snprintf(c->err, ERRLEN, "\"quantize\" needs \"from\", \"type\" and \"file_type\"");
        goto done;
    }
    const char *slash = strrchr(c->recipe_path, '/');
    int dirlen = slash && from[0] != '/' ? (int)(slash - c->recipe_path + 1) : 0;
    snprintf(path, sizeof path, "%.*s%s", dirlen, c->recipe_path, from);
    if (!(base_rec = recipe_load(c, path)))
        goto done;
    if (!plain_build(c, base_rec, &base, "general.file_type"))
        goto done;
    /* The metadata, then the two keys llama-quantize sets. */
    synth_gguf_move_kv(g, &base);
    if (!synth_gguf_add_u32(g, "general.quantization_version", 2, c->err, ERRLEN) ||
        !synth_gguf_add_u32(g, "general.file_type", (uint32_t)json_integer_value(ftype), c->err,
                            ERRLEN))
        goto done;
    ok = quantize_tensors(c, q, &base, g);
done:
    json_decref(base_rec);
    synth_gguf_free(&base);
    return ok;
}

/* ---------------------------------------------------------- check, main */

static void sha256_hex(const uint8_t *p, size_t n, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    hex[0] = '\0';
    if (!EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
        return;
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

static bool write_file(synth_ctx *c, const char *out, const uint8_t *p, size_t n)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(c->err, ERRLEN, "cannot create %s: %s", tmp, strerror(errno));
        return false;
    }
    bool ok = fwrite(p, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, out) != 0) {
        snprintf(c->err, ERRLEN, "cannot write %s: %s", out, strerror(errno));
        remove(tmp);
        return false;
    }
    return true;
}

/* Build, compare with the recorded size and sha256, write. */
static bool synth_run(synth_ctx *c, const char *out, bool keep)
{
    json_t *rec = recipe_load(c, c->recipe_path);
    synth_gguf g;
    uint8_t *bytes = NULL;
    size_t len = 0;
    bool ok = false;
    char hex[65];
    synth_gguf_init(&g);
    if (!rec)
        goto done;
    const char *want = json_string_value(json_object_get(rec, "sha256"));
    json_t *want_len = json_object_get(rec, "bytes");
    json_t *q = json_object_get(rec, "quantize");
    if (!want || strlen(want) != 64 || !json_is_integer(want_len)) {
        snprintf(c->err, ERRLEN, "needs \"sha256\" (64 hex digits) and \"bytes\"");
        goto done;
    }
    if (!(q ? quantized_build(c, q, &g) : plain_build(c, rec, &g, NULL)))
        goto done;
    if (!synth_gguf_serialise(&g, &bytes, &len, c->err, ERRLEN))
        goto done;
    sha256_hex(bytes, len, hex);
    bool match = (json_int_t)len == json_integer_value(want_len) && strcmp(hex, want) == 0;
    if (!match)
        snprintf(c->err, ERRLEN,
                 "generated %zu bytes with sha256 %s, but the recipe records %lld bytes, %s "
                 "(the original file): the generator or the recipe changed",
                 len, hex, (long long)json_integer_value(want_len), want);
    if ((match || keep) && !write_file(c, out, bytes, len))
        match = false;
    ok = match;
done:
    free(bytes);
    synth_gguf_free(&g);
    json_decref(rec);
    return ok;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gguf-synth --data DIR --out FILE [--keep] RECIPE.json\n"
               "  --data DIR   where the recipe's \"sources\" paths start (tests/data)\n"
               "  --out FILE   the GGUF to write (only when it matches the recipe's sha256)\n"
               "  --keep       write it even when it does not match (to debug a recipe)\n");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"data", required_argument, NULL, 'd'},
        {"out", required_argument, NULL, 'o'},
        {"keep", no_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    synth_ctx c = {.data_dir = NULL};
    const char *out = NULL;
    bool keep = false;
    int ch;
    while ((ch = getopt_long(argc, argv, "d:o:kh", longopts, NULL)) != -1) {
        switch (ch) {
        case 'd': c.data_dir = optarg; break;
        case 'o': out = optarg; break;
        case 'k': keep = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!c.data_dir || !out || optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    c.recipe_path = argv[optind];
    if (!synth_run(&c, out, keep)) {
        fprintf(stderr, "gguf-synth: %s: %s\n", c.recipe_path, c.err);
        return 1;
    }
    return 0;
}
