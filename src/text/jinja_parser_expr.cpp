// Expression parsing: jinja2 parser.py's parse_expression .. parse_test, with its
// precedence (see jinja_parser.h) and the height limit of Parser::done().
#include <algorithm>

#include "text/jinja_eval.h"
#include "text/jinja_parser_impl.h"

namespace moe::jinja::detail {

// ---- expressions -----------------------------------------------------------------------------
ExprP Parser::parse_expression(bool with_condexpr) {
  Depth d(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprP Parser::parse_condexpr() {
  int line = cur().line;
  ExprP e1 = parse_or();
  while (skip_name("if")) {
    ExprP e2 = parse_or();
    ExprP e3 = skip_name("else") ? parse_condexpr() : nullptr;
    ExprP n = node(EK::Cond, line);
    n->args.push_back(std::move(e1));
    n->args.push_back(std::move(e2));
    n->args.push_back(std::move(e3));
    e1 = done(std::move(n));
    line = cur().line;
  }
  return e1;
}

ExprP Parser::binary(EK k, ExprP a, ExprP b, int line) {
  ExprP n = node(k, line);
  n->args.push_back(std::move(a));
  n->args.push_back(std::move(b));
  return done(std::move(n));
}

ExprP Parser::parse_or() {
  int line = cur().line;
  ExprP l = parse_and();
  while (skip_name("or")) {
    l = binary(EK::Or, std::move(l), parse_and(), line);
    line = cur().line;
  }
  return l;
}

ExprP Parser::parse_and() {
  int line = cur().line;
  ExprP l = parse_not();
  while (skip_name("and")) {
    l = binary(EK::And, std::move(l), parse_not(), line);
    line = cur().line;
  }
  return l;
}

ExprP Parser::parse_not() {
  if (is_name("not")) {
    Depth d(*this);
    ExprP n = node(EK::Not, next().line);
    n->args.push_back(parse_not());
    return done(std::move(n));
  }
  return parse_compare();
}

ExprP Parser::parse_compare() {
  int line = cur().line;
  ExprP e = parse_math1();
  ExprP cmp;
  while (true) {
    CmpOp op;
    if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      const std::string& t = cur().text;
      op = t == "==" ? CmpOp::Eq : t == "!=" ? CmpOp::Ne : t == "<" ? CmpOp::Lt
           : t == "<=" ? CmpOp::Le : t == ">" ? CmpOp::Gt : CmpOp::Ge;
      next();
    } else if (skip_name("in")) {
      op = CmpOp::In;
    } else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
      next();
      next();
      op = CmpOp::NotIn;
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(EK::Compare, line);
      cmp->args.push_back(std::move(e));
    }
    cmp->cops.push_back(op);
    cmp->args.push_back(parse_math1());
    line = cur().line;
  }
  if (!cmp) return e;
  cmp->line = line;
  return done(std::move(cmp));
}

ExprP Parser::bin(BinOp op, ExprP a, ExprP b, int line) {
  ExprP n = binary(EK::Bin, std::move(a), std::move(b), line);
  n->bop = op;
  return n;
}

ExprP Parser::parse_math1() {
  int line = cur().line;
  ExprP l = parse_concat();
  while (is_op("+") || is_op("-")) {
    BinOp op = next().text == "+" ? BinOp::Add : BinOp::Sub;
    l = bin(op, std::move(l), parse_concat(), line);
    line = cur().line;
  }
  return l;
}

ExprP Parser::parse_concat() {
  int line = cur().line;
  ExprP first = parse_math2();
  if (!is_op("~")) return first;
  ExprP n = node(EK::Concat, line);
  n->args.push_back(std::move(first));
  while (skip_op("~")) n->args.push_back(parse_math2());
  return done(std::move(n));
}

ExprP Parser::parse_math2() {
  int line = cur().line;
  ExprP l = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string t = next().text;
    BinOp op = t == "*" ? BinOp::Mul : t == "/" ? BinOp::Div : t == "//" ? BinOp::FloorDiv : BinOp::Mod;
    l = bin(op, std::move(l), parse_pow(), line);
    line = cur().line;
  }
  return l;
}

ExprP Parser::parse_pow() {
  int line = cur().line;
  ExprP l = parse_unary(true);
  while (skip_op("**")) {
    l = bin(BinOp::Pow, std::move(l), parse_unary(true), line);
    line = cur().line;
  }
  return l;
}

ExprP Parser::parse_unary(bool with_filter) {
  Depth d(*this);
  int line = cur().line;
  ExprP n;
  if (is_op("-") || is_op("+")) {
    n = node(next().text == "-" ? EK::Neg : EK::Pos, line);
    n->args.push_back(parse_unary(false));
    n = done(std::move(n));
  } else {
    n = parse_primary(false);
  }
  n = parse_postfix(std::move(n));
  if (with_filter) n = parse_filter_expr(std::move(n));
  return n;
}

ExprP Parser::parse_primary(bool with_ns) {
  const Token& tok = cur();
  ExprP n;
  if (tok.type == Tok::Name) {
    next();
    if (tok.text == "true" || tok.text == "false" || tok.text == "True" || tok.text == "False") {
      n = node(EK::Const, tok.line);
      n->value = Value::boolean(tok.text == "true" || tok.text == "True");
    } else if (tok.text == "none" || tok.text == "None") {
      n = node(EK::Const, tok.line);
      n->value = Value::none();
    } else if (with_ns && is_op(".")) {
      next();
      n = node(EK::NSRef, tok.line);
      n->name = tok.text;
      n->attr = expect_any_name().text;
    } else {
      n = node(EK::Name, tok.line);
      n->name = tok.text;
    }
  } else if (tok.type == Tok::Str) {
    std::string buf = next().text;
    while (cur().type == Tok::Str) buf += next().text;
    n = node(EK::Const, tok.line);
    n->value = Value::str(std::move(buf));
  } else if (tok.type == Tok::Int || tok.type == Tok::Float) {
    next();
    n = node(EK::Const, tok.line);
    n->value = tok.type == Tok::Int ? Value::integer(tok.ival) : Value::real(tok.fval);
  } else if (is_op("(")) {
    next();
    n = parse_tuple(false, true, nullptr, true);
    expect_op(")");
  } else if (is_op("[")) {
    n = parse_list();
  } else if (is_op("{")) {
    n = parse_dict();
  } else {
    fail(fmt::format("unexpected '{}'", describe(tok)), tok.line);
  }
  return n;
}

bool Parser::is_tuple_end(const char* extra) const {
  if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || (cur().type == Tok::Op && cur().text == ")"))
    return true;
  return extra && cur().type == Tok::Name && cur().text == extra;
}

ExprP Parser::parse_tuple(bool simplified, bool with_condexpr, const char* extra_end, bool explicit_parens, bool with_ns) {
  int line = cur().line;
  std::vector<ExprP> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    args.push_back(simplified ? parse_primary(with_ns) : parse_expression(with_condexpr));
    if (is_op(",")) is_tuple = true;
    else break;
    line = cur().line;
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parens) fail(fmt::format("Expected an expression, got '{}'", describe(cur())));
  }
  ExprP n = node(EK::Tuple, line);
  n->args = std::move(args);
  return done(std::move(n));
}

ExprP Parser::parse_list() {
  ExprP n = node(EK::List, expect_op("[").line);
  while (!is_op("]")) {
    if (!n->args.empty()) expect_op(",");
    if (is_op("]")) break;
    n->args.push_back(parse_expression(true));
  }
  expect_op("]");
  return done(std::move(n));
}

ExprP Parser::parse_dict() {
  ExprP n = node(EK::Dict, expect_op("{").line);
  while (!is_op("}")) {
    if (!n->args.empty()) expect_op(",");
    if (is_op("}")) break;
    n->args.push_back(parse_expression(true));
    expect_op(":");
    n->args.push_back(parse_expression(true));
  }
  expect_op("}");
  return done(std::move(n));
}

ExprP Parser::parse_postfix(ExprP n) {
  while (true) {
    if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
    else if (is_op("(")) n = parse_call(std::move(n));
    else break;
  }
  return n;
}

ExprP Parser::parse_filter_expr(ExprP n) {
  while (true) {
    if (is_op("|")) n = parse_filter(std::move(n), false);
    else if (is_name("is")) n = parse_test(std::move(n));
    else if (is_op("(")) n = parse_call(std::move(n));
    else break;
  }
  return n;
}

ExprP Parser::parse_subscript(ExprP obj) {
  const Token& tok = next();
  if (tok.text == ".") {
    const Token& a = next();
    if (a.type == Tok::Name) {
      ExprP n = node(EK::Getattr, tok.line);
      n->name = a.text;
      n->args.push_back(std::move(obj));
      return done(std::move(n));
    }
    if (a.type != Tok::Int) fail("expected name or number", a.line);
    ExprP k = node(EK::Const, a.line);
    k->value = Value::integer(a.ival);
    ExprP n = node(EK::Getitem, tok.line);
    n->args.push_back(std::move(obj));
    n->args.push_back(std::move(k));
    return done(std::move(n));
  }
  std::vector<ExprP> keys;
  while (!is_op("]")) {
    if (!keys.empty()) expect_op(",");
    keys.push_back(parse_subscribed());
  }
  expect_op("]");
  ExprP key;
  if (keys.size() == 1) {
    key = std::move(keys[0]);
  } else {
    key = node(EK::Tuple, tok.line);
    key->args = std::move(keys);
    key = done(std::move(key));
  }
  ExprP n = node(EK::Getitem, tok.line);
  n->args.push_back(std::move(obj));
  n->args.push_back(std::move(key));
  return done(std::move(n));
}

ExprP Parser::parse_subscribed() {
  int line = cur().line;
  std::vector<ExprP> args;
  if (is_op(":")) {
    next();
    args.push_back(nullptr);
  } else {
    ExprP e = parse_expression(true);
    if (!is_op(":")) return e;
    next();
    args.push_back(std::move(e));
  }
  if (is_op(":")) args.push_back(nullptr);
  else if (!is_op("]") && !is_op(",")) args.push_back(parse_expression(true));
  else args.push_back(nullptr);
  if (is_op(":")) {
    next();
    if (!is_op("]") && !is_op(",")) args.push_back(parse_expression(true));
    else args.push_back(nullptr);
  } else {
    args.push_back(nullptr);
  }
  ExprP n = node(EK::Slice, line);
  n->args = std::move(args);
  return done(std::move(n));
}

void Parser::parse_call_args(Expr& n) {
  const Token& open = expect_op("(");
  int line = open.line;
  bool require_comma = false;
  auto ensure = [&](bool ok) {
    if (!ok) fail("invalid syntax for function call expression", line);
  };
  while (!is_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*")) {
      ensure(!n.dyn_args && !n.dyn_kwargs);
      next();
      n.dyn_args = parse_expression(true);
    } else if (is_op("**")) {
      ensure(!n.dyn_kwargs);
      next();
      n.dyn_kwargs = parse_expression(true);
    } else if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
      ensure(!n.dyn_kwargs);
      std::string key = next().text;
      next();
      n.kwargs.emplace_back(std::move(key), parse_expression(true));
    } else {
      ensure(!n.dyn_args && !n.dyn_kwargs && n.kwargs.empty());
      n.args.push_back(parse_expression(true));
    }
    require_comma = true;
  }
  expect_op(")");
}

ExprP Parser::parse_call(ExprP callee) {
  ExprP n = node(EK::Call, cur().line);
  n->args.push_back(std::move(callee));
  parse_call_args(*n);
  return done(std::move(n));
}

std::string Parser::dotted_name() {
  std::string name = expect_any_name().text;
  while (is_op(".")) {
    next();
    name += "." + expect_any_name().text;
  }
  return name;
}

ExprP Parser::parse_filter(ExprP subject, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) next();
    int line = cur().line;
    ExprP n = node(EK::Filter, line);
    n->name = dotted_name();
    n->filter_id = find_filter(n->name);
    n->args.push_back(std::move(subject));
    if (is_op("(")) parse_call_args(*n);
    subject = done(std::move(n));
    start_inline = false;
  }
  return subject;
}

ExprP Parser::parse_test(ExprP subject) {
  const Token& is = next();
  bool negated = skip_name("not");
  ExprP n = node(EK::Test, is.line);
  n->name = dotted_name();
  n->filter_id = find_test(n->name);
  n->args.push_back(std::move(subject));
  if (is_op("(")) {
    parse_call_args(*n);
  } else if ((cur().type == Tok::Name || cur().type == Tok::Str || cur().type == Tok::Int ||
              cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("You cannot chain multiple tests with is");
    n->args.push_back(parse_postfix(parse_primary(false)));
  }
  n = done(std::move(n));
  if (!negated) return n;
  ExprP no = node(EK::Not, is.line);
  no->args.push_back(std::move(n));
  return done(std::move(no));
}

}  // namespace moe::jinja::detail
