// A Jinja2 template interpreter for chat templates, equal to jinja2 3.1.6 as transformers
// 5.24 configures it for apply_chat_template: ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loop controls; globals raise_exception, strftime_now,
// namespace (no "_" names), dict, range (at most 100000 items), cycler, joiner; and
// transformers' tojson (json.dumps with ensure_ascii=False, indent, separators,
// sort_keys). Checked against jinja2 in tests/text/test_jinja.cpp
// (tests/fixtures/text/jinja_cases.json, from tools/gen_jinja_cases.py).
//
// Supported: {{ }}, {% %}, {# #} with -/+ whitespace control, {% raw %}; if/elif/else,
// for (else, `if` filter, recursive, loop.index/index0/revindex/revindex0/first/last/
// length/depth/previtem/nextitem/cycle()/changed()), break, continue, set (tuple
// targets, ns.attr, {% set x %}...{% endset %} with filters), macro (defaults, keyword
// arguments, varargs/kwargs, caller), call, filter, with, block (rendered in place),
// generation, print; every jinja2 operator with Python semantics (int/float arithmetic,
// // and % flooring, ** , ~, chained comparisons, in / not in, value-returning and/or,
// `a if b` without else), literals (escapes, tuples, dicts), slicing with steps,
// attribute/item lookup with jinja2's fallbacks, jinja2's Undefined (prints "", iterates
// empty, fails on use), Python str()/repr() output (None, True, 1.0, 1e-05, ['a', 1],
// {'a': 1}, dict views, ranges), the filters and tests of jinja2, the str methods
// (split, strip, startswith, replace, find, format, ...), dict items/keys/values/get/copy
// and list index/count/copy. Mutating methods (append, update, pop, ...) are refused with
// SecurityError, as the sandbox does.
//
// Values are JSON-like (none, bool, int, float, string, list, dict) plus callables and
// namespace objects. Rendering is bounded: a step budget and a call-depth limit stop a
// template that loops or recurses without end, with an error naming the template line.
// A Template is immutable once parsed: render() may run concurrently from many threads.
//
// Errors: every error is a moe::Error whose message contains "<name>:<line>: " followed
// by the Python exception jinja2 would raise and its text where we replicate it, e.g.
// "chat_template:12: TemplateError: Conversation roles must alternate" (raise_exception),
// "...: UndefinedError: 'foo' is undefined", "...: TypeError: unsupported operand
// type(s) for +: 'int' and 'str'", "...: TemplateSyntaxError: unexpected '}'".
//
// Limits (all give a moe::Error, never a crash, hang or unbounded allocation):
//  * max_steps: every AST node evaluated, statement executed, loop iteration and filter
//    call is a step, and so is the work of string and list operations (a step per 64
//    bytes read or built, per 4 list items copied, per 4 code points of non-ASCII text
//    decoded); the total over one render is capped ("template runs too long"). The
//    default is about a second of work and bounds the memory one render can allocate.
//    Substring search is linear (KMP for long needles), so no single step hides more.
//  * max_depth: template nesting at parse time (statement blocks, brackets, unary
//    operators; also the height of an expression tree, so a chain of 1000 `+` is
//    refused), macro / caller / recursive-loop call depth at run time ("RecursionError:
//    maximum recursion depth exceeded"), 10 x max_depth nested evaluations, and 2 x
//    max_depth levels of nested values for repr/tojson/==.
//  * max_stack: the C++ stack used by nested parsing/evaluation is measured, so no
//    combination of the limits above can overflow it ("RecursionError").
//  * max_output: the rendered text, and any single string or list a template builds
//    ('a' * 10**12 fails up front, before allocating).
//  * range() is limited to 100000 items, as jinja2's sandbox does.
//  * Integers are 64-bit: an operation that overflows fails ("OverflowError") where
//    Python would use a big integer.
//
// Deliberate gaps (each an error, never different output, unless noted):
// {% extends/include/import/from %} (no loader) and {% autoescape %} fail at parse time
// (jinja2 fails only if they run); {% do %} is unknown, as in transformers; the filters
// striptags/wordwrap/xmlattr/urlencode/urlize/filesizeformat/pprint/random parse and fail
// if run; \N{NAME} string escapes; integers beyond 64 bits; complex numbers. Output can
// differ only for: Markup arithmetic (|safe marks a string for `is escaped` but does not
// escape what is added to it), full Unicode case mappings (upper/lower/title map one code
// point to one; upper maps U+00DF to "SS"), and reprs holding addresses (<function ...>).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace moe::jinja {

struct Options {
  bool trim_blocks = true;    // remove the first newline after a block tag
  bool lstrip_blocks = true;  // strip spaces/tabs before a block tag at a line start
  int64_t max_steps = 10'000'000;  // evaluation steps before "template runs too long"
  int max_depth = 200;             // macro/call and nesting depth
  int64_t max_output = 64 << 20;   // bytes of rendered text
  // Bytes of C++ stack parsing or rendering may use below the caller's frame (4x under
  // AddressSanitizer, whose frames are larger). Call render() on a thread with more
  // stack than this plus what the caller itself uses.
  int64_t max_stack = 1 << 20;
};

class Template {
 public:
  // Parses `source`; syntax errors throw moe::Error "<name>:LINE: ...".
  Template(const std::string& source, const std::string& name = "template", Options opt = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `context` (a JSON object) as the global variables. Runtime errors
  // (raise_exception, a bad operation, the step budget) throw moe::Error naming the line.
  std::string render(const nlohmann::json& context) const;
  // Same, keeping the context's key order (Python dicts keep insertion order, so
  // `{{ tool|tojson }}` and `for k, v in d.items()` follow it; nlohmann::json sorts keys).
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moe::jinja
