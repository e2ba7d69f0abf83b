#!/usr/bin/env python3
"""Golden cases for the C++ Jinja interpreter (src/text/jinja_*.cpp).

Each case is a small template rendered with jinja2 configured exactly as transformers
configures its chat-template environment (we call transformers' own
_compile_jinja_template, so ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson, raise_exception, strftime_now, dict and namespace are all
theirs). Writes tests/fixtures/text/jinja_cases.json: a list of
  {"name", "template", "context", "output"}  or  {"name", "template", "context", "error"}
where "error" is "<ExceptionType>: <message>". The C++ test requires the same output,
or an error for error cases (and, unless "loose_error" is set, that our message
contains jinja2's).

Run: HF_HUB_OFFLINE=1 tools/.venv/bin/python tools/gen_jinja_cases.py
Deterministic: no clocks (strftime_now is tested in C++ for its format only), no
randomness, no addresses in outputs.
"""

import copy
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from jinja2 import meta  # noqa: E402
from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "text", "jinja_cases.json")

# The context every case gets unless it names its own (merged: the case's keys win).
BASE = {
    "xs": [1, 2, 3],
    "ys": [3, 1, 2, 1],
    "words": ["banana", "Apple", "cherry", "apple"],
    "d": {"b": 2, "a": 1, "c": 3},
    "s": "Hello World",
    "n": 5,
    "f": 2.5,
    "t": True,
    "nil": None,
    "empty": [],
    "users": [
        {"name": "ann", "age": 31, "admin": True, "tags": ["x"]},
        {"name": "bob", "age": 25, "admin": False},
        {"name": "cy", "age": 31, "admin": False, "tags": []},
    ],
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "content": "{\"temp\": 20}"},
        {"role": "user", "content": "Thanks  "},
    ],
    "tool": {"type": "function", "function": {"name": "f", "description": "Does f.\nReally.",
             "parameters": {"type": "object", "properties": {"x": {"type": "integer", "enum": [1, 2]},
                                                           "y": {"type": "string", "description": "é ü \u4e2d"}},
                            "required": ["x"]}}},
    "uni": "h\u00e9llo w\u00f6rld \u4e2d\u6587 \U0001f600",
    "ml": "line one\n  line two\n\nline four\n",
}

CASES = []


def case(name, template, ctx=None, loose_error=False):
    CASES.append((name, template, ctx, loose_error))


# --- output of values -------------------------------------------------------------
case("print_int", "{{ 42 }} {{ -7 }} {{ 0 }} {{ n }}")
case("print_float", "{{ 1.0 }} {{ 0.1 }} {{ 2.5 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 1.5e300 * 1e300 }} {{ -0.0 }}")
case("print_float2", "{{ 123456789012345678.0 }} {{ 0.30000000000000004 }} {{ 1/3 }} {{ 2/3 }} {{ 100.0 }} {{ 1e22 }} {{ 0.0001 }} {{ 0.00001234 }}")
case("print_float3", "{{ 3.14159 }} {{ 1e300 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }} {{ 12345.678e3 }}")
case("print_none_bool", "{{ none }} {{ None }} {{ true }} {{ True }} {{ false }} {{ False }} {{ nil }} {{ t }}")
case("print_list", "{{ [1, 'a', none, true, 2.0] }} {{ xs }} {{ [] }} {{ [[1], [2, [3]]] }}")
case("print_dict", "{{ {'a': 1, 'b': 'x'} }} {{ {} }} {{ d }} {{ {1: none, 2.5: false} }}")
case("print_tuple", "{{ (1, 2) }} {{ (1,) }} {{ () }} {{ 1, 2 }}")
case("print_str_repr", "{{ [\"it's\", 'q\"', \"both'\\\"\", '\\n\\t\\r', '\\x01\\x7f', 'é\\u00a0\\u2028'] }}")
case("print_str_repr_uni", "{{ [uni, '\\u200b', '\\ufeff', '\\U0001f600', '\\\\'] }}")
case("print_nested_messages", "{{ messages[2] }}")
case("print_undefined", "[{{ nope }}][{{ nope is defined }}][{{ [nope] }}]")
case("print_string_plain", "{{ 'abc' }}{{ \"d'e\" }}{{ s }}")
case("print_unicode", "{{ uni }}|{{ 'ß→∑' }}")

# --- literals and escapes -----------------------------------------------------------
case("str_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f' }}|{{ \"\\u00e9\\x41\\101\\U0001F600\" }}")
case("str_unknown_escape", "{{ 'a\\db\\s' }}")
case("str_adjacent_concat", "{{ 'a' 'b' \"c\" }}")
case("str_multiline_literal", "{{ 'a\nb' }}")
case("int_literals", "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000_000 }}")
case("float_literals", "{{ 1.5 }} {{ 1_0.2_5 }} {{ 2e3 }} {{ 2E-3 }} {{ 1.5e+2 }}")
case("list_trailing_comma", "{{ [1, 2,] }} {{ {'a': 1,} }} {{ (1, 2,) }}")
case("dict_literal_nested", "{{ {'a': {'b': [1, {'c': none}]}}['a']['b'][1] }}")
case("dict_dup_keys", "{{ {'a': 1, 'b': 2, 'a': 3} }}")
case("dict_int_bool_keys", "{{ {1: 'a', true: 'b', 1.0: 'c'} }}")

# --- arithmetic -----------------------------------------------------------------------
case("arith_int", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}")
case("arith_neg_floor", "{{ -7 // 2 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ -7.5 // 2 }} {{ -7.5 % 2 }} {{ 7.5 % -2 }}")
case("arith_float", "{{ 0.1 + 0.2 }} {{ 2.5 * 4 }} {{ 1.5 - 0.5 }} {{ 2 ** 0.5 }} {{ 2 ** -1 }} {{ 10 / 4.0 }} {{ 9.0 // 2 }}")
case("arith_unary", "{{ -n }} {{ +n }} {{ -f }} {{ --3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ - -f }}")
case("arith_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }} {{ 100 / 10 / 5 }} {{ 1 ~ 2 * 3 }} {{ 'a' ~ (1 + 2) }}")
case("arith_concat_binds_tighter", "{{ 1 + 2 ~ 3 }}")
case("arith_bool", "{{ true + 1 }} {{ false * 3 }} {{ true / 2 }} {{ true + true }}")
case("arith_str_add", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'a' * 0 }} {{ 'a' * -2 }}")
case("arith_list_add", "{{ [1] + [2, 3] }} {{ [0] * 3 }} {{ (1,) + (2,) }} {{ 2 * [1, 2] }}")
case("arith_div_zero", "{{ 1 / 0 }}")
case("arith_floordiv_zero", "{{ 1 // 0 }}")
case("arith_mod_zero", "{{ 5 % 0 }}")
case("arith_float_div_zero", "{{ 1.5 / 0.0 }}")
case("arith_str_plus_int", "{{ 'a' + 1 }}")
case("arith_undefined", "{{ nope + 1 }}")
case("arith_none", "{{ nil + 1 }}")
case("arith_list_minus", "{{ [1] - [1] }}")
case("arith_pow_neg_zero", "{{ 0 ** -1 }}")
case("arith_big_int", "{{ 2 ** 62 }} {{ 9223372036854775807 }} {{ -9223372036854775807 - 1 }}")
case("arith_str_mod_fmt", "{{ '%s-%d' % ('a', 3) }} {{ '%s' % 'x' }} {{ '%05.2f|%x|%r' % (3.14159, 255, 'q') }} {{ '100%%' % () }}")
case("concat_tilde", "{{ 1 ~ 2 }} {{ 'a' ~ none ~ true }} {{ nope ~ 'x' }} {{ xs ~ '' }} {{ 1.0 ~ '' }}")

# --- comparisons / logic ----------------------------------------------------------------
case("cmp_basic", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 3 >= 3 }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }}")
case("cmp_chain", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1 == 1 }} {{ 1 < 3 > 2 }}")
case("cmp_eq_types", "{{ 1 == '1' }} {{ none == none }} {{ none == false }} {{ 0 == false }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ (1, 2) == [1, 2] }} {{ true == 1 }}")
case("cmp_list_order", "{{ [1, 2] < [1, 3] }} {{ [1] < [1, 0] }} {{ 'abc' < 'abd' }} {{ 'é' > 'z' }}")
case("cmp_mixed_error", "{{ 1 < 'a' }}")
case("cmp_none_error", "{{ nil < 1 }}")
case("cmp_undefined_eq", "{{ nope == nope }} {{ nope == none }} {{ nope != 1 }}")
case("cmp_undefined_lt", "{{ nope < 1 }}")
case("logic_values", "[{{ true and 3 }}][{{ 0 and 3 }}][{{ 0 or 'x' }}][{{ nil or [] }}][{{ '' or 0 }}][{{ 'a' and 'b' }}][{{ not 0 }}][{{ not 'a' }}][{{ not [] }}]")
case("logic_precedence", "{{ true or false and false }} {{ not true or true }} {{ not (true or true) }} {{ not 1 == 2 }}")
case("logic_short_circuit", "{{ false and nope.x }} {{ true or nope.x }} {{ nope is defined and nope.x }}")
case("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, {'a':1}, none, 0.0, 0.1] %}{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if nope else 'F' }}")
case("in_operator", "{{ 'ell' in s }} {{ 'a' in d }} {{ 1 in xs }} {{ 5 not in xs }} {{ 'x' in [] }} {{ 'z' not in 'abc' }} {{ 2 in (1, 2) }} {{ 1.0 in xs }}")
case("in_undefined", "{{ 'a' in nope }}")
case("in_none", "{{ 'a' in nil }}")
case("in_int_error", "{{ 1 in 5 }}")
case("in_str_int_error", "{{ 1 in 'abc' }}")

# --- conditional expression -------------------------------------------------------------
case("ternary", "{{ 'y' if t else 'n' }} {{ 'y' if nil else 'n' }} {{ 'a' if false else 'b' if true else 'c' }}")
case("ternary_no_else", "[{{ 'y' if false }}][{{ ('y' if false) is defined }}][{{ 'y' if true }}]")
case("ternary_in_filter_arg", "{{ xs | join(',' if t else ';') }}")

# --- attribute / item access ---------------------------------------------------------------
case("access_attr_item", "{{ d.a }} {{ d['b'] }} {{ users[0].name }} {{ users[1]['age'] }} {{ messages[-1].content }} {{ xs.0 }} {{ users.1.name }}")
case("access_missing", "[{{ d.zz }}][{{ d['zz'] }}][{{ xs[10] }}][{{ nil.x }}][{{ s.nope }}][{{ 5.x }}]")
case("access_missing_chain_error", "{{ d.zz.yy }}")
case("access_undefined_attr_error", "{{ nope.x }}")
case("access_undefined_item_error", "{{ nope['x'] }}")
case("access_index_error_chain", "{{ xs[10].x }}")
case("access_method_wins", "{{ {'items': 1}.items()|list }} {{ {'items': 1}['items'] }} {{ {'keys': 5}.keys()|list }}")
case("access_str_index", "{{ s[0] }} {{ s[-1] }} {{ uni[1] }} {{ uni[-1] }} [{{ s[100] }}]")
case("access_float_index", "[{{ xs[1.0] }}][{{ xs['1'] }}][{{ d[1] }}]")
case("access_bool_index", "{{ xs[true] }} {{ xs[false] }}")
case("slicing", "{{ s[::-1] }}|{{ xs[1:-1] }}|{{ xs[::2] }}|{{ s[1:4] }}|{{ s[:3] }}|{{ s[3:] }}|{{ xs[-2:] }}|{{ xs[:-5] }}|{{ s[5:1:-1] }}|{{ xs[::-2] }}|{{ uni[::-1] }}|{{ uni[1:4] }}")
case("slicing_more", "{{ xs[10:] }}|{{ xs[-10:] }}|{{ s[::3] }}|{{ s[-3::-2] }}|{{ (1, 2, 3)[1:] }}|{{ xs[none:2] }}|{{ xs[1:none] }}")
case("slice_step_zero", "{{ xs[::0] }}")
case("slice_on_dict_error", "{{ d[1:2] }}")
case("loop_attr_via_item", "{% for x in xs %}{{ loop['index'] }}{% endfor %}")

# --- whitespace control ------------------------------------------------------------------------
case("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter\n")
case("ws_lstrip_blocks", "start\n    {% if true %}\n    indented\n    {% endif %}\nend")
case("ws_lstrip_not_var", "a\n    {{ 'x' }}\n    {% set y = 1 %}\nb")
case("ws_minus", "a   {%- if true -%}   b   {%- endif -%}   c")
case("ws_minus_var", "a \n {{- 'x' -}} \n b")
case("ws_minus_newlines", "x\n\n  {%- set a = 1 -%}\n\n  y")
case("ws_plus_lstrip", "a\n    {%+ if true %}x{% endif %}\nb")
case("ws_plus_trim", "{% if true +%}\nx\n{% endif +%}\ny")
case("ws_comment", "a\n  {# comment #}\nb {#- c -#} c\n{# multi\nline #}\nd")
case("ws_comment_minus", "a   {#- x #}b{# y -#}   c")
case("ws_trailing_newline", "abc\n")
case("ws_trailing_two_newlines", "abc\n\n")
case("ws_crlf", "a\r\nb\r\n{% if true %}\r\nc\r\n{% endif %}\r\n")
case("ws_cr_only", "a\rb{{ 'x' }}\r")
case("ws_tabs_lstrip", "\t\t{% if true %}x{% endif %}\n")
case("ws_lstrip_midline", "text {% if true %}x{% endif %}")
case("ws_first_line_lstrip", "   {% set a = 1 %}z")
case("ws_block_end_newline_only_one", "{% if true %}\n\nx{% endif %}")
case("ws_var_no_trim", "{{ 'a' }}\nb")
case("ws_nested_indent", "{% for m in messages %}\n    {% if m.role == 'user' %}\n        U:{{ m.content }}\n    {% else %}\n        O\n    {% endif %}\n{% endfor %}\n")
case("ws_unicode_space_minus", "a\u3000 {{- 'b' }}")
case("ws_raw", "{% raw %}{{ not rendered }}{% if %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}  |")
case("ws_raw_newline", "{% raw %}\nA\n{% endraw %}\nB")
case("ws_lstrip_raw", "x\n  {% raw %}r{% endraw %}\n")
case("ws_minus_strip_after_var", "{{ 'a' -}}\n\n   {{ 'b' }}")

# --- statements: if / for / set -----------------------------------------------------------------
case("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}other{% endif %},{% endfor %}")
case("if_nested", "{% if t %}{% if nil %}a{% elif n > 3 %}b{% endif %}{% endif %}")
case("if_tuple_test", "{% if 1, 2 %}tuple{% endif %}")
case("for_basic", "{% for x in xs %}{{ x }},{% endfor %}")
case("for_dict", "{% for k in d %}{{ k }}{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}")
case("for_string", "{% for c in 'héllo' %}{{ c }}.{% endfor %}")
case("for_else", "{% for x in empty %}{{ x }}{% else %}none{% endfor %}|{% for x in xs %}{{ x }}{% else %}none{% endfor %}")
case("for_undefined", "[{% for x in nope %}{{ x }}{% else %}E{% endfor %}]")
case("for_none_error", "{% for x in nil %}{{ x }}{% endfor %}")
case("for_int_error", "{% for x in 5 %}{{ x }}{% endfor %}")
case("for_filter", "{% for x in ys if x > 1 %}{{ x }}{{ loop.index }}/{{ loop.length }} {% endfor %}")
case("for_filter_else", "{% for x in ys if x > 10 %}{{ x }}{% else %}none{% endfor %}")
case("for_unpack", "{% for a, b in [[1, 2], (3, 4), 'xy'] %}{{ a }}{{ b }};{% endfor %}")
case("for_unpack_error", "{% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %}")
case("for_unpack_short_error", "{% for a, b in [[1]] %}{{ a }}{% endfor %}")
case("for_nested_loop_vars", "{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}")
case("loop_vars", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}")
case("loop_prev_next", "{% for x in xs %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{{ loop.previtem is defined }}{% endfor %}")
case("loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}")
case("loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }},{% endfor %}")
case("loop_depth", "{% for x in xs %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}")
case("loop_outside_undefined", "[{{ loop }}][{{ loop is defined }}]")
case("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
case("loop_break_else", "{% for x in xs %}{% break %}{% else %}else{% endfor %}done")
case("loop_break_nested", "{% for x in xs %}{% for y in xs %}{% if y == 2 %}{% break %}{% endif %}{{ x }}{{ y }} {% endfor %}{% endfor %}")
case("loop_recursive", "{% for item in tree recursive %}<{{ item.name }}{% if item.children %}:{{ loop(item.children) }}{% endif %}{{ loop.depth }}>{% endfor %}",
     {"tree": [{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}, {"name": "d"}]}, {"name": "e"}]})
case("set_basic", "{% set x = 5 %}{% set y = x * 2 %}{{ x }} {{ y }}")
case("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, e = [3, 4] %}{{ c }}{{ e }}")
case("set_tuple_value", "{% set t = 1, 2 %}{{ t }}")
case("set_block", "{% set body %}Hello {{ s }}!{% endset %}[{{ body }}]{{ body|length }}")
case("set_block_filter", "{% set body | upper | trim %}  abc {{ n }}  {% endset %}[{{ body }}]")
case("set_in_for_scope", "{% set x = 1 %}{% for i in xs %}{{ x }}{% set x = i * 10 %}{{ x }},{% endfor %}{{ x }}")
case("set_in_if_scope", "{% if true %}{% set y = 3 %}{% endif %}{{ y }}")
case("set_in_for_if_scope", "{% set x = 1 %}{% for i in xs %}{% if i == 2 %}{% set x = 7 %}{% endif %}{{ x }}{% endfor %}{{ x }}")
case("set_loop_var_shadow", "{% for i in xs %}{{ i }}{% for j in xs %}{% set i = j %}{% endfor %}{{ i }}{% endfor %}")
case("set_for_leak", "{% for i in xs %}{% set y = i %}{% endfor %}[{{ y }}][{{ i }}]")
case("set_overrides_context", "{% set s = 'changed' %}{{ s }}")
case("namespace_basic", "{% set ns = namespace(count=0, last=none) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% set ns.last = x %}{% endfor %}{{ ns.count }} {{ ns.last }}")
case("namespace_new_attr", "{% set ns = namespace() %}{% set ns.a = 1 %}{{ ns.a }}[{{ ns.b }}]{{ ns['a'] }}")
case("namespace_dict_arg", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}")
case("namespace_repr", "{% set ns = namespace(a=1) %}{{ ns }}")
case("namespace_underscore_error", "{% set ns = namespace(_x=1) %}")
case("namespace_set_underscore_error", "{% set ns = namespace() %}{% set ns._x = 1 %}")
case("namespace_set_non_ns_error", "{% set d2 = {} %}{% set d2.x = 1 %}")
case("namespace_set_undefined_error", "{% set zz.x = 1 %}")
case("namespace_in_macro", "{% set ns = namespace(v=1) %}{% macro bump() %}{% set ns.v = ns.v + 1 %}{% endmacro %}{{ bump() }}{{ bump() }}{{ ns.v }}")
case("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]")
case("with_scope", "{% set x = 1 %}{% with %}{% set x = 2 %}{{ x }}{% endwith %}{{ x }}")
case("filter_block", "{% filter upper %}abc {{ s }}{% endfilter %}")
case("filter_block_args", "{% filter replace('a', 'b') | trim %}  banana  {% endfilter %}")
case("print_stmt", "{% print 'a', 1 %}")
case("generation_block", "A{% generation %}gen {{ n }}{% endgeneration %}B")
case("block_tag", "{% block content %}inside{% endblock %}|{% block x %}y{% endblock x %}")
case("comment_only", "{# nothing #}")

# --- macros ----------------------------------------------------------------------------------------
case("macro_basic", "{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('ann') }} {{ greet('bob', 'Yo') }} {{ greet(greeting='Hey', name='cy') }}")
case("macro_varargs_kwargs", "{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, 2, 3, 4) }}|{{ m(1, c=4) }}")
case("macro_too_many_args", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}")
case("macro_unknown_kwarg", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, z=2) }}")
case("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}][{{ b }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}")
case("macro_default_expr", "{% macro m(a, b=a * 2, c=xs|length) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(3) }}")
case("macro_late_global", "{% macro m() %}{{ y }}{% endmacro %}{% set y = 5 %}{{ m() }}")
case("macro_sees_current", "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}")
case("macro_local_set", "{% set x = 1 %}{% macro m() %}{{ x }}{% set x = 9 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}")
case("macro_recursion", "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}")
case("macro_returns_string", "{% macro m() %}42{% endmacro %}{{ m() ~ 'x' }} {{ m()|int + 1 }} {{ m() is string }}")
case("macro_repr", "{% macro m() %}x{% endmacro %}{{ m }} {{ m is callable }}")
case("macro_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner {{ n }}{% endcall %}")
case("macro_caller_args", "{% macro each(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}{% call(x, i) each(xs) %}[{{ i }}:{{ x }}]{% endcall %}")
case("macro_in_loop", "{% for x in xs %}{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% endfor %}")
case("macro_filter_map", "{% macro dbl(v) %}{{ v * 2 }}{% endmacro %}{{ xs|map('string')|join }}")
case("macro_name_args", "{% macro m(a, b) %}{% endmacro %}{{ m.name }} {{ m.arguments }}")
case("macro_infinite_recursion", "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", loose_error=True)

# --- builtin globals -----------------------------------------------------------------------------------
case("range_forms", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }} {{ range(3)|length }} {{ range(5)[2] }}")
case("range_print", "{{ range(3) }} {{ range(1, 7, 2) }}")
case("range_too_big", "{% for i in range(10**9) %}{% endfor %}")
case("range_step_zero", "{{ range(1, 2, 0) }}")
case("range_float_error", "{{ range(1.5) }}")
case("range_at_limit", "{{ range(100000)|length }}")
case("dict_global", "{{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ dict({'k': 'v'}, z=0) }} {{ dict() }}")
case("raise_exception", "{% if true %}{{ raise_exception('Conversation roles must alternate!') }}{% endif %}")
case("raise_exception_line", "line1\nline2\n{{ raise_exception('boom on line 3') }}")
case("joiner_cycler", "{% set j = joiner(', ') %}{% for x in xs %}{{ j() }}{{ x }}{% endfor %}|{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}")
case("undefined_call_error", "{{ nope() }}")
case("call_non_callable_error", "{{ n() }}")
case("unknown_filter_error", "{{ xs|frobnicate }}")
case("unknown_test_error", "{{ xs is frobnicate }}")

# --- filters -------------------------------------------------------------------------------------------------
case("f_trim", "[{{ '  a b \\n'|trim }}][{{ 'xxaxx'|trim('x') }}][{{ '\\u3000a\\u00a0'|trim }}][{{ nope|trim }}][{{ 5|trim }}]")
case("f_tojson", "{{ messages[2]|tojson }}|{{ 'é\"\\n\\u0001'|tojson }}|{{ [1.0, 2.5, none, true]|tojson }}|{{ {'b': 1, 'a': [1, 2]}|tojson }}")
case("f_tojson_indent", "{{ tool|tojson(indent=2) }}\n{{ {'a': [], 'b': {}, 'c': [1]}|tojson(4) }}")
case("f_tojson_kwargs", "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1, {'a': 2}]|tojson(separators=(',', ':')) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ {'a': 1}|tojson(indent='--') }}")
case("f_tojson_special", "{{ (1, 2)|tojson }} {{ 1e100|tojson }} {{ (1.5e300 * 1e300)|tojson }} {{ {1: 2, none: 3, true: 4}|tojson }} {{ ''|tojson }} {{ '\\u2028/'|tojson }}")
case("f_tojson_undefined_error", "{{ nope|tojson }}")
case("f_tojson_namespace_error", "{{ namespace(a=1)|tojson }}")
case("f_tojson_tool", "{{ tool|tojson }}")
case("f_length", "{{ xs|length }} {{ s|length }} {{ d|length }} {{ uni|length }} {{ nope|length }} {{ xs|count }} {{ ''|length }}")
case("f_length_int_error", "{{ 5|length }}")
case("f_length_generator_error", "{{ xs|select('odd')|length }}")
case("f_items", "{{ d|items|list }} {{ nope|items|list }}")
case("f_items_error", "{{ xs|items|list }}")
case("f_join", "{{ xs|join }} {{ xs|join(', ') }} {{ users|join('/', attribute='name') }} {{ 'abc'|join('-') }} {{ [1, none, 'x']|join(',') }} [{{ nope|join(',') }}]")
case("f_selectattr", "{{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|selectattr('age', 'equalto', 31)|map(attribute='name')|list }} {{ users|rejectattr('admin')|map(attribute='name')|join(',') }}")
case("f_selectattr_tests", "{{ messages|selectattr('role', '==', 'user')|list|length }} {{ users|selectattr('tags', 'defined')|map(attribute='name')|list }} {{ users|selectattr('tags', 'undefined')|map(attribute='name')|list }} {{ users|selectattr('age', 'gt', 26)|map(attribute='name')|list }} {{ users|selectattr('name', 'in', ['ann', 'cy'])|map(attribute='name')|list }}")
case("f_selectattr_eq", "{{ messages|selectattr('role', 'eq', 'system')|list|count }} {{ messages|rejectattr('role', 'ne', 'user')|map(attribute='content')|list }}")
case("f_select_reject", "{{ range(10)|select('odd')|list }} {{ range(10)|reject('even')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ range(10)|select('divisibleby', 3)|list }} {{ ys|select('lessthan', 3)|list }}")
case("f_generator_truthy", "{{ 'yes' if empty|select else 'no' }} {{ 'yes' if empty|select|list else 'no' }} {{ empty|select|list }} {{ xs|select('odd')|first }}")
case("f_generator_consumed", "{% set g = xs|select %}{{ g|list }}{{ g|list }}")
case("f_map", "{{ users|map(attribute='name')|list }} {{ words|map('upper')|list }} {{ xs|map('string')|list }} {{ users|map(attribute='tags', default='-')|list }} {{ [[1, 2], [3]]|map('length')|list }} {{ [' a ', 'b ']|map('trim')|list }} {{ ['a', 'b']|map('replace', 'a', 'z')|list }}")
case("f_map_nested_attr", "{{ messages|selectattr('tool_calls', 'defined')|map(attribute='tool_calls.0.function.name')|list }}")
case("f_default", "{{ nope|default('dflt') }} {{ nope|d('d2') }} {{ ''|default('e') }} {{ ''|default('e', true) }} {{ nil|default('n') }} {{ 0|default(5, boolean=true) }} {{ s|default('x') }} [{{ nope|default }}]")
case("f_string", "{{ 5|string }} {{ none|string }} {{ xs|string }} {{ (5|string) ~ 1 }} [{{ nope|string }}] {{ 1.0|string }}")
case("f_case", "{{ 'hELLo wORLD'|upper }} {{ 'HeLLo'|lower }} {{ 'hELLO world'|capitalize }} {{ 'hello big-world (x) [y] {z} <w>'|title }} {{ \"they're bill's\"|title }} {{ uni|upper }}")
case("f_replace", "{{ 'aaaa'|replace('a', 'b') }} {{ 'aaaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 'hello'|replace('l', '') }} {{ 123|replace('2', 'x') }}")
case("f_first_last", "{{ xs|first }} {{ xs|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ empty|first }}][{{ empty|last }}] {{ d|first }} {{ (xs|first) is defined }}")
case("f_list", "{{ 'abc'|list }} {{ d|list }} {{ (1, 2)|list }} {{ nope|list }} {{ range(2)|list }}")
case("f_int_float", "{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.99|int }} {{ -3.99|int }} {{ '0x1A'|int(0, 16) }} {{ '101'|int(base=2) }} {{ true|int }} {{ nil|int }}")
case("f_float", "{{ '3.5'|float }} {{ 3|float }} {{ 'x'|float }} {{ 'x'|float(1.5) }} {{ '1e3'|float }} {{ ' 2 '|float }} {{ 'inf'|float }} {{ '-nan'|float }}")
case("f_abs_round", "{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1, 'floor') }} {{ 42.51|round(1, 'ceil') }} {{ 7|round }} {{ -0.5|round }} {{ 1234|round(-2) }}")
case("f_reverse", "{{ 'abc'|reverse }} {{ xs|reverse|list }} {{ (xs|reverse|first) }} {{ d|reverse|list }}")
case("f_sort", "{{ ys|sort }} {{ ys|sort(reverse=true) }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ users|sort(attribute='age')|map(attribute='name')|list }} {{ users|sort(attribute='age,name', reverse=true)|map(attribute='name')|list }}")
case("f_sort_mixed_error", "{{ [1, 'a']|sort }}")
case("f_unique", "{{ ys|unique|list }} {{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ users|unique(attribute='age')|map(attribute='name')|list }}")
case("f_batch_slice", "{{ range(7)|batch(3)|list }} {{ range(7)|batch(3, 'x')|list }} {{ range(7)|slice(3)|list }}")
case("f_safe_escape", "{{ '<a href=\"x\">&\\'</a>'|safe }} {{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ 5|e }}")
case("f_indent", "{{ ml|indent }}|{{ ml|indent(2, true) }}|{{ ml|indent(width='> ', first=true, blank=true) }}|{{ 'a\\nb'|indent(1) }}")
case("f_wordcount_center", "{{ 'one two  three-four'|wordcount }} [{{ 'ab'|center(6) }}]")
case("f_dictsort", "{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort(true) }} {{ d|dictsort(by='value') }}")
case("f_min_max_sum", "{{ ys|min }} {{ ys|max }} {{ words|min }} {{ words|max(case_sensitive=true) }} {{ ys|sum }} {{ users|sum(attribute='age') }} {{ [0.5, 1]|sum(start=10) }} [{{ empty|min }}] {{ users|max(attribute='age')|attr('name') if false else (users|max(attribute='age')).name }}")
case("f_attr", "{{ users[0]|attr('name') }} [{{ d|attr('zz') }}]")
case("f_format", "{{ '%s and %s'|format('a', 'b') }} {{ '%(x)s!'|format(x=1) }}")
case("f_truncate", "{{ 'hello world foo bar'|truncate(9) }} {{ 'hello world foo bar'|truncate(9, true) }} {{ 'short'|truncate(10) }}")
case("f_chain", "{{ messages|map(attribute='role')|unique|list|join(', ')|upper }}")
case("f_filter_on_expr", "{{ -1|abs }} {{ (1 - 3)|abs }} {{ 'a' ~ 'b'|upper }} {{ 1 + 2|string if false else 'x' }}")
case("f_groupby", "{% for g in users|groupby('age') %}{{ g.grouper }}:{{ g.list|map(attribute='name')|join(',') }};{% endfor %}")

# --- tests ---------------------------------------------------------------------------------------------------------
case("t_defined", "{{ s is defined }} {{ nope is defined }} {{ nope is undefined }} {{ nil is defined }} {{ d.a is defined }} {{ d.zz is defined }} {{ nope is not defined }}")
case("t_types", "{% for v in [none, true, 1, 1.5, 'a', [1], {'a': 1}, (1,)] %}{{ v is none }}{{ v is boolean }}{{ v is integer }}{{ v is float }}{{ v is number }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is callable }};{% endfor %}")
case("t_types_undefined", "{{ nope is none }}{{ nope is string }}{{ nope is iterable }}{{ nope is sequence }}{{ nope is mapping }}{{ nope is number }}")
case("t_true_false", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is false }}")
case("t_compare", "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 1 is ne 2 }} {{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 2 is lt 3 }} {{ 2 is le 1 }} {{ 2 is greaterthan 1 }} {{ 2 is lessthan 1 }} {{ 'a' is in 'abc' }} {{ 2 is in xs }}")
case("t_case", "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '12' is upper }} {{ 'A1' is upper }}")
case("t_numbers", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(3) }} {{ 3.0 is odd }}")
case("t_sameas", "{{ none is sameas none }} {{ true is sameas true }} {{ 1 is sameas true }} {{ false is sameas false }}")
case("t_filter_test", "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ 'nope' is test }}")
case("t_not_precedence", "{{ not s is defined }} {{ not nope is defined }} {{ s is not string }} {{ 1 is number and 2 is number }}")
case("t_escaped", "{{ 'a' is escaped }} {{ ('a'|safe) is escaped }}")
case("t_chained_is_error", "{{ 1 is number is number }}")

# --- string methods -------------------------------------------------------------------------------------------------
case("m_startswith", "{{ s.startswith('He') }} {{ s.startswith('he') }} {{ s.endswith('ld') }} {{ s.startswith(('x', 'H')) }} {{ s.endswith('o', 0, 5) }} {{ s.startswith('') }}")
case("m_split", "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ '  x  y '.split() }} {{ ''.split() }} {{ ''.split(',') }} {{ 'a<sep>b'.split('<sep>') }} {{ 'a b c'.split(none, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'a\\tb\\nc'.split() }}")
case("m_split_empty_sep_error", "{{ 'abc'.split('') }}")
case("m_strip", "[{{ '  a  '.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '  a  '.lstrip() }}][{{ '  a  '.rstrip() }}][{{ 'abcba'.strip('ab') }}][{{ '\\n\\t a \\n'.strip() }}][{{ 'a\\n'.rstrip('\\n') }}][{{ 'xya'.lstrip('yx') }}]")
case("m_replace", "{{ 'aaa'.replace('a', 'bb') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'abc'.replace('', '.') }} {{ 'a-b'.replace('-', '') }}")
case("m_case", "{{ 'aBc dEf'.upper() }} {{ 'aBc'.lower() }} {{ \"they're bill's x1y\".title() }} {{ 'hELLO wORLD'.capitalize() }} {{ 'AbC'.swapcase() }} {{ 'ǅ'.lower() }}")
case("m_find_count", "{{ s.find('o') }} {{ s.find('o', 5) }} {{ s.find('z') }} {{ s.rfind('o') }} {{ s.count('o') }} {{ s.count('') }} {{ s.index('W') }} {{ uni.find('w') }} {{ 'aaaa'.count('aa') }}")
case("m_index_error", "{{ s.index('z') }}")
case("m_join", "{{ ', '.join(['a', 'b']) }} {{ ''.join(words) }} {{ '-'.join('abc') }}")
case("m_join_int_error", "{{ ','.join([1, 2]) }}")
case("m_format", "{{ '{} and {}'.format('a', 1) }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{:>5}|{:<4}|{:^5}|{:.2f}|{:03d}'.format('a', 'b', 'c', 3.14159, 7) }} {{ '{{}}'.format() }}")
case("m_misc", "{{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ ' '.isspace() }} {{ 'a1'.isalnum() }} {{ 'Abc'.istitle() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }} {{ '42'.zfill(5) }} {{ '-4'.zfill(4) }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }} {{ 'ab'.center(5, '*') }}")
case("m_partition", "{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('x') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.py'.removesuffix('.py') }}")
case("m_splitlines", "{{ 'a\\nb\\r\\nc\\n'.splitlines() }} {{ 'a\\n\\nb'.splitlines(true) }} {{ ''.splitlines() }}")
case("m_strip_content_think", "{% set c = '<think>\\nreasoning\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}")
case("m_on_undefined_error", "{{ nope.upper() }}")
case("m_unknown_method_error", "{{ s.frobnicate() }}")

# --- dict / list methods --------------------------------------------------------------------------------------------
case("m_dict", "{{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.items()|length }} {{ 'a' in d.keys() }}")
case("m_dict_views_print", "{{ d.keys() }} {{ d.values() }} {{ d.items() }}")
case("m_dict_copy", "{% set d2 = d.copy() %}{{ d2 }}")
case("m_list", "{{ xs.index(2) }} {{ ys.count(1) }} {{ xs.copy() }}")
case("m_list_append_error", "{% set l = [] %}{{ l.append(1) }}")
case("m_list_pop_error", "{{ xs.pop() }}")
case("m_dict_update_error", "{{ d.update({'z': 1}) }}")
case("m_dict_pop_error", "{{ d.pop('a') }}")
case("m_dict_setdefault_error", "{{ d.setdefault('z', 1) }}")
case("m_list_sort_error", "{{ ys.sort() }}")
case("m_list_extend_error", "{% do xs.extend([1]) %}", loose_error=True)
case("m_private_attr", "[{{ s.__class__ }}][{{ d._private }}]")
case("m_private_attr_call_error", "{{ s.__len__() }}")

# --- errors with lines -----------------------------------------------------------------------------------------------
case("syntax_unclosed_if", "a\n{% if true %}\nb")
case("syntax_unknown_tag", "a\nb\n{% frob %}")
case("syntax_bad_expr", "{{ 1 + }}")
case("syntax_unclosed_var", "{{ 1 + 2")
case("syntax_unclosed_string", "{{ 'abc }}")
case("syntax_unclosed_comment", "{# abc")
case("syntax_endfor_mismatch", "{% for x in xs %}{% endif %}")
case("syntax_extra_paren", "{{ (1 + 2)) }}")
case("syntax_bad_paren", "{{ (1 + 2] }}")
case("syntax_empty_expr", "{{ }}")
case("syntax_break_outside_loop", "{% break %}", loose_error=True)
case("syntax_else_twice", "{% if a %}{% else %}{% else %}{% endif %}")
case("syntax_invalid_char", "{{ a $ b }}")
case("syntax_macro_default_order", "{% macro m(a=1, b) %}{% endmacro %}")
case("syntax_unclosed_raw", "{% raw %} abc")
case("syntax_assign_to_const", "{% set 1 = 2 %}")
case("runtime_error_line", "a\nb\n{{ xs[0] + 'x' }}")
case("undefined_in_macro_line", "{% macro m() %}\n\n{{ nope.x }}{% endmacro %}\n{{ m() }}")
case("recursion_deep_loop", "{% for item in tree recursive %}{{ loop(item) }}{% endfor %}", {"tree": [[[[]]]]})

# --- transformers-style templates --------------------------------------------------------------------------------------
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
case("tpl_chatml", CHATML, {"add_generation_prompt": True})
case("tpl_chatml_nogen", CHATML, {"add_generation_prompt": False})
case("tpl_alternate_check",
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{{ '[INST] ' + message['content'] + ' [/INST]' if message['role'] == 'user' else message['content'] }}{% endfor %}",
     {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
case("tpl_system_first",
     "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
     "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n"
     "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == 'user' %}\n"
     "        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
     "        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n"
     "    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n",
     {"bos_token": "<s>", "eos_token": "</s>",
      "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}]})
case("tpl_tools_json",
     "{%- if tools %}\n<tools>\n{%- for tool in tools %}\n{{ tool | tojson }}\n{%- endfor %}\n</tools>\n{%- endif %}\n"
     "{%- for message in messages %}\n{%- if message.tool_calls is defined %}\n{%- for tc in message.tool_calls %}\n"
     "<tool_call>{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}</tool_call>\n"
     "{%- endfor %}\n{%- endif %}\n{%- endfor %}",
     {"tools": [BASE["tool"]]})
case("tpl_ns_last_query",
     "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
     "{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n"
     "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
     "        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{{ ns.last_query_index }}")
case("tpl_content_parts",
     "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<img>{% endif %}{% endfor %}{% endif %}|{% endfor %}",
     {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}, {"role": "assistant", "content": "a cat"}]})
case("tpl_strftime_absent", "{{ date_string | default('26 Jul 2024') }}")

# --- hostile -------------------------------------------------------------------------------------------------------------
case("hostile_deep_parens", "{{ " + "(" * 300 + "1" + ")" * 300 + " }}", loose_error=True)
case("hostile_deep_lists", "{{ " + "[" * 300 + "]" * 300 + " }}", loose_error=True)
case("hostile_deep_if", "{% if true %}" * 300 + "x" + "{% endif %}" * 300, loose_error=True)


# --- more semantics ---------------------------------------------------------------------------------------------------
case("loop_continue_else", "{% for x in xs %}{% continue %}{% else %}E{% endfor %}|{% for x in xs %}{% if x == 2 %}{% break %}{% endif %}{% else %}E{% endfor %}|{% for x in xs %}{% if x < 3 %}{% continue %}{% endif %}{% else %}E{% endfor %}")
case("loop_items_last", "{% for k, v in d.items() %}{{ k }}{{ v }}{{ ',' if not loop.last }}{% endfor %}")
case("loop_over_generator", "{% for m in messages|selectattr('role', 'equalto', 'user') %}{{ loop.index }}/{{ loop.length }}:{{ m.content }};{% endfor %}")
case("loop_over_reverse", "{% for m in messages|reverse %}{{ m.role[0] }}{{ loop.revindex }}{% endfor %}")
case("loop_slice_reverse", "{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %}|{% for x in range(10)[2:8:2] %}{{ x }}{% endfor %}")
case("loop_changed_multi", "{% for u in users %}{{ loop.changed(u.age, u.admin) }}{% endfor %}")
case("loop_cycle_nested", "{% for x in xs %}{% for y in xs %}{{ loop.cycle('a', 'b') }}{% endfor %}|{% endfor %}")
case("loop_unpack_int_error", "{% for a, b in xs %}{% endfor %}")
case("set_unpack_string", "{% set a, b = 'xy' %}{{ b }}{{ a }}")
case("set_top_level_increment", "{% set n = n + 1 %}{{ n }}")
case("set_in_macro_no_leak", "{% macro m() %}{% set leak = 1 %}{% endmacro %}{{ m() }}[{{ leak }}]")
case("ns_nested", "{% set ns = namespace(a=namespace(b=1)) %}{% set inner = ns.a %}{% set inner.b = 5 %}{{ ns.a.b }}")
case("ns_string_accumulate", "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.s }}")
case("ns_is_mapping", "{{ namespace(a=1) is mapping }} {{ namespace(a=1) is iterable }}")
case("ns_missing_chain_error", "{{ namespace(a=1).b.c }}")
case("dict_tuple_key", "{{ {(1, 2): 'a'} }} {{ {(1, 2): 'a'}[(1, 2)] }}")
case("macro_caller_defined", "{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}")
case("macro_caller_kwargs", "{% macro m(a) %}{{ a }}{{ caller(x=1) }}{{ kwargs }}{% endmacro %}{% call(x) m(1, k=2) %}<{{ x }}>{% endcall %}")
case("macro_call_without_caller_error", "{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}")
case("macro_kwarg_after_positional_error", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, a=2) }}")
case("macro_varargs_only", "{% macro m() %}{{ varargs|join(',') }}{% endmacro %}{{ m(1, 2, 3) }}")
case("filter_precedence_ternary", "{{ 'x' if true else 'y' | upper }}|{{ 'x' if false else 'y' | upper }}")
case("not_eq_precedence", "{{ not true == false }} {{ not 1 in [1] }} {{ not (1 in [1]) }}")
case("cond_expr_chain", "{{ 1 if 0 }}|{{ 'a' if nil else 'b' if nil else 'c' }}")
case("default_none", "{{ nil|default(none) is none }} {{ nil|default('a', true) }} {{ nope|default(none) is none }}")
case("int_edge", "{{ ''|int }} {{ '  12  '|int }} {{ '1_000'|int }} {{ '0b101'|int(base=0) }} {{ '-0x10'|int(base=16) }} {{ '1e3'|int }} {{ ' -7 '|int }} {{ 1e16|int }} {{ 'inf'|int }}")
case("float_edge", "{{ 3|float|string }} {{ '1_000.5'|float }} {{ '.5'|float }} {{ '5.'|float }} {{ '1e-7'|float }} {{ '0x10'|float }} {{ true|float }}")
case("float_format_more", "{{ 1e-7 }} {{ 1.5e-10 }} {{ 123456789.123 }} {{ 0.1 * 3 }} {{ 1e16 + 1 }} {{ 2.0 ** 60 }} {{ 1 / 7 }} {{ -1e-300 * 1e-300 }}")
case("arith_more", "{{ -7 // 2.0 }} {{ 5 % 3.0 }} {{ 2 ** 3.0 }} {{ 10 ** -2 }} {{ 1 < 2.5 }} {{ true < 2 }} {{ 'abc' * true }} {{ 3 // true }}")
case("arith_float_floordiv_zero", "{{ 1 // 0.0 }}")
case("arith_float_mod_zero", "{{ 1 % 0.0 }}")
case("divisibleby_zero_error", "{{ 5 is divisibleby 0 }}")
case("undefined_item_plus", "{{ [1, 2][5] + 1 }}")
case("str_percent_more", "{{ '%s' % none }} {{ '%s|%s' % (1, [1]) }} {{ '%d%%' % 50 }} {{ '%.1f' % 2.25 }} {{ '%5s|%-5s|' % ('a', 'b') }} {{ '%(a)s-%(b)d' % {'a': 'x', 'b': 2} }} {{ '%i' % 3.9 }} {{ '%e' % 12345.678 }} {{ '%g' % 0.00001 }} {{ '%x' % 255 }}")
case("str_percent_not_enough_error", "{{ '%s %s' % ('a',) }}")
case("str_percent_too_many_error", "{{ '%s' % ('a', 'b') }}")
case("str_methods_more", "{{ 'a b'.split(' ') }} {{ 'a  b'.split(' ') }} {{ ' a b '.rsplit(none, 1) }} {{ 'abc'.replace('b', 'X', 0) }} {{ 'test'.upper().lower() }} {{ 'abc'.startswith(('z', 'a')) }} {{ 'a\\u00e9b'.find('b') }} {{ 'aXbXc'.rsplit('X') }} {{ 'a b c'.rsplit(' ', 1) }}")
case("str_format_more", "{{ '{:,}'.format(1234567) }} {{ '{:x} {:#x} {:o} {:b}'.format(255, 255, 8, 5) }} {{ '{:+d} {: d}'.format(5, 5) }} {{ '{:.3}'.format(3.14159) }} {{ '{:e}'.format(1234.5) }} {{ '{:%}'.format(0.25) }} {{ '{0[a]} {1.real}'.format({'a': 1}, 2) if false else '{0[a]}'.format({'a': 1}) }} {{ '{!r}'.format('x') }} {{ '{:*^9}'.format('mid') }} {{ '{:08.3f}'.format(-3.14159) }}")
case("dict_methods_more", "{{ d.get('a', 5) }} {{ d.get('zz') is none }} {{ d.keys()|length }} {{ d|join(',') }} {{ d.values()|sum }} {{ d.items()|map('first')|list }}")
case("list_more", "{{ [1, [2]] == [1, [2]] }} {{ (1, 2) in [(1, 2)] }} {{ [3, 1, 2]|sort|first }} {{ ['b', 'a']|sort(reverse=true)|join }} {{ xs|first is number }} {{ 'é'|length }} {{ 'hello'[1:3]|upper }}")
case("users_aggregates", "{{ users|map(attribute='age')|sum }} {{ users|map(attribute='age')|max }} {{ users|map(attribute='age')|min }} {{ users|selectattr('name', 'equalto', 'bob')|first }} {{ users|map(attribute='age')|unique|list }} {{ users|sum(attribute='age') / users|length }}")
case("messages_more", "{{ messages|length > 0 }} {{ messages|map(attribute='content')|map('length')|list }} {{ messages[-1]['content']|trim }} {{ messages[0]['role'] == 'system' and messages[0]['content'] }} {{ messages|selectattr('tool_calls')|list|length }}")
case("tojson_more", "{{ '😀'|tojson(ensure_ascii=true) }} {{ {'a': 'é'}|tojson(ensure_ascii=false) }} {{ none|tojson }} {{ true|tojson }} {{ 'a\\u007f\\u0080'|tojson }} {{ [1, 2]|tojson(indent=0) }} {{ 1e-7|tojson }} {{ [[], {}]|tojson(indent=2) }} {{ {'b': {'d': 1, 'c': 2}, 'a': 0}|tojson(sort_keys=true, indent=1) }}")
case("tojson_separators_indent", "{{ {'a': [1, 2]}|tojson(indent=2, separators=(', ', ' = ')) }}")
case("tojson_items_keys", "{{ tool.function.parameters.properties|items|list }} {{ tool.function.parameters|tojson(sort_keys=true) }}")
case("indent_more", "[{{ 'x'|indent(2) }}][{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}][{{ 'a\\r\\nb'|indent(1) }}][{{ ''|indent(3, true) }}]")
case("trim_unicode", "[{{ '\\u2003x\\u2003'|trim }}][{{ 'éxé'|trim('é') }}][{{ '  x\\n'|trim(' ') }}]")
case("ws_strip_loop_items", "{% for x in xs -%}\n  {{ x }}\n{%- endfor %}|{%- if t %}\n  Y\n{%- endif %}")
case("ws_comment_trim", "a\n{# c #}\nb\n  {#- c2 #}\nc")
case("ws_var_strip_space", "a {{- ' ' -}} b {{- '' }} c")
case("ws_raw_strip", "text   {%- raw %} r {% endraw -%}   more")
case("ws_string_with_braces", "{{ '{#' }}|{{ \"}}\" }}|{{ '{%' }}|{{ '%}' }}")
case("ws_dangling_braces", "a { b } {x} %} #} }}")
case("ws_lstrip_comment", "x\n   {# c #}\ny")
case("ws_endblock_then_text", "{% if true %}a{% endif %}   \n  b")
case("getattr_string_methods_via_item", "{{ 'ab'['upper']() }} {{ d['items']()|list }}")
case("call_kwargs_splat", "{{ dict(**{'a': 1}) }} {{ range(*[1, 4])|list }} {{ namespace(**d).b }}")
case("builtin_repr", "{{ range(0) }} {{ (xs|select)|list }} {{ loop is undefined }}")
case("none_attr_and_methods", "[{{ nil.x }}][{{ nil['x'] }}][{{ (5).x }}]")
case("string_iteration_join", "{{ 'abc'|join('-') }} {{ 'héllo'|list|length }} {{ 'a b'|wordcount }}")
case("compare_none_eq", "{{ nil == none }} {{ nil is none }} {{ nil != 0 }} {{ [] == [] }} {{ {} == {} }} {{ '' == nil }}")
case("elif_chain", "{% for v in range(5) %}{% if v == 0 %}z{% elif v == 1 %}o{% elif v == 2 %}t{% elif v == 3 %}h{% else %}e{% endif %}{% endfor %}")
case("big_loop_ok", "{% set ns = namespace(s=0) %}{% for i in range(20000) %}{% set ns.s = ns.s + i %}{% endfor %}{{ ns.s }}")


# --- found by differential testing against jinja2 (random templates) ---------------------------------------------------
case("fold_const_slice", "[{{ (2)[::-1] }}][{{ (true)[1:] }}][{{ ({})[::2] }}][{{ ((2)[::-1])|items|list }}][{{ [s, none] + ((2)[1:])|sort }}]")
case("fold_lazy_or", "[{{ (not ('') or nope < 1)[1:] }}][{{ (1 if 0 else (2)[1:]) }}]")
case("runtime_slice_of_int_error", "{% set k = 2 %}{{ k[1:] }}")
case("truncate_non_string", "[{{ nope|truncate(5) }}][{{ [1, 2]|truncate(5) }}]")
case("truncate_int_error", "{{ 7|truncate(5) }}")
case("test_extra_argument_error", "{{ t is boolean not in [s, ''] }}")
case("markup_repr", "{{ [('x'|safe), ('<'|e), 'y'] }}")
case("percent_list_and_undefined", "[{{ 'AbC' % [1, 2] }}][{{ '' % nope }}][{{ '%s|' % nope }}][{{ '%s' % [1] }}][{{ 'x' % {'a': 1} }}]")
case("percent_str_leftover_error", "{{ 'abc' % 'x' }}")
case("sort_undefined_keys", "{{ ('abc'|map(attribute='role')|list)|sort }}")
case("break_in_set_block", "{% for i in xs %}{% set b %}x{{ i }}{% break %}{% endset %}{{ b }}{% else %}E{% endfor %}[{{ b }}]")
case("continue_in_filter_block", "{% for i in xs %}{% filter upper %}a{{ i }}{% continue %}{% endfilter %}z{% else %}E{% endfor %}")
case("set_block_scope", "{% set a = 1 %}{% set b %}{% set a = 5 %}{{ a }}{% endset %}[{{ a }}{{ b }}]|{% filter upper %}{% set c = 5 %}{% endfilter %}[{{ c }}]")
case("indent_list_error", "{{ xs|indent }}")


def render(template, ctx):
    return _compile_jinja_template(template).render(**ctx)


def main():
    out = []
    seen = set()
    for name, template, ctx, loose in CASES:
        assert name not in seen, name
        seen.add(name)
        # A deep copy per case: jinja2's sandbox does not stop `xs|indent` from appending to
        # the list it is given, and later cases must not see that.
        context = copy.deepcopy(BASE)
        if ctx:
            context.update(copy.deepcopy(ctx))
        # Keep only the variables the template reads (the file stays small); a template
        # that does not parse keeps none.
        try:
            used = meta.find_undeclared_variables(_compile_jinja_template(template).environment.parse(template))
        except Exception:  # noqa: BLE001
            used = set()
        context = {k: v for k, v in context.items() if k in used}
        entry = {"name": name, "template": template, "context": context}
        try:
            entry["output"] = render(template, copy.deepcopy(context))
        except Exception as e:  # noqa: BLE001 - every exception is a golden error
            entry["error"] = f"{type(e).__name__}: {e}"
            if loose:
                entry["loose_error"] = True
        out.append(entry)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as fh:
        json.dump(out, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    n_err = sum(1 for e in out if "error" in e)
    print(f"wrote {OUT}: {len(out)} cases ({n_err} errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
