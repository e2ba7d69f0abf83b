// The parser class shared by jinja_parser.cpp (statements) and jinja_parser_expr.cpp
// (expressions). Internal to src/text/jinja_*.cpp.
#pragma once

#include <string>
#include <vector>

#include "text/jinja_parser.h"

namespace moe::jinja::detail {

class Parser {
  using Ends = std::vector<const char*>;
 public:
  Parser(std::vector<Token> toks, Ctx& c) : t_(std::move(toks)), c_(c) {}

  Program run() {
    Program p;
    p.body = subparse(nullptr);
    return p;
  }

 private:
  // ---- token stream --------------------------------------------------------------------
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& msg, int line = -1) {
    c_.line = line >= 0 ? line : cur().line;
    c_.fail("TemplateSyntaxError: " + msg);
  }
  void expect_fail(const std::string& what) {
    if (cur().type == Tok::Eof) fail(fmt::format("unexpected end of template, expected '{}'.", what));
    fail(fmt::format("expected token '{}', got '{}'", what, describe(cur())));
  }
  const Token& expect_op(const char* op) {
    if (!is_op(op)) expect_fail(op);
    return next();
  }
  const Token& expect_name(const char* n) {
    if (!is_name(n)) expect_fail(n);
    return next();
  }
  const Token& expect_any_name() {
    if (cur().type != Tok::Name) expect_fail("name");
    return next();
  }
  const Token& expect(Tok type, const char* what) {
    if (cur().type != type) expect_fail(what);
    return next();
  }

  struct Depth {
    Parser& p;
    explicit Depth(Parser& parser) : p(parser) {
      if (++p.depth_ > p.c_.opt().max_depth) p.fail("template nested too deeply");
      p.c_.check_stack();
    }
    ~Depth() { --p.depth_; }
  };

  ExprP node(EK k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  // Sets the height from the children; a taller tree (e.g. 1+1+...+1 a thousand times)
  // is refused so evaluating it cannot exhaust the stack.
  ExprP done(ExprP e) {
    int h = 0;
    for (const auto& a : e->args)
      if (a) h = std::max(h, a->height);
    for (const auto& kv : e->kwargs) h = std::max(h, kv.second->height);
    if (e->dyn_args) h = std::max(h, e->dyn_args->height);
    if (e->dyn_kwargs) h = std::max(h, e->dyn_kwargs->height);
    e->height = h + 1;
    if (e->height > c_.opt().max_depth) fail("expression nested too deeply", e->line);
    return e;
  }


  // statements (jinja_parser.cpp)
  bool at_end_token(const Ends* ends) const;
  Body subparse(const Ends* ends);
  Body parse_statements(Ends ends, bool drop_needle);
  [[noreturn]] void fail_ut_eof(const std::string* name, std::vector<Ends> stack, int line);
  [[noreturn]] void fail_eof(const Ends* ends);
  std::unique_ptr<Stmt> stmt(SK k, int line);
  void parse_statement(Body& out);
  std::unique_ptr<Stmt> parse_for();
  std::unique_ptr<Stmt> parse_if();
  std::unique_ptr<Stmt> parse_set();
  std::unique_ptr<Stmt> parse_with();
  void parse_signature(Stmt& s);
  Body parse_function_body(const char* end);
  std::unique_ptr<Stmt> parse_macro();
  std::unique_ptr<Stmt> parse_call_block();
  std::unique_ptr<Stmt> parse_filter_block();
  void scan_specials(Stmt& m);
  Target to_target(const Expr& e);
  Target parse_assign_target(bool with_tuple, bool name_only, const char* extra_end, bool with_ns);

  // expressions (jinja_parser_expr.cpp)
  ExprP parse_expression(bool with_condexpr);
  ExprP parse_condexpr();
  ExprP binary(EK k, ExprP a, ExprP b, int line);
  ExprP parse_or();
  ExprP parse_and();
  ExprP parse_not();
  ExprP parse_compare();
  ExprP bin(BinOp op, ExprP a, ExprP b, int line);
  ExprP parse_math1();
  ExprP parse_concat();
  ExprP parse_math2();
  ExprP parse_pow();
  ExprP parse_unary(bool with_filter);
  ExprP parse_primary(bool with_ns);
  bool is_tuple_end(const char* extra) const;
  ExprP parse_tuple(bool simplified, bool with_condexpr, const char* extra_end, bool explicit_parens, bool with_ns = false);
  ExprP parse_list();
  ExprP parse_dict();
  ExprP parse_postfix(ExprP n);
  ExprP parse_filter_expr(ExprP n);
  ExprP parse_subscript(ExprP obj);
  ExprP parse_subscribed();
  void parse_call_args(Expr& n);
  ExprP parse_call(ExprP callee);
  std::string dotted_name();
  ExprP parse_filter(ExprP subject, bool start_inline);
  ExprP parse_test(ExprP subject);

  std::vector<Token> t_;
  size_t i_ = 0;
  Ctx& c_;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<Ends> end_stack_;
  std::vector<std::string> tag_stack_;
};

}  // namespace moe::jinja::detail
