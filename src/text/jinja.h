// A Jinja2 template interpreter for chat templates: the subset the published chat
// templates of Hugging Face models use (see tests/text/test_jinja.cpp for the list),
// with the environment transformers sets up for apply_chat_template:
// trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now and its
// tojson (ensure_ascii=False).
//
// Values are JSON-like (none, bool, int, float, string, list, dict) plus callables and
// namespace objects. Rendering is bounded: a step budget and a call-depth limit stop a
// template that loops or recurses without end, with an error naming the template line.
//
// Errors: every error is a moe::Error whose message contains "<name>:<line>: " followed
// by the Python exception jinja2 would raise and its text where we replicate it, e.g.
// "chat_template:12: TemplateError: Conversation roles must alternate" (raise_exception),
// "...: UndefinedError: 'foo' is undefined", "...: TypeError: unsupported operand
// type(s) for +: 'int' and 'str'", "...: TemplateSyntaxError: unexpected '}'".
//
// Limits (all give a moe::Error, never a crash, hang or unbounded allocation):
//  * max_steps: every AST node evaluated, statement executed, loop iteration and filter
//    call is a step, and so is every 64 bytes/items a string or list operation builds;
//    the total over one render is capped ("template runs too long"). The default is
//    about a second of work and bounds the memory one render can allocate.
//  * max_depth: template nesting at parse time (statement blocks, brackets, unary
//    operators; also the height of an expression tree, so a chain of 1000 `+` is
//    refused), macro / caller / recursive-loop call depth at run time ("RecursionError:
//    maximum recursion depth exceeded"), 10 x max_depth nested evaluations, and 2 x
//    max_depth levels of nested values for repr/tojson/==.
//  * max_output: the rendered text, and any single string or list a template builds
//    ('a' * 10**12 fails up front, before allocating).
//  * range() is limited to 100000 items, as jinja2's sandbox does.
//  * Integers are 64-bit: an operation that overflows fails ("OverflowError") where
//    Python would use a big integer.
//
// Deliberate gaps: {% extends/include/import/from %} (no loader), {% autoescape %},
// {% do %}, the filters striptags/wordwrap/xmlattr/urlencode/urlize/filesizeformat/
// pprint/random (they parse, and fail if run), Markup's auto-escaping arithmetic
// (|safe marks a string for `is escaped` only), and full Unicode case mappings (upper,
// lower and title map one code point to one, except that upper maps U+00DF to "SS").
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
