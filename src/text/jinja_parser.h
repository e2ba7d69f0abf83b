// AST and parser for Jinja templates (internal). The grammar and its precedence follow
// jinja2's parser.py exactly, quirks included, because they change results: `~` binds
// tighter than `+`, unary minus tighter than `**` (so -2**2 is 4), `**` is
// left-associative, a filter applies to a unary expression (-1|abs is 1), comparisons
// chain, and `a if b` without else yields undefined.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace moe::jinja::detail {

enum class EK : uint8_t {
  Const, Name, NSRef, Getattr, Getitem, Slice, Call, Filter, Test, Neg, Pos, Not, Bin, And, Or,
  Concat, Compare, Cond, List, Tuple, Dict
};
enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct Expr;
using ExprP = std::unique_ptr<Expr>;

// One node. Children by kind:
//   Getattr: args[0] obj (attr in name)    Getitem: args[0] obj, args[1] key (maybe Slice)
//   Slice: args[0..2] start/stop/step, each may be null
//   Call: args[0] callee, args[1..] positional, kwargs, dyn_args (*x), dyn_kwargs (**x)
//   Filter/Test: args[0] subject (null in a filter block), args[1..] positional, kwargs
//   Neg/Pos/Not: args[0]   Bin/And/Or: args[0], args[1]   Concat/List/Tuple: args
//   Compare: args[0] first operand, args[i+1] the operand of cops[i]
//   Cond: args[0] value if true, args[1] test, args[2] value if false (may be null)
//   Dict: args = key0, value0, key1, value1, ...   NSRef: name.attr (assignment target)
struct Expr {
  EK kind;
  int line = 0;
  int height = 1;  // AST height, bounded so evaluation cannot recurse without limit
  std::string name, attr;
  Value value;  // Const
  BinOp bop = BinOp::Add;
  std::vector<CmpOp> cops;
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP dyn_args, dyn_kwargs;
  int filter_id = -1;  // Filter/Test: index in the registry, -1 when unknown (error if run)

};

// Assignment target of for/set/with: a name, a (nested) tuple of names, or ns.attr.
struct Target {
  enum Kind : uint8_t { Name, Tuple, NSRef } kind = Name;
  std::string name, attr;
  std::vector<Target> items;
};

enum class SK : uint8_t {
  Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, With, Scope, Break, Continue
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  SK kind;
  int line = 0;
  std::string text;  // Text; Macro name
  ExprP expr;        // Output; For iterable; Set value; CallBlock call; FilterBlock/SetBlock filter
  ExprP cond;        // For: the `if` filter
  std::vector<ExprP> conds;  // If: conds[i] guards bodies[i]; else_body is the else
  std::vector<Body> bodies;
  Body body, else_body;
  Target target;
  bool recursive = false;
  // Macro / CallBlock (the caller's signature).
  std::vector<std::string> params;
  std::vector<ExprP> defaults;  // for the last defaults.size() params
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
  // With.
  std::vector<Target> targets;
  std::vector<ExprP> values;
};

struct Program {
  Body body;
};

// Parses the tokens; syntax errors go through c.fail with the line. Unknown filters and
// tests are errors here unless they sit inside an if or a conditional expression, where
// jinja2 defers the error until the node runs.
Program parse(std::vector<Token> tokens, Ctx& c);

}  // namespace moe::jinja::detail
