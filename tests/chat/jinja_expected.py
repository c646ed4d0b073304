#!/usr/bin/env python3
"""Makes tests/chat/jinja_cases.h, the table tests/chat/jinja_test.c checks kite's Jinja interpreter against.

Every case is (name, template, variables[, expected error substring]). Each template is rendered here by
python3's jinja2 (3.1.6) in the environment transformers' apply_chat_template uses:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]), transformers'
tojson (json.dumps(ensure_ascii=False, ...)), raise_exception and strftime_now. What jinja2 prints becomes the
expected output; a TemplateSyntaxError/TemplateAssertionError becomes an expected KITE_ERROR_INVALID_TEMPLATE and
any other exception an expected KITE_ERROR_INVALID_INPUT (with the substring kite's message must contain, when
the case gives one).
The variables go through json.dumps/json.loads so both sides see the same JSON document.

The Qwen3 chat template (tests/data/chat/templates/qwen3.jinja) is rendered for a few conversations the same way.

Run from the repository root:  python3 tests/chat/jinja_expected.py  (rewrites tests/chat/jinja_cases.h)
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_environment():
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"}]
D = {"a": 1, "b": [1, 2, 3], "s": "Hello World", "n": None, "t": True, "f": 1.5, "e": "", "z": 0,
     "d": {"x": 1, "y": "two"}, "u8": "h\u00e9llo \u4e16\u754c", "msgs": MSGS}

CASES = [
    # ---- text, whitespace control, trim_blocks / lstrip_blocks ----
    ("text", "hello\nworld", {}),
    ("trailing_newline_dropped", "hello\n", {}),
    ("only_one_trailing_newline_dropped", "hello\n\n", {}),
    ("crlf_normalized", "a\r\nb\rc", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "  {% if true %}\n  x\n  {% endif %}\ny", {}),
    ("lstrip_not_for_variables", "  {{ 'v' }}\n", {}),
    ("lstrip_tabs", "\t \t{% if true %}x{% endif %}", {}),
    ("lstrip_after_text_on_line", "a {% if true %}x{% endif %}", {}),
    ("lstrip_after_tag_same_line", "{{ 1 }}  {% if true %}x{% endif %}", {}),
    ("lstrip_after_trimmed_line", "{% if true %}\n  {% if true %}x{% endif %}{% endif %}", {}),
    ("dash_strips_before", "a  \n  {%- if true %}b{% endif %}", {}),
    ("dash_strips_after", "{% if true -%}  \n\n  b{% endif %}", {}),
    ("dash_variables", "a  {{- 'b' -}}  \n c", {}),
    ("plus_keeps_lstrip", "  {%+ if true %}x{% endif %}", {}),
    ("plus_keeps_trim", "{% if true +%}\nx{% endif %}", {}),
    ("comment", "a{# hidden #}b", {}),
    ("comment_trim_and_lstrip", "a\n  {# c #}\nb", {}),
    ("nul_bytes_are_text", "a\x00b{# \x00 #}c{% raw %}\x00{% endraw %}{{ '\x00'|length }}", {}),
    ("comment_dash", "a   {#- c -#}   b", {}),
    ("raw", "{% raw %}{{ not parsed }}{% if %}{% endraw %}", {}),
    ("raw_whitespace", "x\n  {% raw %}\n  {{ a }}\n  {% endraw %}\ny", {}),
    ("raw_dash", "a  {%- raw -%}  b  {%- endraw -%}  c", {}),
    ("block_end_newline_only_once", "{% if true %}\n\nx{% endif %}", {}),
    ("nested_blocks_indented",
     "{% for i in b %}\n    {% if i > 1 %}\n        {{ i }}\n    {% endif %}\n{% endfor %}\n", D),
    ("dash_everywhere", "{%- for i in b -%}\n  {{- i -}}\n{%- endfor -%}", D),
    # ---- literals and printing ----
    ("print_int", "{{ 42 }} {{ -7 }} {{ 1_000 }} {{ 0x1f }} {{ 0o17 }} {{ 0b101 }}", {}),
    ("print_float", "{{ 1.0 }} {{ 0.1 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 2.50 }} {{ 1e3 }}", {}),
    ("print_constants", "{{ true }} {{ True }} {{ false }} {{ none }} {{ None }}", {}),
    ("print_strings", "{{ 'single' }} {{ \"double\" }} {{ 'a' 'b' }}", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\u00e9\\x41\\101' }}", {}),
    ("unknown_escape_kept", "{{ 'a\\qb' }}", {}),
    ("print_list_repr", "{{ [1, 'a', none, true, 1.5, [2]] }}", {}),
    ("print_dict_repr", "{{ {'a': 1, 'b': 'x', 3: none} }}", {}),
    ("print_tuple_repr", "{{ (1, 2) }} {{ (1,) }} {{ () }}", {}),
    ("print_string_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', '\\x01'] }}", {}),
    ("print_string_repr_unicode", "{{ [u8, '\\u00a0', '\\u200b'] }}", D),
    ("print_variables", "{{ a }} {{ s }} {{ n }} {{ t }} {{ f }} {{ b }} {{ d }}", D),
    ("print_undefined", "[{{ missing }}]", {}),
    ("print_undefined_in_list", "{{ [missing, d.q] }} {{ ['ab', 'cd']|map(attribute='role')|list }}", D),
    ("print_tuple_output", "{{ 1, 'a' }}", {}),
    ("json_int_float_kept", "{{ i }} {{ x }} {{ i is integer }} {{ x is float }}", {"i": 3, "x": 3.0}),
    ("print_namespace", "{% set ns = namespace(a=1, b='x') %}{{ ns }}", {}),
    ("print_inf", "{{ 1e400 }} {{ -1e400 }}", {}),
    # ---- operators ----
    ("arithmetic", "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}", {}),
    ("arithmetic_python_floor", "{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }}", {}),
    ("arithmetic_mixed", "{{ 1 + 1.5 }} {{ 4 / 2 }} {{ 2 ** -1 }} {{ true + 1 }} {{ 2 * 1.5 }}", {}),
    ("string_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 2 * 'x' }} {{ 'a' ~ 1 ~ none ~ missing ~ 1.5 }}", {}),
    ("list_ops", "{{ [1] + [2, 3] }} {{ [0] * 3 }} {{ (1,) + (2,) }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }}", {}),
    ("precedence_concat", "{{ (1 + 2) ~ 3 * 2 }} {{ 'a' ~ 'b' == 'ab' }} {{ 'x' ~ 2 is string }}", {}),
    ("precedence_concat_binds_tighter_than_plus", "{{ 1 + 2 ~ 3 }}", {}, "unsupported operand"),
    ("unary", "{{ -a }} {{ +a }} {{ -(-a) }} {{ - f }} {{ not a }} {{ not not a }}", D),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} "
     "{{ [1, 2] < [1, 3] }} {{ 'B' < 'a' }}", {}),
    ("chained_comparison", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 == 1 }}", {}),
    ("equality_types", "{{ 1 == '1' }} {{ none == none }} {{ true == 1 }} {{ [1, 'a'] == [1, 'a'] }} "
     "{{ {'a': 1} == {'a': 1} }} {{ (1, 2) == [1, 2] }} {{ missing == missing }} {{ missing == none }}", {}),
    ("in_operator", "{{ 'ell' in s }} {{ 2 in b }} {{ 'x' in d }} {{ 'q' in d }} {{ 5 not in b }} "
     "{{ 1 in missing }} {{ '' in 'abc' }}", D),
    ("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or none }} {{ e or 'empty' }} "
     "{{ 1 and 0 }}", D),
    ("not_binding", "{{ not 1 == 2 }} {{ not a is defined }} {{ not missing }}", D),
    ("conditional_expr", "{{ 'y' if t else 'n' }} {{ 'y' if z else 'n' }} [{{ 'y' if z }}] "
     "{{ 'a' if false else 'b' if true else 'c' }}", D),
    ("conditional_missing_else_defined", "{{ ('x' if false) is defined }}", {}),
    ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0, missing] %}"
     "{{ 'T' if v else 'F' }}{% endfor %}", {}),
    ("truthiness_dict", "{{ 'T' if d else 'F' }}{{ 'T' if {} else 'F' }}", D),
    # ---- attributes, items, slices ----
    ("attribute_and_item", "{{ d.x }} {{ d['y'] }} {{ msgs[1].content }} {{ msgs[1]['role'] }}", D),
    ("attribute_missing_prints_empty", "[{{ d.q }}][{{ d['q'] }}][{{ n.x }}][{{ a.x }}]", D),
    ("negative_index", "{{ b[-1] }} {{ b[-3] }} {{ s[0] }} {{ s[-1] }} [{{ b[5] }}] [{{ b[-9] }}]", D),
    ("slices", "{{ b[1:] }} {{ b[:-1] }} {{ b[::-1] }} {{ b[::2] }} {{ b[5:] }} {{ b[-2:] }} {{ b[1:2] }}", D),
    ("string_slices", "{{ s[1:4] }} {{ s[::-1] }} {{ s[:-6] }} {{ u8[1:3] }} {{ u8[::-1] }}", D),
    ("dict_method_beats_key", "{{ dd.items()|list }} {{ dd['items'] }}", {"dd": {"items": 5, "k": 1}}),
    ("dict_key_named_like_attribute", "{{ dd.keys is defined }} {{ dd.get('k') }} {{ dd.other }}",
     {"dd": {"other": 2, "k": 1}}),
    ("dotted_number", "{{ b.0 }} {{ msgs.1.role }}", D),
    ("item_of_tuple", "{{ (1, 2, 3)[1] }}", {}),
    # ---- statements ----
    ("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %}"
     "{% endfor %}", {}),
    ("if_nested", "{% if a %}{% if t %}both{% endif %}{% else %}none{% endif %}", D),
    ("for_basic", "{% for i in b %}{{ i }},{% endfor %}", D),
    ("for_loop_vars", "{% for i in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
     "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
    ("for_prev_next", "{% for i in b %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}", D),
    ("for_cycle", "{% for i in b %}{{ loop.cycle('odd', 'even') }} {% endfor %}", D),
    ("for_else", "{% for i in [] %}x{% else %}empty{% endfor %}{% for i in [1] %}x{% else %}empty{% endfor %}", {}),
    ("for_unpack", "{% for a, b in [(1, 2), [3, 4]] %}{{ a }}-{{ b }} {% endfor %}", {}),
    ("for_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", D),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", D),
    ("for_string", "{% for c in 'h\u00e9!' %}[{{ c }}]{% endfor %}", {}),
    ("for_undefined", "{% for x in missing %}x{% else %}none{% endfor %}", {}),
    ("for_filter", "{% for i in range(10) if i is odd %}{{ i }}{{ '/' ~ loop.length if loop.last }} "
     "{% endfor %}", {}),
    ("for_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
     "{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("for_nested_loop", "{% for i in [1, 2] %}{% set outer = loop %}{% for j in [1, 2] %}"
     "{{ outer.index }}{{ loop.index }} {% endfor %}{% endfor %}", {}),
    ("for_range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}", {}),
    ("for_reversed_messages", "{% for m in msgs[::-1] %}{{ m.role }} {% endfor %}", D),
    ("set_basic", "{% set x = 5 %}{% set y = x * 2 %}{{ x }} {{ y }}", {}),
    ("set_tuple", "{% set x, y = 1, 2 %}{{ x }}{{ y }}", {}),
    ("set_in_loop_does_not_leak", "{% set x = 1 %}{% for i in b %}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}", D),
    ("set_in_loop_fresh_each_iteration",
     "{% set x = 1 %}{% for i in b %}{{ x }}{% set x = 5 %}{{ x }} {% endfor %}{{ x }}", D),
    ("set_in_if_leaks", "{% if true %}{% set x = 3 %}{% endif %}{{ x }}", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for i in b %}{% set ns.count = ns.count + i %}"
     "{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", D),
    ("namespace_new_attribute", "{% set ns = namespace() %}{% set ns.x = 'y' %}{{ ns.x }} [{{ ns.q }}]", {}),
    ("namespace_from_dict", "{% set ns = namespace(d, z=9) %}{{ ns.x }} {{ ns.z }}", D),
    ("block_set", "{% set body %}\n  a {{ s }}\n{% endset %}[{{ body }}]", D),
    ("block_set_filter", "{% set body | upper | trim %}  hi {{ a }}  {% endset %}[{{ body }}]", D),
    ("block_set_in_loop_scoped", "{% for i in [1] %}{% set v %}x{% endset %}{% endfor %}[{{ v }}]", {}),
    ("macro_basic", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
     "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}", {}),
    ("macro_missing_argument", "{% macro m(a, b) %}[{{ a }}|{{ b }}|{{ b is defined }}]{% endmacro %}{{ m(1) }}", {}),
    ("macro_sees_globals", "{% macro m() %}{{ s }}{% endmacro %}{{ m() }}", D),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}", {}),
    ("macro_default_uses_param", "{% macro m(a, b=a * 2) %}{{ a }} {{ b }}{% endmacro %}{{ m(3) }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}"
     "{% endmacro %}{{ fact(5) }}", {}),
    ("macro_set_is_local", "{% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}", {}),
    ("macro_output_whitespace", "{% macro m(x) %}\n  <{{ x }}>\n{% endmacro %}\n[{{ m(1) }}]", {}),
    ("macro_render_tool", "{%- macro render(t) -%}\n{{ t.name }}: {{ t.description }}\n{%- endmacro -%}\n"
     "{% for t in tools %}{{ render(t) }}\n{% endfor %}",
     {"tools": [{"name": "a", "description": "first"}, {"name": "b", "description": "second"}]}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
     "{% call wrap('b') %}bold {{ s }}{% endcall %}", D),
    ("call_block_with_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}"
     "{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", {}),
    ("block_set_and_filter_block_scopes", "{% set x = 1 %}{% filter upper %}{% set x = 2 %}{{ x }}{% endfilter %}{{ x }}"
     "{% set v %}{% set y = 3 %}{{ y }}{% endset %}{{ v }}[{{ y }}]", {}),
    ("macro_scoping", "{% macro m() %}{{ x }}{% endmacro %}{% set x = 5 %}{{ m() }}"
     "{% for i in [1, 2] %}{% macro k() %}{{ i }}{% endmacro %}{{ k() }}{% endfor %}"
     "{% macro l() %}{{ loop is defined }}{% endmacro %}{% for i in [1] %}{{ l() }}{% endfor %}", {}),
    ("loop_variable_scoping", "{% set i = 9 %}{% for i in [1, 2] %}{% for i in [7] %}{{ i }}{% endfor %}{{ i }}"
     "{% endfor %}{{ i }}{% for j in [1] %}{% endfor %}[{{ j }}]", {}),
    ("call_block_sees_its_scope", "{% set x = 'outer' %}{% macro m() %}{{ caller() }}{% endmacro %}"
     "{% for x in ['loop'] %}{% call m() %}{{ x }}{% endcall %}{% endfor %}", {}),
    ("filter_block", "{% filter upper %}hello {{ s }}{% endfilter %}", D),
    ("filter_block_chain", "{% filter trim | replace('a', 'o') %}  banana  {% endfilter %}", {}),
    # ---- filters ----
    ("filter_tojson", "{{ d|tojson }} {{ b|tojson }} {{ s|tojson }} {{ n|tojson }} {{ t|tojson }} {{ f|tojson }}", D),
    ("filter_tojson_unicode_and_escapes", "{{ x|tojson }}", {"x": "\u00e9\u4e16 \"q\" \\ \n\t\u0001 </script>"}),
    ("filter_tojson_indent", "{{ d|tojson(indent=2) }}\n{{ [1, [2, {}], []]|tojson(indent=4) }}", D),
    ("filter_tojson_separators", "{{ d|tojson(separators=(',', ':')) }} {{ d|tojson(indent=1, separators=(';', '=')) }}", D),
    ("filter_tojson_sort_keys", "{{ {'b': 1, 'a': {'d': 1, 'c': 2}}|tojson(sort_keys=true) }}", {}),
    ("filter_tojson_nested_tool",
     "{{ tool|tojson }}", {"tool": {"type": "function", "function": {"name": "get_weather", "description": "Get it.",
                                                                     "parameters": {"type": "object", "properties": {
                                                                         "city": {"type": "string"},
                                                                         "days": {"type": "integer", "minimum": 1.5}},
                                                                                    "required": ["city"]}}}}),
    ("filter_tojson_tuple_and_keys", "{{ (1, 'a')|tojson }} {{ {1: 'a', none: 2, true: 3}|tojson }}", {}),
    ("filter_length", "{{ b|length }} {{ s|length }} {{ d|length }} {{ u8|length }} {{ missing|length }} {{ b|count }}", D),
    ("filter_string_case", "{{ s|upper }} {{ s|lower }} {{ 'hello wORLD'|title }} {{ 'hELLO'|capitalize }} "
     "{{ \"they're-here (ok)\"|title }} {{ u8|upper }}", D),
    ("filter_trim", "[{{ '  a b  '|trim }}] [{{ 'xxaxx'|trim('x') }}] [{{ '\\n\\t a \\u3000'|trim }}]", {}),
    ("filter_string", "{{ 1|string }} {{ none|string }} {{ b|string }} [{{ missing|string }}] {{ (1|string) ~ 'x' }}", D),
    ("filter_join", "{{ b|join(', ') }} {{ ['a', 'b']|join }} {{ msgs|join('|', attribute='role') }} "
     "{{ [1, none, 'x']|join('-') }} {{ 'abc'|join('.') }}", D),
    ("filter_default", "{{ missing|default('dflt') }} {{ a|default('dflt') }} [{{ e|default('dflt') }}] "
     "{{ e|default('dflt', true) }} {{ z|d('zero', boolean=true) }} {{ n|default('x') }} [{{ missing|d }}]", D),
    ("filter_first_last", "{{ b|first }} {{ b|last }} {{ s|first }} {{ s|last }} [{{ []|first }}] {{ msgs|last|tojson }}", D),
    ("filter_list_items", "{{ s|list }} {{ d|list }} {{ d|items|list }} {{ missing|items|list }} {{ missing|list }}", D),
    ("filter_replace", "{{ s|replace('o', '0') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '-') }}", D),
    ("filter_selectattr", "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }} "
     "{{ msgs|selectattr('role', '==', 'system')|map(attribute='content')|join }} "
     "{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}", D),
    ("filter_selectattr_truthy_and_defined",
     "{{ xs|selectattr('v')|list|length }} {{ xs|selectattr('v', 'defined')|list|length }} "
     "{{ xs|rejectattr('v', 'none')|list|length }} {{ xs|selectattr('v', 'none')|list|length }}",
     {"xs": [{"v": 1}, {"v": 0}, {"v": None}, {"w": 1}]}),
    ("filter_select_reject", "{{ range(6)|select('odd')|list }} {{ range(6)|reject('odd')|list }} "
     "{{ [0, 1, '', 'a', none]|select|list }} {{ range(10)|select('divisibleby', 3)|list }} "
     "{{ [1, 5, 10]|select('>', 3)|list }} {{ ['a', 2, 'b']|select('string')|list }}", {}),
    ("filter_map", "{{ msgs|map(attribute='role')|list }} {{ b|map('string')|join }} {{ ['a', 'b']|map('upper')|list }} "
     "{{ xs|map(attribute='v', default='-')|list }} {{ [1.6, 2.4]|map('round')|list }}",
     {"msgs": MSGS, "b": [1, 2], "xs": [{"v": 1}, {}]}),
    ("filter_map_dotted", "{{ xs|map(attribute='f.name')|list }} {{ xs|map(attribute='l.0')|list }}",
     {"xs": [{"f": {"name": "a"}, "l": [5]}, {"f": {"name": "b"}, "l": [6]}]}),
    ("filter_select_map_of_false_inputs", "{{ n|select|list }} {{ false|map(attribute='role')|list }} "
     "{{ 0|reject('nosuch')|list }} {{ ''|selectattr('x')|list }} {{ missing|map('upper')|list }}", D),
    ("filter_generators_are_true", "{{ 'T' if []|select else 'F' }} {{ 'T' if []|map('upper') else 'F' }}", {}),
    ("filter_generator_in_consumes", "{% set g = b|select %}{{ 2 in g }}{{ 1 in g }}{{ 3 in g }}"
     "{% set h = b|select %}{{ h|first }}{{ h|list }}", D),
    ("filter_generator_consumed_once", "{% set g = b|map('string') %}{{ g|list }}{{ g|list }}", D),
    ("filter_numbers", "{{ -3|abs }} {{ (-3)|abs }} {{ -2.5|abs }} {{ '12'|int }} {{ '12.7'|int }} {{ 'x'|int }} "
     "{{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1f'|int(0, 16) }} {{ ' 42 '|int }} {{ true|int }}", {}),
    ("filter_float", "{{ '1.5'|float }} {{ 2|float }} {{ 'x'|float }} {{ ' 3 '|float }} {{ 'inf'|float }}", {}),
    ("filter_round", "{{ 2.5|round }} {{ 3.5|round }} {{ 3|round }} {{ 3.14159|round(2) }} {{ 2.675|round(2) }} "
     "{{ 2.5|round(0, 'floor') }} {{ 2.1|round(0, 'ceil') }} {{ 1.25|round(1, 'floor') }} {{ -0.5|round }}", {}),
    ("filter_unique", "{{ [1, 2, 1, 3, 2]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} "
     "{{ ['a', 'A', 'b']|unique(case_sensitive=true)|list }} {{ msgs|unique(attribute='role')|map(attribute='role')|list }}",
     {"msgs": MSGS + [{"role": "user", "content": "again"}]}),
    ("filter_reverse", "{{ b|reverse|list }} {{ s|reverse }} {% for m in msgs|reverse %}{{ m.role[0] }}{% endfor %}", D),
    ("filter_sort", "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} "
     "{{ [3, 1, 2]|sort(reverse=true) }} {{ xs|sort(attribute='k')|map(attribute='n')|join }} "
     "{{ xs|sort(attribute='k', reverse=true)|map(attribute='n')|join }}",
     {"xs": [{"k": 2, "n": "a"}, {"k": 1, "n": "b"}, {"k": 2, "n": "c"}, {"k": 0, "n": "d"}]}),
    ("filter_dictsort", "{{ dd|dictsort }} {{ dd|dictsort(reverse=true) }} {{ dd|dictsort(by='value') }}",
     {"dd": {"b": 1, "a": 3, "C": 2}}),
    ("filter_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|"
     "{{ 'x\\n'|indent(first=true) }}|{{ 'a\\nb'|indent('> ') }}", {}),
    ("filter_markup", "{{ ('<'|safe) ~ '<' }}|{{ ('<'|safe) + '<' }}|{{ ('<'|e) + '&' }}|{{ '&' + ('<'|e) }}|"
     "{{ ['<'|e, 'x'|safe] }}|{{ '<'|e|e }}|{{ ('<'|safe)|e }}|{{ ('a'|safe) == 'a' }}|{{ ('<'|safe)|length }}|"
     "{{ ('x'|safe) is string }}|{{ ('a'|safe)|tojson }}|{{ ('<'|safe)|string|e }}", {}),
    ("filter_escape", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }} {{ 5|e }}", {}),
    ("filter_batch", "{{ range(5)|batch(2)|list }} {{ range(5)|batch(2, 'x')|list }}", {}),
    ("filter_min_max_sum", "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ [1, 2.5]|sum }} "
     "{{ xs|sum(attribute='k') }} {{ xs|max(attribute='k')|tojson }} [{{ []|max }}]",
     {"xs": [{"k": 2}, {"k": 5}]}),
    ("filter_attr", "{{ d|attr('x') }} [{{ d|attr('items') is defined }}] {{ ns|attr('v') }}",
     {"d": {"x": 1}, "ns": {"v": 2}}),
    ("filter_chain_and_args", "{{ s|lower|replace('world', 'there')|upper }} {{ b|map('string')|join('+') }}", D),
    ("filter_count_of_select", "{{ msgs|selectattr('role', 'in', ['user', 'assistant'])|list|length }}", D),
    # ---- tests ----
    ("tests_defined", "{{ a is defined }} {{ missing is defined }} {{ missing is undefined }} {{ n is none }} "
     "{{ n is not none }} {{ d.q is defined }} {{ msgs[0].role is defined }}", D),
    ("tests_types", "{{ s is string }} {{ a is number }} {{ f is number }} {{ a is integer }} {{ f is float }} "
     "{{ t is boolean }} {{ t is true }} {{ t is false }} {{ 1 is true }} {{ d is mapping }} {{ b is mapping }} "
     "{{ b is iterable }} {{ s is iterable }} {{ a is iterable }} {{ b is sequence }} {{ d is sequence }} "
     "{{ a is sequence }} {{ true is number }} {{ true is integer }}", D),
    ("tests_undefined_types", "{{ missing is iterable }} {{ missing is sequence }} {{ missing is mapping }} "
     "{{ missing is string }} {{ missing is none }} {{ missing is callable }}", {}),
    ("tests_callable", "{% macro m() %}{% endmacro %}{{ m is callable }} {{ s.upper is callable }} {{ s is callable }} "
     "{{ range is callable }} {{ namespace is callable }}", D),
    ("tests_numbers", "{{ 3 is odd }} {{ 3 is even }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} "
     "{{ -3 is odd }} {{ 0 is even }}", {}),
    ("tests_comparison", "{{ 3 is equalto 3 }} {{ 3 is eq 4 }} {{ 3 is ne 4 }} {{ 3 is lt 4 }} {{ 3 is le 3 }} "
     "{{ 3 is gt 4 }} {{ 3 is ge 3 }} {{ 3 is greaterthan 2 }} {{ 3 is lessthan 2 }} {{ 'a' is in 'abc' }} "
     "{{ 2 is in b }}", D),
    ("tests_sameas", "{{ none is sameas none }} {{ true is sameas true }} {{ 1 is sameas 1 }} {{ false is sameas 0 }}", {}),
    ("tests_case", "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'Abc' is lower }} {{ '123' is upper }} {{ s is upper }}", D),
    ("tests_filter_test", "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ 'nope' is test }}", {}),
    ("tests_escaped", "{{ 'x' is escaped }}", {}),
    ("tests_is_not_string", "{{ a is not string }} {{ s is not string }}", D),
    # ---- methods ----
    ("str_startswith_endswith", "{{ s.startswith('Hell') }} {{ s.endswith('World') }} {{ s.startswith(('x', 'He')) }} "
     "{{ s.endswith(('x', 'y')) }} {{ s.startswith('World', 6) }} {{ s.startswith('') }}", D),
    ("str_split", "{{ 'a,b,,c'.split(',') }} {{ ' a  b \\n'.split() }} {{ 'a b c'.split(None, 1) }} "
     "{{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' a b c '.rsplit(None, 1) }} {{ ''.split() }} "
     "{{ ''.split(',') }}", {}),
    ("str_split_think", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     {"c": "<think>\nreasoning here\n</think>\n\nanswer"}),
    ("str_strip", "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ '\\n\\nx\\n'.strip('\\n') }}]"
     "[{{ 'abcxcba'.strip('ab') }}][{{ 'xxy'.lstrip('x') }}][{{ 'yxx'.rstrip('x') }}]", {}),
    ("str_case_methods", "{{ s.upper() }} {{ s.lower() }} {{ \"they're bill's\".title() }} {{ 'hELLO'.capitalize() }}", D),
    ("str_find_count", "{{ s.find('o') }} {{ s.rfind('o') }} {{ s.find('z') }} {{ s.index('W') }} {{ s.count('l') }} "
     "{{ u8.find('\u4e16') }} {{ 'aaaa'.count('aa') }} {{ s.find('o', 5) }} {{ ''.count('') }}", D),
    ("str_replace_join", "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ ', '.join(['a', 'b']) }} "
     "{{ '-'.join('abc') }}", D),
    ("str_predicates", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ ' \\t'.isspace() }} "
     "{{ 'ab1'.isalnum() }} {{ ''.isdigit() }} {{ 'AB'.isupper() }} {{ 'ab'.islower() }}", {}),
    ("str_splitlines", "{{ 'a\\nb\\r\\nc\\n'.splitlines() }} {{ 'a\\nb'.splitlines(true) }}", {}),
    ("str_remove_affix", "{{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.json'.removesuffix('.json') }} "
     "{{ 'x'.removeprefix('y') }}", {}),
    ("dict_methods", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('x') }} "
     "{{ d.get('q') }} {{ d.get('q', 'dflt') }}", D),
    ("list_methods", "{{ b.index(2) }} {{ [1, 1, 2].count(1) }}", D),
    ("method_on_literal", "{{ 'a-b'.split('-')|join('+') }} {{ [3, 2, 1]|sort|first }}", {}),
    # ---- globals ----
    ("range_function", "{% for i in range(2, 7, 2) %}{{ i }}{% endfor %}", {}),
    ("dict_function", "{{ dict(a=1, b=2) }}", {}),
    ("variables_override_globals", "{{ range }}", {"range": "mine"}),
    # ---- realistic template fragments ----
    ("llama_style_system",
     "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
     "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n"
     "{{- bos_token }}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- system_message }}\n"
     "{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
     " + message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n"
     "{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n",
     {"messages": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi"}],
      "bos_token": "<|begin_of_text|>", "add_generation_prompt": True}),
    ("mistral_style_alternation",
     "{%- for message in messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
     "        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\n"
     "    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {{- '[INST] ' + message['content'] + ' [/INST]' }}\n"
     "    {%- else %}\n        {{- message['content'] + eos_token }}\n    {%- endif %}\n{%- endfor %}\n",
     {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}], "eos_token": "</s>"}),
    ("qwen25_style_tool_calls",
     "{%- for message in messages %}\n{%- if message.role == \"assistant\" %}\n"
     "{{- '<|im_start|>' + message.role }}\n{%- if message.content %}\n{{- '\\n' + message.content }}\n{%- endif %}\n"
     "{%- for tool_call in message.tool_calls %}\n{%- if tool_call.function is defined %}\n"
     "{%- set tool_call = tool_call.function %}\n{%- endif %}\n{{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
     "{{- tool_call.name }}\n{{- '\", \"arguments\": ' }}\n{{- tool_call.arguments | tojson }}\n{{- '}\\n</tool_call>' }}\n"
     "{%- endfor %}\n{{- '<|im_end|>\\n' }}\n{%- endif %}\n{%- endfor %}",
     {"messages": [{"role": "assistant", "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": "\u00e9"}}},
                                   {"name": "g", "arguments": {}}]}]}),
    # ---- more whitespace and lexer corners ----
    ("ws_nested_dash_in_if", "{% if true %}\n  {%- if true %}\n    x\n  {%- endif %}\n{% endif %}", {}),
    ("ws_for_lines", "{% for i in b %}\n{{ i }}\n{% endfor %}", D),
    ("ws_for_dash_list", "{%- for i in b %}\n  - {{ i }}\n{%- endfor %}", D),
    ("ws_comment_dash_start_of_template", "  {#- x #}\ny", {}),
    ("ws_comments_on_lines", "{# a #}\n{# b #}\nc", {}),
    ("ws_comment_dash_end", "x   {# a -#}\n  y", {}),
    ("ws_raw_lines", "{% raw %}\na\n{% endraw %}\nb", {}),
    ("ws_raw_indented", "  {% raw %}  a  {% endraw %}  \n", {}),
    ("ws_raw_tight", "{%raw%}{%endraw%}x", {}),
    ("ws_trailing_spaces_after_block", "{% if true %}a{% else %}b{% endif %}   \nc", {}),
    ("ws_set_lines", "{% set x = 1 %}\n{% set y = 2 %}\n{{ x }}{{ y }}", {}),
    ("ws_spaces_around_set", " {% set x = 1 %} \n {{ x }} \n", {}),
    ("ws_tabs_and_dashes", "\t{%- set x = 1 -%}\t\n\t{{ x }}", {}),
    ("ws_macro_lines", "{% macro m(x) %}\n{{ x }}\n{% endmacro %}\n{{ m(1) }}{{ m(2) }}", {}),
    ("string_line_continuation", "{{ \"a\\\nb\" }}", {}),
    ("trailing_commas", "{{ [1, 2, 3,] }}{{ {'a': 1,} }}{{ (1, 2,) }}", {}),
    ("filter_binds_tighter_than_if", "{{ 1 if true else 2 | string }} {{ -1|abs }} {{ b | length is number }}", D),
    ("filter_binds_tighter_than_plus", "{{ 1 + 2 | string | length }}", {}),
    ("nested_loop_index", "{% for a in [[1, 2], [3, 4]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}{% endfor %}", {}),
    ("namespace_list_accumulate", "{% set ns = namespace(x=[]) %}{% for i in b %}{% set ns.x = ns.x + [i * 2] %}"
     "{% endfor %}{{ ns.x }}", D),
    ("qwen_last_query_index", "{% for message in msgs[::-1] %}{% set index = (msgs|length - 1) - loop.index0 %}"
     "{{ index }}{% endfor %}", D),
    ("unicode_lengths", "{{ '\u00e9'|length }}{{ '\U0001F600'|length }}{{ '\U0001F600x'[1] }}{{ ['\U0001F600']|string }}", {}),
    ("unicode_spaces", "{{ '\\x85'.isspace() }}{{ '\\u00a0'.strip()|length }}{{ 'a\\u2003b'.split() }}", {}),
    ("split_corners", "{{ 'aaa'.split('a') }}{{ 'abc'.split('abc') }}{{ 'a\\r\\nb'.splitlines() }}{{ '\\n'.splitlines() }}", {}),
    ("full_case_mappings", "{{ 'stra\u00dfe \ufb01'|upper }} {{ '\u0130'|lower|length }} {{ '\u00df'.upper() }}", {}),
    ("tojson_indent_string_and_negative", "{{ d|tojson(indent='\\t') }}|{{ d|tojson(indent=-1) }}|{{ d|tojson(indent=0) }}", D),
    ("float_filter_corners", "{{ '1.5'|float + 1 }} {{ '1e3'|float }} {{ 'abc'|float(2.5) }}", {}),
    ("tojson_quotes", "{{ 'a\"b\\'c'|tojson }} {{ [{'a': none}]|tojson }} {{ {'k': [true, false]}|string }}", {}),
    ("big_values", "{{ 2147483648 * 2 }} {{ -9223372036854775807 - 1 }} {{ 10 % 3.5 }} {{ -10 % 3.5 }} {{ 5.0 // 0.3 }} "
     "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 2**0.5 }} {{ 123456789012345678 }} {{ 1e16 }} {{ -0.0 }}", {}),
    ("compare_sequences", "{{ 'a' < 'ab' }} {{ [1] < [1, 0] }} {{ (1, 2) < (1, 3) }} {{ 1 == 1 == 2 }} {{ 1 < 2 > 1 }}", {}),
    ("contains_corners", "{{ 'a' in ['a'] }} {{ ['a'] in [['a']] }} {{ 1.0 in [1] }} {{ true in [1] }}", {}),
    ("bool_index", "{{ b[true] }} {{ b[false] }} {{ {none: 1}[none] }}", D),
# ---- integers beyond int64 from JSON (Python keeps every digit) ----
    ("big_int_printed_and_tojson",
     "{{ x }} {{ x | tojson }} {{ x is integer }} {{ x is number }} {{ x == x }} {{ [x] }} {{ {'k': x} | tojson }} "
     "{{ x | int }} {{ x | float }} {{ x | string }} {{ x ~ '' }}",
     {"x": 12345678901234567890}),
    ("big_int_negative_in_a_list", "{{ v | tojson }} {{ v[1] }}", {"v": [1, -98765432109876543210]}),
# ---- runtime errors ----
    ("error_raise_exception", "a{{ raise_exception('System message must be first') }}", {},
     "System message must be first"),
    ("error_undefined_call", "{{ foo(1) }}", {}, "'foo' is undefined"),
    ("error_undefined_attribute_of_undefined", "{{ missing.x }}", {}, "'missing' is undefined"),
    ("error_attribute_chain", "{{ d.q.r }}", D, "has no attribute 'q'"),
    ("error_undefined_method", "{{ s.nosuch() }}", D, "has no attribute 'nosuch'"),
    ("error_list_append", "{{ b.append(4) }}", D, "access to attribute 'append' of 'list' object is unsafe."),
    ("error_dict_pop", "{{ d.pop('x') }}", D, "unsafe"),
    ("error_dict_update", "{% set _ = d.update({'a': 1}) %}", D, "unsafe"),
    ("error_type_add", "{{ 1 + 'a' }}", {}, "unsupported operand"),
    ("error_compare_types", "{{ 1 < 'a' }}", {}, "not supported between"),
    ("error_compare_undefined", "{{ missing < 1 }}", {}, "is undefined"),
    ("error_add_undefined", "{{ missing + 1 }}", {}, "is undefined"),
    ("error_division_by_zero", "{{ 1 / 0 }}", {}, "division by zero"),
    ("error_tojson_undefined", "{{ missing|tojson }}", {}, "not JSON serializable"),
    ("error_length_of_int", "{{ 5|length }}", {}, "has no len()"),
    ("error_iterate_int", "{% for x in 5 %}{% endfor %}", {}, "not iterable"),
    ("error_iterate_none", "{% for x in n %}{% endfor %}", D, "not iterable"),
    ("error_unpack", "{% for a, b in [(1, 2, 3)] %}{% endfor %}", {}, "too many values to unpack"),
    ("error_set_attribute_non_namespace", "{% set d.x = 1 %}", D, "non-namespace"),
    ("error_macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}, "takes not more than 1"),
    ("error_macro_unknown_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", {}, "no keyword argument 'b'"),
    ("error_items_of_list", "{{ b|items|list }}", D, "mapping"),
    ("error_range_too_big", "{{ range(1000000)|length }}", {}, "Range too big"),
    ("error_in_string_needs_string", "{{ 1 in 'abc' }}", {}, "requires string as left operand"),
    ("error_call_string", "{{ s() }}", D, "not callable"),
    ("error_select_unknown_test", "{{ b|select('nosuch')|list }}", D, "No test named 'nosuch'"),
    ("error_map_unknown_filter", "{{ b|map('nosuch')|list }}", D, "No filter named 'nosuch'"),
    ("error_call_block_without_caller", "{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}", {},
     "special caller argument"),
    ("error_int_of_undefined", "{{ missing|int }}", {}, "'missing' is undefined"),
    ("error_dict_in_dict", "{{ d in d }}", D, "unhashable type: 'dict'"),
    ("error_slice_of_bool", "{{ t[1:] }}", D, "not subscriptable"),
    ("error_slice_of_dict", "{{ d[1:] }}", D, "unhashable"),
    ("error_indent_of_list", "{{ b|indent }}", D, "indent"),
    ("error_unique_of_dicts", "{{ msgs|unique|list }}", D, "unhashable type: 'dict'"),
    ("error_line_number", "line1\n{% if true %}\n\n{{ raise_exception('boom') }}\n{% endif %}", {}, ":4: boom"),
    # ---- parse errors ----
    ("parse_error_unclosed_if", "{% if true %}\nx", {}, "endif"),
    ("parse_error_unknown_tag", "a\n{% frobnicate %}", {}, ":2: Encountered unknown tag 'frobnicate'"),
    ("parse_error_unknown_filter", "{{ 1 }}\n\n{{ x|nosuch }}", {}, ":3: No filter named 'nosuch'"),
    ("parse_error_unknown_test", "{{ x is nosuch }}", {}, "No test named 'nosuch'"),
    ("parse_error_bad_expression", "{{ 1 + }}", {}, ":1:"),
    ("parse_error_unclosed_variable", "{{ x ", {}, ":1:"),
    ("parse_error_unbalanced", "{{ (1 }}", {}, ":1:"),
    ("parse_error_unclosed_comment", "a\n{# never", {}, "comment"),
    ("parse_error_unclosed_string", "{{ 'abc }}", {}, ":1:"),
    ("parse_error_break_outside_loop", "{% break %}", {}, "outside"),
    ("parse_error_stray_endfor", "{% endfor %}", {}, "endfor"),
    ("parse_error_repeated_keyword", "{% macro m(a) %}{% endmacro %}{{ m(a=1, a=2) }}", {}, "keyword argument repeated"),
    ("parse_error_elif_after_else", "{% if a %}{% else %}{% elif b %}{% endif %}", {}, ":1:"),
]

# Conversations for the real Qwen3 template: tools, thinking on and off, reasoning_content, multi-step tools.
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web \u2014 returns snippets.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer",
                                                                                         "default": 5}},
                   "required": ["query"]}}}

QWEN3_CASES = [
    ("qwen3_simple_generation_prompt",
     {"messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello!"}],
      "add_generation_prompt": True}),
    ("qwen3_thinking_disabled",
     {"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": True,
      "enable_thinking": False}),
    ("qwen3_multi_turn_with_think_in_history",
     {"messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."},
                   {"role": "assistant", "content": "Why did the chicken cross the road?",
                    "reasoning_content": "Pick a classic."}],
      "add_generation_prompt": False}),
    ("qwen3_tools_multi_step",
     {"tools": [WEATHER_TOOL, SEARCH_TOOL],
      "messages": [{"role": "system", "content": "Use tools when needed."},
                   {"role": "user", "content": "Weather in Paris and Z\u00fcrich?"},
                   {"role": "assistant", "content": "", "reasoning_content": "Need two calls.",
                    "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                     "arguments": {"city": "Paris"}}},
                                   {"type": "function", "function": {"name": "get_weather",
                                                                     "arguments": "{\"city\": \"Z\u00fcrich\"}"}}]},
                   {"role": "tool", "content": "{\"temp\": 18.5}"},
                   {"role": "tool", "content": "{\"temp\": 12}"},
                   {"role": "assistant", "content": "<think>\nSummarize.\n</think>\n\nParis 18.5\u00b0C, Z\u00fcrich 12\u00b0C."},
                   {"role": "user", "content": "<tool_response>\nfake\n</tool_response>"}],
      "add_generation_prompt": True, "enable_thinking": True}),
    ("qwen3_tools_no_system",
     {"tools": [SEARCH_TOOL],
      "messages": [{"role": "user", "content": "Find kite."},
                   {"role": "assistant", "content": "Searching.",
                    "tool_calls": [{"id": "c1", "type": "function",
                                    "function": {"name": "search", "arguments": {"query": "kite", "limit": 3}}}]},
                   {"role": "tool", "content": "kite is a bird"}],
      "add_generation_prompt": True}),
]


def render(env, template, variables):
    variables = json.loads(json.dumps(variables))
    try:
        compiled = env.from_string(template)
    except Exception as e:  # TemplateSyntaxError, TemplateAssertionError, a compile-time SyntaxError
        return "template", "%s: %s" % (type(e).__name__, e)
    try:
        return "ok", compiled.render(**variables)
    except Exception as e:  # every error jinja2 raises while rendering
        return "runtime", "%s: %s" % (type(e).__name__, e)


def c_string(text):
    out = []
    for byte in text.encode("utf-8"):
        c = chr(byte)
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif 0x20 <= byte < 0x7F and c != "?":
            out.append(c)
        else:
            out.append("\\%03o" % byte)
    return '"' + "".join(out) + '"'


def main():
    env = make_environment()
    lines = ["/* Generated by tests/chat/jinja_expected.py from python3's jinja2 %s with transformers' settings;" %
             jinja2.__version__,
             " * do not edit: change the cases there and run it again. TEXT(s) is s and its length (NUL bytes kept). */",
             "", "static const jinja_case jinja_cases[] = {"]
    names = set()
    for case in CASES:
        name, template, variables = case[:3]
        expected_error = case[3] if len(case) > 3 else None
        assert name not in names, name
        names.add(name)
        kind, output = render(env, template, variables)
        if expected_error is None and kind != "ok":
            sys.exit("case %s: jinja2 failed: %s" % (name, output))
        if expected_error is not None and kind == "ok":
            sys.exit("case %s: jinja2 rendered %r but the case expects an error" % (name, output))
        status = {"ok": "KITE_OK", "template": "KITE_ERROR_INVALID_TEMPLATE", "runtime": "KITE_ERROR_INVALID_INPUT"}[kind]
        lines.append("    {%s, TEXT(%s), %s, %s, TEXT(%s), %s}," % (
            c_string(name), c_string(template), c_string(json.dumps(variables, ensure_ascii=False)), status,
            c_string(output if kind == "ok" else ""),
            c_string(expected_error) if expected_error else "NULL"))
        if kind != "ok":
            lines.append("    /* jinja2: %s */" % output.replace("*/", "* /").replace("\n", " "))
    lines.append("};")
    lines.append("")
    with open(os.path.join(ROOT, "tests/data/chat/templates/qwen3.jinja"), encoding="utf-8") as f:
        qwen3 = f.read()
    lines.append("static const jinja_case qwen3_cases[] = {")
    for name, variables in QWEN3_CASES:
        kind, output = render(env, qwen3, variables)
        if kind != "ok":
            sys.exit("case %s: jinja2 failed: %s" % (name, output))
        lines.append("    {%s, NULL, 0, %s, KITE_OK, TEXT(%s), NULL}," % (
            c_string(name), c_string(json.dumps(variables, ensure_ascii=False)), c_string(output)))
    lines.append("};")
    with open(os.path.join(ROOT, "tests/chat/jinja_cases.h"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d cases and %d Qwen3 conversations" % (len(CASES), len(QWEN3_CASES)))


if __name__ == "__main__":
    main()
