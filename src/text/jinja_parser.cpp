// Recursive-descent parser: a transcription of jinja2's parser.py (same functions, same
// order, same error texts), plus the checks jinja2's compiler makes (unknown filter or
// test, break outside a loop) and the depth limits that keep parsing and evaluation
// bounded.
#include "text/jinja_parser.h"

#include <algorithm>

#include "text/jinja_eval.h"
#include "text/jinja_parser_impl.h"

namespace moe::jinja::detail {

namespace {

const char* const kStatementKeywords[] = {"for",  "if",      "block", "extends", "print", "macro", "include",
                                          "from", "import",  "set",   "with",    "autoescape"};

}  // namespace

// ---- statements ------------------------------------------------------------------------

bool Parser::at_end_token(const Ends* ends) const {
  if (!ends || cur().type != Tok::Name) return false;
  for (const char* e : *ends)
    if (cur().text == e) return true;
  return false;
}

Body Parser::subparse(const Ends* ends) {
  Depth d(*this);
  Body body;
  if (ends) end_stack_.push_back(*ends);
  while (cur().type != Tok::Eof) {
    const Token& tok = cur();
    if (tok.type == Tok::Data) {
      auto s = std::make_unique<Stmt>();
      s->kind = SK::Text;
      s->line = tok.line;
      s->text = tok.text;
      body.push_back(std::move(s));
      next();
    } else if (tok.type == Tok::VarBegin) {
      next();
      auto s = std::make_unique<Stmt>();
      s->kind = SK::Output;
      s->line = cur().line;
      s->expr = parse_tuple(false, true, nullptr, false);
      expect(Tok::VarEnd, "end of print statement");
      body.push_back(std::move(s));
    } else if (tok.type == Tok::BlockBegin) {
      next();
      if (at_end_token(ends)) {
        end_stack_.pop_back();
        return body;
      }
      parse_statement(body);
      expect(Tok::BlockEnd, "end of statement block");
    } else {
      fail("internal parsing error");
    }
  }
  if (ends) end_stack_.pop_back();
  return body;
}

Body Parser::parse_statements(Ends ends, bool drop_needle) {
  skip_op(":");
  expect(Tok::BlockEnd, "end of statement block");
  Body b = subparse(&ends);
  if (cur().type == Tok::Eof) fail_eof(&ends);
  if (drop_needle) next();
  return b;
}

// jinja2's _fail_ut_eof: the message names what the parser was looking for.
void Parser::fail_ut_eof(const std::string* name, std::vector<Ends> stack, int line) {
  std::vector<std::string> expected;
  for (const auto& e : stack)
    for (const char* x : e) expected.push_back(x);
  std::string msg = name ? fmt::format("Encountered unknown tag '{}'.", *name) : "Unexpected end of template.";
  if (!stack.empty()) {
    std::string looking;
    for (const char* x : stack.back()) looking += (looking.empty() ? "'" : " or '") + std::string(x) + "'";
    if (name && std::find(expected.begin(), expected.end(), *name) != expected.end())
      msg += " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " +
             looking + ".";
    else
      msg += " Jinja was looking for the following tags: " + looking + ".";
  }
  if (!tag_stack_.empty()) msg += fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
  fail(msg, line);
}
void Parser::fail_eof(const Ends* ends) {
  auto stack = end_stack_;
  if (ends) stack.push_back(*ends);
  fail_ut_eof(nullptr, stack, cur().line);
}

std::unique_ptr<Stmt> Parser::stmt(SK k, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = k;
  s->line = line;
  return s;
}

void Parser::parse_statement(Body& out) {
  const Token& tok = cur();
  if (tok.type != Tok::Name) fail("tag name expected", tok.line);
  const std::string name = tok.text;
  const int line = tok.line;
  static const char* const kKnown[] = {"for", "if", "set", "macro", "call", "filter", "with", "print",
                                       "block", "generation", "break", "continue"};
  bool known = false;
  for (const char* k : kKnown) known |= name == k;
  for (const char* kw : kStatementKeywords) {
    // extends, include, import, from, autoescape: nothing to load templates from, and
    // no autoescaping in transformers' environment.
    if (name == kw && !known) fail(fmt::format("'{}' is not supported in chat templates", name), line);
  }
  if (!known) fail_ut_eof(&name, end_stack_, line);
  tag_stack_.push_back(name);
  struct Pop {
    std::vector<std::string>& s;
    ~Pop() { s.pop_back(); }
  } pop{tag_stack_};
  if (name == "for") return out.push_back(parse_for());
  if (name == "if") return out.push_back(parse_if());
  if (name == "set") return out.push_back(parse_set());
  if (name == "macro") return out.push_back(parse_macro());
  if (name == "call") return out.push_back(parse_call_block());
  if (name == "filter") return out.push_back(parse_filter_block());
  if (name == "with") return out.push_back(parse_with());
  if (name == "print") {
    next();
    bool first = true;
    while (cur().type != Tok::BlockEnd) {
      if (!first) expect_op(",");
      first = false;
      auto s = stmt(SK::Output, cur().line);
      s->expr = parse_expression(true);
      out.push_back(std::move(s));
    }
    return;
  }
  if (name == "block" || name == "generation") {
    // {% block %} renders in place (there is no inheritance without a loader);
    // {% generation %} is transformers' assistant-mask marker: just its body.
    next();
    auto s = stmt(SK::Scope, line);
    if (name == "block") {
      std::string bname = expect_any_name().text;
      skip_name("scoped");
      skip_name("required");
      s->body = parse_statements({"endblock"}, true);
      skip_name(bname.c_str());
    } else {
      s->body = parse_statements({"endgeneration"}, true);
    }
    return out.push_back(std::move(s));
  }
  // break / continue (jinja2.ext.loopcontrols)
  next();
  if (loop_depth_ == 0) fail(fmt::format("'{}' outside loop", name), line);
  out.push_back(stmt(name == "break" ? SK::Break : SK::Continue, line));
}

std::unique_ptr<Stmt> Parser::parse_for() {
  auto s = stmt(SK::For, expect_name("for").line);
  s->target = parse_assign_target(true, false, "in", false);
  expect_name("in");
  s->expr = parse_tuple(false, false, "recursive", false);
  if (skip_name("if")) s->cond = parse_expression(true);
  s->recursive = skip_name("recursive");
  ++loop_depth_;
  s->body = parse_statements({"endfor", "else"}, false);
  --loop_depth_;
  if (next().text != "endfor") s->else_body = parse_statements({"endfor"}, true);
  return s;
}

std::unique_ptr<Stmt> Parser::parse_if() {
  auto s = stmt(SK::If, expect_name("if").line);
  while (true) {
    s->conds.push_back(parse_tuple(false, false, nullptr, false));
    s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
    const Token& t = next();
    if (t.text == "elif") continue;
    if (t.text == "else") s->else_body = parse_statements({"endif"}, true);
    break;
  }
  return s;
}

std::unique_ptr<Stmt> Parser::parse_set() {
  auto s = stmt(SK::Set, next().line);
  s->target = parse_assign_target(true, false, nullptr, true);
  if (skip_op("=")) {
    s->expr = parse_tuple(false, true, nullptr, false);
    return s;
  }
  s->kind = SK::SetBlock;
  s->expr = parse_filter(nullptr, false);
  int saved = loop_depth_;
  s->body = parse_statements({"endset"}, true);
  loop_depth_ = saved;
  return s;
}

std::unique_ptr<Stmt> Parser::parse_with() {
  auto s = stmt(SK::With, next().line);
  while (cur().type != Tok::BlockEnd) {
    if (!s->targets.empty()) expect_op(",");
    s->targets.push_back(parse_assign_target(true, false, nullptr, false));
    expect_op("=");
    s->values.push_back(parse_expression(true));
  }
  s->body = parse_statements({"endwith"}, true);
  return s;
}

void Parser::parse_signature(Stmt& s) {
  expect_op("(");
  while (!is_op(")")) {
    if (!s.params.empty()) expect_op(",");
    s.params.push_back(expect_any_name().text);
    if (skip_op("=")) s.defaults.push_back(parse_expression(true));
    else if (!s.defaults.empty()) fail("non-default argument follows default argument");
  }
  expect_op(")");
}

// A macro body is a function: break/continue there do not reach an enclosing loop.
Body Parser::parse_function_body(const char* end) {
  int saved = loop_depth_;
  loop_depth_ = 0;
  Body b = parse_statements({end}, true);
  loop_depth_ = saved;
  return b;
}

std::unique_ptr<Stmt> Parser::parse_macro() {
  auto s = stmt(SK::Macro, next().line);
  s->text = expect_any_name().text;
  parse_signature(*s);
  s->body = parse_function_body("endmacro");
  scan_specials(*s);
  return s;
}

std::unique_ptr<Stmt> Parser::parse_call_block() {
  auto s = stmt(SK::CallBlock, next().line);
  if (is_op("(")) parse_signature(*s);
  s->expr = parse_expression(true);
  if (s->expr->kind != EK::Call) fail("expected call", s->line);
  s->body = parse_function_body("endcall");
  scan_specials(*s);
  return s;
}

std::unique_ptr<Stmt> Parser::parse_filter_block() {
  auto s = stmt(SK::FilterBlock, next().line);
  s->expr = parse_filter(nullptr, true);
  s->body = parse_statements({"endfilter"}, true);
  return s;
}

// Whether a macro body reads caller / varargs / kwargs (jinja2's find_undeclared):
// only then does the macro accept a caller, extra positional or keyword arguments.
void Parser::scan_specials(Stmt& m) {
  struct V {
    Stmt& m;
    void e(const Expr* x) {
      if (!x) return;
      if (x->kind == EK::Name) {
        m.uses_caller |= x->name == "caller";
        m.uses_varargs |= x->name == "varargs";
        m.uses_kwargs |= x->name == "kwargs";
      }
      for (const auto& a : x->args) e(a.get());
      for (const auto& kv : x->kwargs) e(kv.second.get());
      e(x->dyn_args.get());
      e(x->dyn_kwargs.get());
    }
    void b(const Body& body) {
      for (const auto& s : body) {
        e(s->expr.get());
        e(s->cond.get());
        for (const auto& c : s->conds) e(c.get());
        for (const auto& bb : s->bodies) b(bb);
        b(s->body);
        b(s->else_body);
        for (const auto& d : s->defaults) e(d.get());
        for (const auto& v : s->values) e(v.get());
      }
    }
  } v{m};
  v.b(m.body);
}

// ---- assignment targets ------------------------------------------------------------------
Target Parser::to_target(const Expr& e) {
  Target t;
  switch (e.kind) {
    case EK::Name: t.name = e.name; return t;
    case EK::NSRef:
      t.kind = Target::NSRef;
      t.name = e.name;
      t.attr = e.attr;
      return t;
    case EK::Tuple:
      t.kind = Target::Tuple;
      for (const auto& a : e.args) t.items.push_back(to_target(*a));
      return t;
    default: {
      static const char* const names[] = {"const", "name", "nsref", "getattr", "getitem", "slice", "call",
                                          "filter", "test", "neg", "pos", "not", "bin", "and", "or",
                                          "concat", "compare", "condexpr", "list", "tuple", "dict"};
      fail(fmt::format("can't assign to '{}'", names[static_cast<int>(e.kind)]), e.line);
    }
  }
}

Target Parser::parse_assign_target(bool with_tuple, bool name_only, const char* extra_end, bool with_ns) {
  ExprP e = with_tuple ? parse_tuple(true, true, extra_end, false, with_ns) : parse_primary(with_ns);
  return to_target(*e);
}

namespace {

// jinja2's compiler rejects an unknown filter or test when it compiles the template,
// except inside an if statement or a conditional expression (a "soft" frame), where it
// only fails if the node runs.
void check_names(const Expr* e, bool soft, Ctx& c) {
  if (!e) return;
  if (e->kind == EK::Cond) soft = true;
  if ((e->kind == EK::Filter || e->kind == EK::Test) && e->filter_id < 0 && !soft) {
    c.line = e->line;
    c.fail(fmt::format("TemplateAssertionError: No {} named '{}'.", e->kind == EK::Filter ? "filter" : "test",
                       e->name));
  }
  for (const auto& a : e->args) check_names(a.get(), soft, c);
  for (const auto& kv : e->kwargs) check_names(kv.second.get(), soft, c);
  check_names(e->dyn_args.get(), soft, c);
  check_names(e->dyn_kwargs.get(), soft, c);
}

void check_names(const Body& body, bool soft, Ctx& c) {
  for (const auto& s : body) {
    bool inner = s->kind == SK::If ? true : soft;
    check_names(s->expr.get(), inner, c);
    check_names(s->cond.get(), soft, c);
    for (const auto& x : s->conds) check_names(x.get(), inner, c);
    for (const auto& b : s->bodies) check_names(b, inner, c);
    for (const auto& d : s->defaults) check_names(d.get(), false, c);
    for (const auto& v : s->values) check_names(v.get(), soft, c);
    // Loop, macro, call, filter, with and set-block bodies get a new (hard) frame.
    bool body_soft = s->kind == SK::If || s->kind == SK::Scope ? inner : false;
    check_names(s->body, body_soft, c);
    check_names(s->else_body, s->kind == SK::If ? true : false, c);
  }
}

}  // namespace

Program parse(std::vector<Token> tokens, Ctx& c) {
  Program p = Parser(std::move(tokens), c).run();
  check_names(p.body, false, c);
  return p;
}

}  // namespace moe::jinja::detail
