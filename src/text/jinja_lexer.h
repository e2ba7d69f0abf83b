// Tokenizer for Jinja templates (internal). Mirrors jinja2's lexer.py: the same
// regular-expression rules, applied by hand, including the whitespace control that
// decides the bytes of a chat prompt: `{%- -%}`, `{{- -}}`, `{#- -#}`, trim_blocks (the
// newline after a block or comment tag), lstrip_blocks (spaces before a block tag at a
// line start), `+` to disable either, and newline normalisation (\r\n and \r become \n,
// one trailing newline is dropped, as keep_trailing_newline=False does).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_value.h"

namespace moe::jinja::detail {

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, Eof };

struct Token {
  Tok type;
  int line;
  std::string text;  // data, name, operator, or the unescaped string literal
  int64_t ival = 0;
  double fval = 0;
};

// Errors (unterminated comment/raw, bad character, unbalanced brackets, bad escape) go
// through c.fail with the line set.
std::vector<Token> lex(std::string_view source, Ctx& c);

// A readable name for a token in syntax errors, as jinja2's describe_token.
std::string describe(const Token& t);

}  // namespace moe::jinja::detail
