/* Unit tests for the JSON Schema validator (src/engine/jvalidate.c): the
 * schema's own meaning for each keyword the grammar supports (not the
 * subset the byte matcher writes), the first violation's place and reason,
 * refused keywords named, and a bound on what a hostile schema costs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/jvalidate.h"

/* JSON written with ' for " (readability); \' is a real '. */
static char *dq(const char *s)
{
    char *o = strdup(s);
    assert_non_null(o);
    for (char *p = o; *p; p++)
        if (*p == '\'')
            *p = '"';
    return o;
}

static gpe_jv *make(const char *schema, char *err, size_t errlen)
{
    char *t = dq(schema);
    json_error_t je;
    json_t *s = json_loads(t, JSON_DECODE_ANY, &je);
    if (!s)
        fail_msg("bad test schema %s: %s", t, je.text);
    free(t);
    gpe_jv *v = gpe_jv_new(s, err, errlen);
    json_decref(s);
    return v;
}

typedef struct vcase {
    const char *schema;
    const char *value;
    int want;              /* GPE_JV_VALID / INVALID */
    const char *msg;       /* a substring of the message, or NULL */
} vcase;

static const vcase cases[] = {
    /* types; 1.0 is an integer; bools are not numbers */
    {"{'type':'integer'}", "3", GPE_JV_VALID, NULL},
    {"{'type':'integer'}", "3.0", GPE_JV_VALID, NULL},
    {"{'type':'integer'}", "3.5", GPE_JV_INVALID, "a number, not of type 'integer'"},
    {"{'type':'number'}", "true", GPE_JV_INVALID, "at /: true, not of type 'number'"},
    {"{'type':['string','null']}", "null", GPE_JV_VALID, NULL},
    {"{'type':['string','null']}", "1", GPE_JV_INVALID, "not of the types"},
    {"{'type':'integer'}", "123456789012345678901234567890", GPE_JV_VALID, NULL},
    /* objects: any order, whitespace, extra keys unless forbidden */
    {"{'type':'object','properties':{'a':{'type':'integer'},'b':{'type':'string'}},"
     "'required':['a','b']}",
     " { 'b' : 'x', 'a' : 1, 'c': [1] } ", GPE_JV_VALID, NULL},
    {"{'type':'object','properties':{'a':{'type':'integer'}},'required':['a'],"
     "'additionalProperties':false}",
     "{'a':1,'zz':2}", GPE_JV_INVALID, "at /: property 'zz' is not allowed"},
    {"{'type':'object','properties':{'a':{'type':'integer'}},'required':['a']}", "{}",
     GPE_JV_INVALID, "required property 'a' is missing"},
    {"{'type':'object','additionalProperties':{'type':'integer'}}", "{'x':1,'y/~':'s'}",
     GPE_JV_INVALID, "at /y~1~0: a string"},
    /* arrays and the place of an item */
    {"{'properties':{'pets':{'type':'array','items':{'enum':['cat','dog']},'maxItems':3}}}",
     "{'pets':['cat','dog','cow']}", GPE_JV_INVALID, "at /pets/2: not one of the 2 enum"},
    {"{'properties':{'pets':{'type':'array','maxItems':3}}}", "{'pets':[1,2,3,4]}",
     GPE_JV_INVALID, "at /pets: 4 items, more than maxItems 3"},
    {"{'type':'array','minItems':2}", "[1]", GPE_JV_INVALID, "fewer than minItems 2"},
    {"{'type':'array','uniqueItems':false}", "[1,1]", GPE_JV_VALID, NULL},
    /* numbers, exactly */
    {"{'minimum':1,'maximum':5}", "5", GPE_JV_VALID, NULL},
    {"{'minimum':1,'maximum':5}", "5.5", GPE_JV_INVALID, "5.5 is greater than maximum 5"},
    {"{'exclusiveMinimum':0}", "0", GPE_JV_INVALID, "not greater than exclusiveMinimum"},
    {"{'exclusiveMinimum':0}", "1e-300", GPE_JV_VALID, NULL},
    {"{'exclusiveMaximum':2.5}", "2.5", GPE_JV_INVALID, "not less than"},
    {"{'maximum':1e300}", "1e301", GPE_JV_INVALID, "greater than maximum"},
    {"{'minimum':9007199254740993}", "9007199254740992", GPE_JV_INVALID, "less than minimum"},
    /* enum and const compare numbers by value, objects by content */
    {"{'enum':[1,'a',{'k':[2]}]}", "1.0", GPE_JV_VALID, NULL},
    {"{'enum':[1,'a',{'k':[2]}]}", "{'k':[2.0]}", GPE_JV_VALID, NULL},
    {"{'const':{'k':[2]}}", "{'k':[2,3]}", GPE_JV_INVALID, "not the const value"},
    {"{'type':'string','enum':['a','b']}", "'c'", GPE_JV_INVALID, "enum"},
    /* strings: lengths in code points; patterns search unless anchored,
     * over every character (a quote, a newline) */
    {"{'minLength':4,'maxLength':4}", "'caf\\u00e9'", GPE_JV_VALID, NULL},
    {"{'maxLength':3}", "'caf\\u00e9'", GPE_JV_INVALID, "4 characters, longer than maxLength 3"},
    {"{'pattern':'hi'}", "'say \\'hi\\' twice'", GPE_JV_VALID, NULL},
    {"{'pattern':'^[A-Z]{2}-[0-9]{3}$'}", "'AB-123'", GPE_JV_VALID, NULL},
    {"{'pattern':'^[A-Z]{2}-[0-9]{3}$'}", "'AB-1234'", GPE_JV_INVALID, "does not match pattern"},
    {"{'pattern':'^.$'}", "'\\n'", GPE_JV_INVALID, "pattern"},
    {"{'pattern':'^[^a]$'}", "'\\n'", GPE_JV_VALID, NULL},
    {"{'pattern':'^a\\\\sb$'}", "'a\\tb'", GPE_JV_VALID, NULL},
    {"{'pattern':'^\\\\\\\\\\'$'}", "'\\\\\\''", GPE_JV_VALID, NULL},
    {"{'type':'string','pattern':'^x'}", "5", GPE_JV_INVALID, "an integer, not of type"},
    {"{'pattern':'^x'}", "5", GPE_JV_VALID, NULL},
    /* formats, as the grammar writes them */
    {"{'format':'date-time'}", "'2024-02-29T12:30:00Z'", GPE_JV_VALID, NULL},
    {"{'format':'date-time'}", "'2024-02-29 12:30:00'", GPE_JV_INVALID, "format 'date-time'"},
    {"{'format':'email'}", "'a.b@example.org'", GPE_JV_VALID, NULL},
    {"{'format':'ipv4'}", "'256.1.1.1'", GPE_JV_INVALID, "format 'ipv4'"},
    {"{'format':'uuid','pattern':'^0'}", "'1b4e28ba-2fa1-11d2-883f-0016d3cca427'",
     GPE_JV_INVALID, "pattern"},
    /* unions: anyOf one, oneOf exactly one */
    {"{'anyOf':[{'type':'string','maxLength':2},{'type':'null'}]}", "null", GPE_JV_VALID, NULL},
    {"{'properties':{'n':{'anyOf':[{'type':'string','maxLength':2},{'type':'null'}]}}}",
     "{'n':'abc'}", GPE_JV_INVALID, "at /n: matches none of the 2 anyOf alternatives"},
    {"{'oneOf':[{'type':'number'},{'type':'integer'}]}", "3", GPE_JV_INVALID,
     "matches oneOf alternatives 0 and 1"},
    {"{'oneOf':[{'type':'number'},{'type':'integer'}]}", "3.5", GPE_JV_VALID, NULL},
    {"{'allOf':[{'type':'integer'}]}", "'x'", GPE_JV_INVALID, "a string"},
    /* a discriminated union (as pydantic writes one) */
    {"{'oneOf':[{'type':'object','properties':{'kind':{'const':'a'},'x':{'type':'integer'}},"
     "'required':['kind','x']},{'type':'object','properties':{'kind':{'const':'b'},"
     "'y':{'type':'string'}},'required':['kind','y']}]}",
     "{'kind':'b','y':'s'}", GPE_JV_VALID, NULL},
    /* $ref, recursion, $ref beside other keywords */
    {"{'$defs':{'t':{'type':'object','properties':{'v':{'type':'integer'},'kids':{'type':"
     "'array','items':{'$ref':'#/$defs/t'}}},'required':['v']}},'$ref':'#/$defs/t'}",
     "{'v':1,'kids':[{'v':2,'kids':[{'v':'3'}]}]}", GPE_JV_INVALID, "at /kids/0/kids/0/v:"},
    {"{'definitions':{'s':{'type':'string'}},'$ref':'#/definitions/s','maxLength':1}", "'ab'",
     GPE_JV_INVALID, "maxLength 1"},
    /* schemas true and false; annotations */
    {"{'properties':{'a':true,'b':false}}", "{'a':[1]}", GPE_JV_VALID, NULL},
    {"{'properties':{'a':true,'b':false}}", "{'b':1}", GPE_JV_INVALID, "at /b: no value"},
    {"{'title':'t','description':'d','default':1,'examples':[2],'$schema':'x'}", "{}",
     GPE_JV_VALID, NULL},
    /* a definition nothing uses is not looked at (jschema does not either) */
    {"{'$defs':{'unused':{'if':{}}},'type':'integer'}", "1", GPE_JV_VALID, NULL},
    /* text that is not one JSON value */
    {"{}", "{'a':1} x", GPE_JV_INVALID, "not JSON"},
    {"{}", "", GPE_JV_INVALID, "not JSON"},
};

static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[300], msg[400];
        gpe_jv *v = make(cases[i].schema, err, sizeof err);
        if (!v)
            fail_msg("case %zu: schema refused: %s", i, err);
        char *val = dq(cases[i].value);
        gpe_jv_result r = gpe_jv_check_text(v, val, strlen(val), msg, sizeof msg);
        if ((int)r != cases[i].want)
            fail_msg("case %zu (%s on %s): got %d (%s)", i, cases[i].schema, val, r, msg);
        if (cases[i].msg && !strstr(msg, cases[i].msg))
            fail_msg("case %zu: message '%s' lacks '%s'", i, msg, cases[i].msg);
        free(val);
        gpe_jv_free(v);
    }
}

/* Everything the grammar refuses is refused here too, by name. */
static void test_refused(void **state)
{
    (void)state;
    static const char *const refused[][2] = {
        {"{'type':'integer','multipleOf':2}", "'multipleOf' at #"},
        {"{'properties':{'a':{'not':{}}}}", "'not' at #/properties/a"},
        {"{'type':'array','uniqueItems':true}", "'uniqueItems'"},
        {"{'type':'array','items':[{}]}", "'items' (array form)"},
        {"{'type':'array','prefixItems':[{}]}", "'prefixItems'"},
        {"{'format':'hostname'}", "'format' 'hostname'"},
        {"{'$ref':'#/$defs/missing'}", "'$ref'"},
        {"{'$ref':'http://example.org/s'}", "'$ref'"},
        {"{'pattern':'(a)\\\\1'}", "backreferences"},
        {"{'pattern':'(?=a)'}", "lookaround"},
        {"{'type':'strung'}", "'type'"},
        {"{'minLength':-1}", "'minLength'"},
        {"{'anyOf':[]}", "'anyOf'"},
        {"{'$defs':{'a':{'if':{}}},'$ref':'#/$defs/a'}", "'if' at #/$defs/a"},
        {"[]", "must be an object or a boolean"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char err[300] = "";
        gpe_jv *v = make(refused[i][0], err, sizeof err);
        if (v)
            fail_msg("case %zu (%s) accepted", i, refused[i][0]);
        if (!strstr(err, refused[i][1]))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, refused[i][1]);
    }
}

/* A cyclic $ref is walked once; a union of many recursive alternatives,
 * each failing deep down, stops at the cost bound rather than take
 * 16^depth steps. */
static void test_cost_bounded(void **state)
{
    (void)state;
    char err[300], msg[300];
    gpe_jv *v = make("{'$ref':'#/$defs/a','$defs':{'a':{'anyOf':[{'$ref':'#/$defs/b'},"
                     "{'$ref':'#/$defs/b'},{'$ref':'#/$defs/b'},{'$ref':'#/$defs/b'},"
                     "{'$ref':'#/$defs/b'},{'$ref':'#/$defs/b'},{'$ref':'#/$defs/b'},"
                     "{'$ref':'#/$defs/b'}]},'b':{'type':'array','items':{'$ref':'#/$defs/a'}}}}",
                     err, sizeof err);
    assert_non_null(v);
    char deep[200];
    int n = 0;
    for (int i = 0; i < 40; i++)
        deep[n++] = '[';
    deep[n++] = '1';
    for (int i = 0; i < 40; i++)
        deep[n++] = ']';
    assert_int_equal(gpe_jv_check_text(v, deep, (size_t)n, msg, sizeof msg), GPE_JV_ERROR);
    assert_non_null(strstr(msg, "costs too much"));
    assert_int_equal(gpe_jv_check_text(v, "[[],[[]]]", 9, msg, sizeof msg), GPE_JV_VALID);
    gpe_jv_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_cost_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
