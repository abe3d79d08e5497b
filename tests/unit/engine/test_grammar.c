/* Unit tests for JSON-Schema-constrained sampling (src/engine/jschema.c,
 * jsongram.c, grammar.c): refused keywords are named; the byte matcher
 * accepts instances and rejects non-instances of a corpus of schemas; and
 * stories260K, sampled under each schema of the corpus, always writes JSON
 * that parses, validates (a small validator here, independent of the
 * matcher) and ends by the schema, not by the token budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <regex.h>

#include <gpupool/engine.h>

#include "engine/jschema.h"
#include "engine/jsongram.h"

#define STORIES GP_SOURCE_DIR "/models/stories260K.gguf"

/* ------------------------------------------------------------- corpus */

/* Schemas whose strings are all bounded: the model test runs on these. */
static const char *const corpus[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",

    "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"ok\":{\"type\":\"boolean\"},\"n\":{\"type\":\"null\"},\"k\":{\"const\":42}},"
    "\"required\":[\"color\",\"ok\",\"n\",\"k\"]}",

    "{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"string\",\"minLength\":1,\"maxLength\":6},\"minItems\":2,\"maxItems\":4}},"
    "\"required\":[\"tags\"]}",

    "{\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/point\"},"
    "\"q\":{\"$ref\":\"#/$defs/point\"}},\"required\":[\"p\"],"
    "\"$defs\":{\"point\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\","
    "\"minimum\":-10,\"maximum\":10},\"y\":{\"type\":\"integer\",\"exclusiveMinimum\":5}},"
    "\"required\":[\"x\",\"y\"],\"additionalProperties\":false}}}",

    "{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"string\","
    "\"maxLength\":5},{\"type\":\"null\"},{\"type\":\"integer\",\"minimum\":-3,"
    "\"maximum\":3}]},\"w\":{\"type\":[\"boolean\",\"null\"]},"
    "\"opt\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"v\",\"w\"]}",

    "{\"type\":\"object\",\"properties\":{\"outer\":{\"type\":\"object\",\"properties\":"
    "{\"inner\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":100},"
    "\"maxItems\":3},\"s\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}},"
    "\"required\":[\"inner\",\"s\"]}},\"required\":[\"outer\"]}",

    /* patterns (anchored, unanchored with a bound) and formats */
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\","
    "\"pattern\":\"^[A-Z]{2}-[0-9]{3}$\"},\"day\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"tag\":{\"type\":\"string\","
    "\"pattern\":\"ab+c\",\"maxLength\":8},\"at\":{\"type\":\"string\","
    "\"format\":\"date-time\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"}},"
    "\"required\":[\"code\",\"day\",\"id\",\"tag\",\"at\",\"ip\"],"
    "\"additionalProperties\":false}",

    /* a discriminated union (pydantic's shape): objects told apart by a tag */
    "{\"type\":\"object\",\"properties\":{\"pet\":{\"anyOf\":[{\"$ref\":\"#/$defs/cat\"},"
    "{\"$ref\":\"#/$defs/dog\"},{\"type\":\"null\"}]}},\"required\":[\"pet\"],"
    "\"$defs\":{\"cat\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},"
    "\"lives\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},\"required\":[\"kind\","
    "\"lives\"],\"additionalProperties\":false},\"dog\":{\"type\":\"object\",\"properties\":"
    "{\"kind\":{\"enum\":[\"dog\",\"puppy\"]},\"bark\":{\"type\":\"string\",\"maxLength\":5},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":20}},\"required\":[\"kind\","
    "\"bark\"],\"additionalProperties\":false}}}",
};

/* ---------------------------------------------------------- validator */

static const json_t *v_root;

static int64_t utf8_chars(const char *s)
{
    int64_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool type_is(const json_t *v, const char *t)
{
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return false;
}

/* POSIX extended regular expressions, independent of the engine's
 * automaton: the corpus patterns are written in their common subset. */
static bool ere_match(const char *re, const json_t *v)
{
    regex_t rx;
    assert_int_equal(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
    bool ok = regexec(&rx, json_string_value(v), 0, NULL, 0) == 0;
    regfree(&rx);
    return ok;
}

/* The formats' syntax as the RFCs write it (looser than the engine's:
 * what matters is that what it writes passes). */
static const char *format_ere(const char *f)
{
    if (!strcmp(f, "date"))
        return "^[0-9]{4}-[0-9]{2}-[0-9]{2}$";
    if (!strcmp(f, "date-time"))
        return "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?"
               "([Zz]|[+-][0-9]{2}:[0-9]{2})$";
    if (!strcmp(f, "uuid"))
        return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    if (!strcmp(f, "ipv4"))
        return "^[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}$";
    fail_msg("no ERE for format %s", f);
    return NULL;
}

static bool valid(const json_t *v, const json_t *s)
{
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *r = json_string_value(x);
        const json_t *t = json_object_get(json_object_get(v_root, "$defs"), r + 8);
        return valid(v, t);
    }
    if ((x = json_object_get(s, "type"))) {
        bool ok = false;
        if (json_is_string(x))
            ok = type_is(v, json_string_value(x));
        size_t i;
        const json_t *t;
        json_array_foreach(x, i, t) ok |= type_is(v, json_string_value(t));
        if (!ok)
            return false;
    }
    if ((x = json_object_get(s, "enum"))) {
        bool ok = false;
        size_t i;
        const json_t *e;
        json_array_foreach(x, i, e) ok |= json_equal(e, v);
        if (!ok)
            return false;
    }
    if ((x = json_object_get(s, "const")) && !json_equal(x, v))
        return false;
    if ((x = json_object_get(s, "anyOf"))) {
        bool ok = false;
        size_t i;
        const json_t *a;
        json_array_foreach(x, i, a) ok |= valid(v, a);
        if (!ok)
            return false;
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        if ((x = json_object_get(s, "minimum")) && d < json_number_value(x)) return false;
        if ((x = json_object_get(s, "maximum")) && d > json_number_value(x)) return false;
        if ((x = json_object_get(s, "exclusiveMinimum")) && d <= json_number_value(x))
            return false;
        if ((x = json_object_get(s, "exclusiveMaximum")) && d >= json_number_value(x))
            return false;
    }
    if (json_is_string(v)) {
        int64_t n = utf8_chars(json_string_value(v));
        if ((x = json_object_get(s, "minLength")) && n < json_integer_value(x)) return false;
        if ((x = json_object_get(s, "maxLength")) && n > json_integer_value(x)) return false;
        if ((x = json_object_get(s, "pattern")) && !ere_match(json_string_value(x), v))
            return false;
        if ((x = json_object_get(s, "format")) && !ere_match(format_ere(json_string_value(x)), v))
            return false;
    }
    if (json_is_array(v)) {
        int64_t n = (int64_t)json_array_size(v);
        if ((x = json_object_get(s, "minItems")) && n < json_integer_value(x)) return false;
        if ((x = json_object_get(s, "maxItems")) && n > json_integer_value(x)) return false;
        const json_t *it = json_object_get(s, "items");
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) if (it && !valid(e, it)) return false;
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties");
        size_t i;
        const json_t *r;
        json_array_foreach(json_object_get(s, "required"), i, r)
            if (!json_object_get(v, json_string_value(r))) return false;
        const char *k;
        const json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            const json_t *ps = json_object_get(props, k);
            if (ps && !valid(e, ps))
                return false;
            if (!ps && json_is_false(json_object_get(s, "additionalProperties")))
                return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------ matcher */

static gpe_jschema *compile(const char *text)
{
    char err[256] = "";
    json_t *j = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    if (text)
        assert_non_null(j);
    gpe_jschema *p = gpe_jschema_compile(j, err, sizeof err);
    if (!p)
        fail_msg("compile failed: %s", err);
    json_decref(j);
    return p;
}

/* Does the matcher take the whole text as a complete value? */
static bool accepts(const gpe_jschema *p, const char *text)
{
    gpe_jg_state s;
    gpe_jg_init(&s, p);
    return gpe_jg_feed_all(&s, p, text, strlen(text)) && gpe_jg_remaining(&s, p) == 0;
}

static void test_refused_keywords(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"\\\\bx\"}", "word boundaries"},
        {"{\"type\":\"string\",\"pattern\":\"a{3,2}\"}", "quantifier"},
        {"{\"type\":\"string\",\"pattern\":\"[a-z]{40}[0-9]{40}\"}", "too complex"},
        {"{\"type\":\"string\",\"pattern\":\"^\\\"$\"}", "matches no JSON string"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", "'^'"},
        {"{\"type\":\"string\",\"pattern\":\"\xc3\xa9\"}", "non-ASCII"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "'format' 'hostname'"},
        {"{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"x\"}", "together"},
        {"{\"type\":\"integer\",\"format\":\"int32\"}", "'format' on a integer"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "'multipleOf'"},
        {"{\"type\":\"array\",\"prefixItems\":[]}", "'prefixItems'"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems'"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", "'patternProperties'"},
        {"{\"type\":\"object\",\"minProperties\":1}", "'minProperties'"},
        {"{\"not\":{}}", "'not'"},
        {"{\"if\":{},\"then\":{}}", "'if'"},
        {"{\"allOf\":[{},{}]}", "'allOf'"},
        {"{\"$ref\":\"http://x/s.json\"}", "'$ref'"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":2}]}", "'anyOf'"},
        /* objects, but not told apart by a first-property tag */
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
         "\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
         "\"integer\"}},\"required\":[\"a\"]}]}", "'anyOf'"},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":1}},"
         "\"required\":[\"t\"]},{\"type\":\"object\",\"properties\":{\"t\":{\"enum\":[2,1]}},"
         "\"required\":[\"t\"]}]}", "'anyOf'"},
        {"{\"type\":[\"integer\",\"number\"]}", "'type'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'b'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}",
         "no instance"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "'minimum'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"foo\":1}}}",
         "'foo' at #/properties/a"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        assert_int_equal(gpe_schema_check(cases[i][0], err, sizeof err), GPE_ERR_UNSUPPORTED);
        if (!strstr(err, cases[i][1]))
            fail_msg("schema %s: error '%s' does not name %s", cases[i][0], err, cases[i][1]);
    }
    char err[256];
    assert_int_equal(gpe_schema_check("{nope", err, sizeof err), GPE_ERR_ARG);
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++)
        assert_int_equal(gpe_schema_check(corpus[i], err, sizeof err), GPE_OK);
    assert_int_equal(gpe_schema_check(NULL, err, sizeof err), GPE_OK);
    assert_int_equal(gpe_schema_check("{\"type\":\"array\",\"uniqueItems\":false}", err,
                                      sizeof err), GPE_OK);
    /* annotations are fine */
    assert_int_equal(gpe_schema_check("{\"title\":\"t\",\"description\":\"d\",\"type\":"
                                      "\"string\",\"default\":\"x\"}", err, sizeof err),
                     GPE_OK);
}

static void test_matcher_corpus(void **state)
{
    (void)state;
    static const struct { int schema; const char *text; bool ok; } cases[] = {
        {0, "{\"name\":\"Bo\",\"age\":7}", true},
        {0, "{\"name\":\"Bo\",\"age\":121}", false},
        {0, "{\"name\":\"Bo\",\"age\":-1}", false},
        {0, "{\"name\":\"Bo\",\"age\":07}", false},
        {0, "{\"age\":7,\"name\":\"Bo\"}", false},          /* declared order */
        {0, "{\"name\":\"Bo\"}", false},                    /* required */
        {0, "{\"name\":\"Bo\",\"age\":7,\"x\":1}", false},  /* additional */
        {0, "{\"name\":\"abcdefghijklm\",\"age\":7}", false},  /* maxLength 12 */
        {0, "{\"name\":\"\xc3\xa9t\xc3\xa9\",\"age\":7}", true},
        {0, "{\"name\":\"\xc3\",\"age\":7}", false},        /* broken UTF-8 */
        {0, "{\"name\":\"a\\\"b\",\"age\":7}", true},
        {0, "{\"name\":\"a\nb\",\"age\":7}", false},        /* raw control byte */
        {0, "{ \"name\":\"Bo\",\"age\":7}", false},         /* no whitespace */
        {0, "{\"name\":\"Bo\",\"age\":7.5}", false},        /* integer */
        {1, "{\"color\":\"red\",\"ok\":true,\"n\":null,\"k\":42}", true},
        {1, "{\"color\":\"pink\",\"ok\":true,\"n\":null,\"k\":42}", false},
        {1, "{\"color\":\"red\",\"ok\":true,\"n\":null,\"k\":421}", false},
        {2, "{\"tags\":[\"a\",\"b\"]}", true},
        {2, "{\"tags\":[\"a\"]}", false},
        {2, "{\"tags\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", false},
        {2, "{\"tags\":[\"a\",\"\"]}", false},
        {3, "{\"p\":{\"x\":-9.5,\"y\":6}}", true},
        {3, "{\"p\":{\"x\":10,\"y\":6},\"q\":{\"x\":0,\"y\":7}}", true},
        {3, "{\"p\":{\"x\":10.5,\"y\":6}}", false},
        {3, "{\"p\":{\"x\":1,\"y\":5}}", false},            /* exclusiveMinimum */
        {3, "{\"p\":{\"x\":1e2,\"y\":6}}", false},          /* no exponent */
        {4, "{\"v\":\"abc\",\"w\":false}", true},
        {4, "{\"v\":null,\"w\":null}", true},
        {4, "{\"v\":-3,\"w\":true,\"opt\":\"z\"}", true},
        {4, "{\"v\":4,\"w\":true}", false},
        {4, "{\"v\":true,\"w\":true}", false},
        {5, "{\"outer\":{\"inner\":[100,250],\"s\":\"ab\"}}", true},
        {5, "{\"outer\":{\"inner\":[99],\"s\":\"ab\"}}", false},
        {5, "{\"outer\":{\"inner\":[],\"s\":\"a\"}}", false},
#define P6(code, day, id, tag, at, ip)                                                    \
    "{\"code\":\"" code "\",\"day\":\"" day "\",\"id\":\"" id "\",\"tag\":\"" tag       \
    "\",\"at\":\"" at "\",\"ip\":\"" ip "\"}"
#define UUID "0f8fad5b-d9cb-469f-a165-70867728950e"
        {6, P6("AB-123", "2026-11-27", UUID, "xabbbcx", "2026-11-27T05:12:00Z", "10.0.0.1"), true},
        {6, P6("AB-123", "2026-11-27", UUID, "abc", "2026-11-27T05:12:00.5+01:00", "255.255.255.0"),
         true},
        {6, P6("Ab-123", "2026-11-27", UUID, "abc", "2026-11-27T05:12:00Z", "1.2.3.4"), false},
        {6, P6("AB-1234", "2026-11-27", UUID, "abc", "2026-11-27T05:12:00Z", "1.2.3.4"), false},
        {6, P6("AB-123", "2026-13-27", UUID, "abc", "2026-11-27T05:12:00Z", "1.2.3.4"), false},
        {6, P6("AB-123", "2026-11-27", "0f8fad5b", "abc", "2026-11-27T05:12:00Z", "1.2.3.4"), false},
        {6, P6("AB-123", "2026-11-27", UUID, "ac", "2026-11-27T05:12:00Z", "1.2.3.4"), false},
        {6, P6("AB-123", "2026-11-27", UUID, "xxxxxabc", "2026-11-27T05:12:00Z", "1.2.3.4"), true},
        {6, P6("AB-123", "2026-11-27", UUID, "xxxxxxabc", "2026-11-27T05:12:00Z", "1.2.3.4"), false},
        {6, P6("AB-123", "2026-11-27", UUID, "abc", "2026-11-27 05:12:00Z", "1.2.3.4"), false},
        {6, P6("AB-123", "2026-11-27", UUID, "abc", "2026-11-27T05:12:00", "1.2.3.4"), false},
        {6, P6("AB-123", "2026-11-27", UUID, "abc", "2026-11-27T05:12:00Z", "256.1.1.1"), false},
        {6, P6("AB-123", "2026-11-27", UUID, "a\\u0062c", "2026-11-27T05:12:00Z", "1.2.3.4"),
         false},   /* a pattern string is written without escapes */
        {7, "{\"pet\":{\"kind\":\"cat\",\"lives\":3}}", true},
        {7, "{\"pet\":{\"kind\":\"puppy\",\"bark\":\"wo\",\"age\":2}}", true},
        {7, "{\"pet\":{\"kind\":\"dog\",\"bark\":\"wo\"}}", true},
        {7, "{\"pet\":null}", true},
        {7, "{\"pet\":{\"kind\":\"cat\",\"bark\":\"wo\"}}", false},
        {7, "{\"pet\":{\"kind\":\"dog\",\"lives\":3}}", false},
        {7, "{\"pet\":{\"kind\":\"cat\"}}", false},
        {7, "{\"pet\":{\"kind\":\"cow\",\"lives\":3}}", false},
        {7, "{\"pet\":{\"lives\":3}}", false},
    };
    gpe_jschema *ps[sizeof corpus / sizeof corpus[0]];
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++)
        ps[i] = compile(corpus[i]);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool got = accepts(ps[cases[i].schema], cases[i].text);
        if (got != cases[i].ok)
            fail_msg("schema %d, %s: matcher says %d", cases[i].schema, cases[i].text, got);
        /* the validator agrees on what the matcher accepts */
        json_t *v = json_loads(cases[i].text, 0, NULL);
        json_t *s = json_loads(corpus[cases[i].schema], 0, NULL);
        v_root = s;
        if (got)
            assert_true(v && valid(v, s));
        json_decref(v);
        json_decref(s);
    }
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++)
        gpe_jschema_free(ps[i]);

    /* exclusive whole bounds on a number: a fraction that is not all zeros */
    gpe_jschema *ex = compile("{\"type\":\"number\",\"exclusiveMinimum\":0,"
                              "\"exclusiveMaximum\":1}");
    assert_true(accepts(ex, "0.5"));
    assert_true(accepts(ex, "0.05"));
    assert_false(accepts(ex, "0"));
    assert_false(accepts(ex, "0.0"));
    assert_false(accepts(ex, "1"));
    assert_false(accepts(ex, "1.5"));
    assert_false(accepts(ex, "-0.5"));
    gpe_jschema_free(ex);
    ex = compile("{\"type\":\"number\",\"minimum\":-2,\"exclusiveMaximum\":0}");
    assert_true(accepts(ex, "-0.5"));
    assert_true(accepts(ex, "-2"));
    assert_true(accepts(ex, "-1.25"));
    assert_false(accepts(ex, "-0"));
    assert_false(accepts(ex, "-0.00"));
    assert_false(accepts(ex, "0.5"));
    assert_false(accepts(ex, "-2.5"));
    gpe_jschema_free(ex);
    ex = compile("{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":3}");
    assert_true(accepts(ex, "1"));
    assert_true(accepts(ex, "2"));
    assert_false(accepts(ex, "0"));
    assert_false(accepts(ex, "3"));
    gpe_jschema_free(ex);

    /* json_object mode: any object, nothing else */
    gpe_jschema *any = compile(NULL);
    assert_true(accepts(any, "{}"));
    assert_true(accepts(any, "{\"a\":[1,{\"b\":null},\"x\",-0.5,true],\"c\":{}}"));
    assert_false(accepts(any, "[1]"));
    assert_false(accepts(any, "\"s\""));
    assert_false(accepts(any, "{\"a\":tru}"));
    gpe_jschema_free(any);

    /* remaining: the fewest bytes that close the value */
    gpe_jschema *p = compile(corpus[0]);
    gpe_jg_state s;
    gpe_jg_init(&s, p);
    assert_int_equal(gpe_jg_remaining(&s, p), (int64_t)strlen("{\"name\":\"\",\"age\":0}"));
    assert_true(gpe_jg_feed_all(&s, p, "{\"name\":\"abc", 11));
    assert_int_equal(gpe_jg_remaining(&s, p), (int64_t)strlen("\",\"age\":0}"));
    gpe_jschema_free(p);
}

/* The remaining count of a discriminated union pairs each tag value with
 * its own alternative: on the way through the shortest instance of each
 * alternative it falls by exactly one per byte. (fuzz_jschema found the
 * old count pairing the shortest value, "a", with the shortest tail, the
 * other alternative's: 7 bytes left after {" where 11 were needed.) */
static void test_tag_union_remaining(void **state)
{
    (void)state;
    gpe_jschema *p = compile(
        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"},"
        "\"x\":{\"type\":\"integer\"}},\"required\":[\"k\",\"x\"],"
        "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"k\":"
        "{\"enum\":[\"b*,*c\"]},\"s\":{\"type\":\"string\",\"maxLength\":3}},"
        "\"required\":[\"k\"]}]}");
    const char *shortest[] = {"{\"k\":\"b*,*c\"}", "{\"k\":\"a\",\"x\":0}"};
    for (size_t w = 0; w < 2; w++) {
        gpe_jg_state s;
        gpe_jg_init(&s, p);
        int64_t len = (int64_t)strlen(shortest[w]);
        /* the first is the union's shortest; the second is longer than it
         * until its tag is read */
        for (int64_t i = 0; i < len; i++) {
            int64_t rem = gpe_jg_remaining(&s, p);
            assert_int_equal(rem, w == 0 || i >= 7 ? len - i : 13 - i);
            assert_true(gpe_jg_feed(&s, p, (unsigned char)shortest[w][i]));
        }
        assert_int_equal(gpe_jg_remaining(&s, p), 0);
        assert_int_equal(s.depth, 0);
    }
    gpe_jschema_free(p);
}

/* Random walks over the matcher: at each step one byte, drawn among those
 * the matcher takes that keep the value completable within the budget;
 * every finished walk must parse and validate. Reaches what the tiny model
 * rarely writes (escapes, multi-byte UTF-8, fractions at the bounds). */
static void test_matcher_random_walks(void **state)
{
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    const char *extra[] = {
        "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":2,"
        "\"maxLength\":5},\"x\":{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":3},"
        "\"e\":{\"enum\":[1,12,\"a\\\"b\",[1,2],{\"k\":null}]}},\"required\":[\"s\",\"x\",\"e\"]}",
        /* recursion through $defs, anyOf with an array, free values */
        "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":"
        "{\"v\":{\"type\":[\"integer\",\"null\"],\"exclusiveMinimum\":-7,\"exclusiveMaximum\":-2},"
        "\"kids\":{\"anyOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},"
        "\"maxItems\":2},{\"type\":\"string\",\"minLength\":3,\"maxLength\":3}]},"
        "\"m\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}},"
        "\"required\":[\"v\"],\"additionalProperties\":false}}}",
        /* a top-level array of numbers, minItems forcing */
        "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":100,\"maximum\":1000},"
        "\"minItems\":3,\"maxItems\":5}",
        /* a top-level integer (no closing byte) and a bare string */
        "{\"type\":\"integer\",\"minimum\":-50,\"maximum\":12345}",
        "{\"type\":\"string\",\"minLength\":4}",
        /* exclusive whole bounds on numbers: 0 < x < 1, -2 <= x < 0 */
        "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"exclusiveMinimum\":0,"
        "\"exclusiveMaximum\":1},\"minItems\":1}",
        "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-2,"
        "\"exclusiveMaximum\":0},\"minItems\":1}",
        NULL,
    };
    size_t n_corpus = sizeof corpus / sizeof corpus[0];
    size_t n_extra = sizeof extra / sizeof extra[0];
    for (size_t i = 0; i < n_corpus + n_extra; i++) {
        const char *text = i < n_corpus ? corpus[i] : extra[i - n_corpus];
        gpe_jschema *p = compile(text);
        json_t *schema = text ? json_loads(text, 0, NULL) : json_object();
        v_root = schema;
        for (int walk = 0; walk < 300; walk++) {
            gpe_jg_state s, t;
            gpe_jg_init(&s, p);
            char out[512];
            int len = 0, budget = (int)gpe_jg_remaining(&s, p) + walk % 200;
            while (s.depth > 0 && len < budget) {
                unsigned char ok[256];
                int n_ok = 0;
                for (int c = 1; c < 256; c++) {
                    gpe_jg_copy(&t, &s);
                    if (gpe_jg_feed(&t, p, (unsigned char)c) &&
                        gpe_jg_remaining(&t, p) <= budget - len - 1)
                        ok[n_ok++] = (unsigned char)c;
                }
                if (n_ok == 0 && gpe_jg_remaining(&s, p) == 0)
                    break;   /* complete, and nothing may follow (a number at its bound) */
                if (n_ok == 0) {
                    out[len] = 0;
                    fail_msg("schema %zu walk %d stuck after %s (budget %d, rem %lld)", i, walk, out, budget, (long long)gpe_jg_remaining(&s, p));
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                unsigned char c = ok[x % (uint64_t)n_ok];
                assert_true(gpe_jg_feed(&s, p, c));
                out[len++] = (char)c;
                if (gpe_jg_remaining(&s, p) == 0 && s.depth > 0 && x % 4 == 0)
                    break;   /* a number may end without a closing byte */
            }
            out[len] = '\0';
            assert_int_equal(gpe_jg_remaining(&s, p), 0);
            json_error_t je;
            json_t *v = json_loads(out, JSON_DECODE_ANY, &je);
            if (!v || !valid(v, schema) || (!text && !json_is_object(v)))
                fail_msg("schema %zu walk %d: '%s' (%s)", i, walk, out, v ? "invalid" : je.text);
            json_decref(v);
        }
        json_decref(schema);
        gpe_jschema_free(p);
    }
}

/* ------------------------------------------------------------- model */

typedef struct gen_out {
    char text[4096];
    size_t len;
    int n_tokens;
    bool by_schema;   /* ended because the schema closed (or EOS where complete) */
} gen_out;

static void generate(gpe_model *m, gpe_ctx *ctx, const char *schema, uint64_t seed,
                     int max_tokens, gen_out *out)
{
    char err[256];
    gpe_grammar *g = NULL;
    assert_int_equal(gpe_grammar_init(m, schema, &g, err, sizeof err), GPE_OK);
    gpe_sampler_params sp = gpe_sampler_default_params();
    sp.temperature = 1.0f;
    sp.seed = seed;
    gpe_sampler *smp = gpe_sampler_init(&sp);
    int32_t toks[64];
    int n = gpe_tokenize(m, "Once upon a time", 16, true, false, toks, 64);
    assert_true(n > 0);
    gpe_seq_clear(ctx, 0);
    gpe_batch *b = gpe_batch_init(64);
    for (int i = 0; i < n; i++)
        gpe_batch_add(b, toks[i], i, 0, i == n - 1);
    assert_int_equal(gpe_decode(ctx, b, err, sizeof err), GPE_OK);
    int pos = n, nv = gpe_model_n_vocab(m), last = n - 1;
    memset(out, 0, sizeof *out);
    for (int step = 0; step < max_tokens; step++) {
        const float *l = gpe_grammar_mask(g, gpe_get_logits(ctx, last), nv, max_tokens - step);
        int32_t t = gpe_sampler_sample(smp, l, nv);
        assert_int_equal(gpe_grammar_accept(g, t), GPE_OK);
        out->n_tokens++;
        if (gpe_token_is_eog(m, t)) {
            out->by_schema = true;
            break;
        }
        char piece[256];
        int k = gpe_token_to_piece(m, t, piece, sizeof piece, false);
        assert_true(k >= 0 && out->len + (size_t)k < sizeof out->text);
        memcpy(out->text + out->len, piece, (size_t)k);
        out->len += (size_t)k;
        if (gpe_grammar_done(g)) {
            out->by_schema = true;
            break;
        }
        gpe_batch_clear(b);
        gpe_batch_add(b, t, pos++, 0, true);
        last = 0;
        assert_int_equal(gpe_decode(ctx, b, err, sizeof err), GPE_OK);
    }
    gpe_batch_free(b);
    gpe_sampler_free(smp);
    gpe_grammar_free(g);
}

static void test_stories_corpus(void **state)
{
    (void)state;
    char err[256];
    gpe_model *m = NULL;
    gpe_model_params mp = gpe_model_default_params();
    assert_int_equal(gpe_model_load(STORIES, &mp, &m, err, sizeof err), GPE_OK);
    gpe_ctx_params cp = gpe_ctx_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 1;
    gpe_ctx *ctx = NULL;
    assert_int_equal(gpe_ctx_init(m, &cp, &ctx, err, sizeof err), GPE_OK);
    gen_out out;
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
        json_t *schema = json_loads(corpus[i], 0, NULL);
        v_root = schema;
        for (uint64_t seed = 1; seed <= 8; seed++) {
            generate(m, ctx, corpus[i], seed, 300, &out);
            out.text[out.len] = '\0';
            json_error_t je;
            json_t *v = json_loads(out.text, 0, &je);
            if (!v || !out.by_schema || !valid(v, schema))
                fail_msg("schema %zu seed %llu: '%s' (parsed %d, by schema %d)", i,
                         (unsigned long long)seed, out.text, v != NULL, out.by_schema);
            if (seed <= 2)
                printf("schema %zu seed %llu (%d tokens): %s\n", i, (unsigned long long)seed,
                       out.n_tokens, out.text);
            json_decref(v);
        }
        json_decref(schema);
    }
    /* Unbounded strings and json_object mode close within a small budget. */
    const char *open[] = {
        "{\"type\":\"object\",\"properties\":{\"story\":{\"type\":\"string\"},"
        "\"more\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
        "\"required\":[\"story\",\"more\"]}",
        NULL,
    };
    for (int i = 0; i < 2; i++)
        for (int budget = 24; budget <= 64; budget += 20)
            for (uint64_t seed = 1; seed <= 4; seed++) {
                generate(m, ctx, open[i], seed, budget, &out);
                out.text[out.len] = '\0';
                json_t *v = json_loads(out.text, 0, NULL);
                if (!v || !json_is_object(v) || !out.by_schema || out.n_tokens > budget)
                    fail_msg("open schema %d budget %d seed %llu: '%s'", i, budget,
                             (unsigned long long)seed, out.text);
                json_decref(v);
            }
    printf("sample under schema 0: %s\n", out.text);
    gpe_ctx_free(ctx);
    gpe_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_keywords),
        cmocka_unit_test(test_matcher_corpus),
        cmocka_unit_test(test_matcher_random_walks),
        cmocka_unit_test(test_tag_union_remaining),
        cmocka_unit_test(test_stories_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
