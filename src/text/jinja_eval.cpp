// The Jinja interpreter: walks the AST of jinja_parser.h with jinja2's runtime semantics
// (scoping, loops, macros and callers, undefined values, sandboxed attribute access) and
// Python's operator semantics, under the step/depth/size budget of Options. Also the
// public moe::jinja::Template.
#include <cmath>
#include <functional>

#include "core/check.h"
#include "text/jinja.h"
#include "text/jinja_eval.h"

namespace moe::jinja::detail {

// ---- undefined messages (jinja2 Undefined._undefined_message) ------------------------------

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (is_namespace(v)) return "transformers.utils.chat_template_utils.TemplateNamespace object";
  if (v.is(T::Obj) && std::string_view(v.obj().type_name()) == "LoopContext") return "jinja2.runtime.LoopContext object";
  if (v.is(T::Obj) && std::string_view(v.obj().type_name()) == "Macro") return "jinja2.runtime.Macro object";
  if (v.is(T::Obj)) return std::string(v.obj().type_name()) + " object";
  return std::string(type_name(v)) + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined(
      fmt::format("UndefinedError: '{}' has no attribute {}", object_type_repr(obj), str_repr(name)));
}

Value missing_item(Ctx& c, const Value& obj, const Value& key) {
  if (key.is_str()) return missing_attr(obj, key.s());
  std::string k;
  repr(c, key, k);
  return Value::undefined(fmt::format("UndefinedError: {} has no element {}", object_type_repr(obj), k));
}

// ---- Interp --------------------------------------------------------------------------------------

Interp::Interp(const std::string& name, const Options& opt) : Ctx(name, opt) {}

Interp::~Interp() {
  // Empty every macro and namespace first, holding them all, so nothing they reference
  // is freed while another still points at it; then let them go.
  std::vector<std::shared_ptr<Object>> alive;
  for (auto& w : tracked_)
    if (auto p = w.lock()) alive.push_back(std::move(p));
  for (auto& p : alive) p->unlink();
  frame_.reset();
}

std::string Interp::run(const Program& prog, const Value& context) {
  if (!has_stack_base()) set_stack_base();
  auto globals = std::make_shared<Frame>();
  add_globals(*this, *globals);
  auto ctx = std::make_shared<Frame>();
  ctx->parent = globals;
  if (context.is(T::Dict)) {
    for (const auto& [k, v] : context.dict().items)
      if (k.is_str()) ctx->vars[k.s()] = v;
  }
  frame_ = std::make_shared<Frame>();
  frame_->parent = ctx;
  std::string result;
  out_ = &result;
  exec(prog.body);
  out_ = nullptr;
  return result;
}

std::string Interp::render_body(const Body& body, FramePtr frame) {
  std::string buf;
  render_body(body, std::move(frame), buf);
  return buf;
}

Interp::Flow Interp::render_body(const Body& body, FramePtr frame, std::string& buf) {
  std::string* saved_out = out_;
  FramePtr saved = frame_;
  out_ = &buf;
  frame_ = std::move(frame);
  Flow fl = exec(body);
  frame_ = saved;
  out_ = saved_out;
  return fl;
}

void Interp::emit(const Value& v) {
  size_t before = out_->size();
  to_str(*this, v, *out_);
  size_t added = out_->size() - before;
  if (added >= 64) step(static_cast<int64_t>(added / 64));
  if (out_->size() > static_cast<size_t>(opt().max_output))
    fail(fmt::format("output too large (more than {} bytes)", opt().max_output));
}

Interp::Flow Interp::exec(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec_stmt(const Stmt& s) {
  step();
  check_stack();
  // Statements share the evaluation-depth budget with expressions: macro recursion
  // through deeply nested blocks is bounded as a whole.
  if (++eval_depth_ > opt().max_depth * 10)
    fail("RecursionError: maximum recursion depth exceeded (evaluation nests too deeply)");
  struct Unnest {
    int& d;
    ~Unnest() { --d; }
  } unnest{eval_depth_};
  line = s.line;
  switch (s.kind) {
    case SK::Text:
      out_->append(s.text);
      if (out_->size() > static_cast<size_t>(opt().max_output))
        fail(fmt::format("output too large (more than {} bytes)", opt().max_output));
      return Flow::Normal;
    case SK::Output: emit(eval(*s.expr)); return Flow::Normal;
    case SK::If:
      for (size_t i = 0; i < s.conds.size(); ++i)
        if (truthy(eval(*s.conds[i]))) return exec(s.bodies[i]);
      return exec(s.else_body);
    case SK::For: run_loop(s, eval(*s.expr), 1, false); return Flow::Normal;
    case SK::Set: assign(s.target, eval(*s.expr)); return Flow::Normal;
    case SK::SetBlock:
    case SK::FilterBlock: {
      auto f = std::make_shared<Frame>();
      f->parent = frame_;
      // jinja2 compiles these bodies inline: a break/continue inside leaves the
      // enclosing loop at once, and the block is neither assigned nor output.
      std::string text;
      Flow fl = render_body(s.body, f, text);
      if (fl != Flow::Normal) return fl;
      Value body = Value::str(std::move(text));
      line = s.line;
      // The filter chain's innermost subject is null: it stands for the body's text.
      std::vector<const Expr*> chain;
      for (const Expr* e = s.expr.get(); e; e = e->args.empty() ? nullptr : e->args[0].get()) chain.push_back(e);
      Value v = body;
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        const Expr& fe = **it;
        Args a;
        eval_args(fe, 1, a);
        line = fe.line;
        if (fe.filter_id < 0) fail(fmt::format("TemplateRuntimeError: No filter named '{}'.", fe.name));
        v = apply_filter(*this, fe.filter_id, v, a);
      }
      if (s.kind == SK::SetBlock) assign(s.target, v);
      else emit(v);
      return Flow::Normal;
    }
    case SK::Macro: {
      auto m = std::make_shared<MacroObj>();
      m->def = &s;
      m->closure = frame_;
      m->name = s.text;
      track(m);
      frame_->vars[s.text] = Value::from(T::Obj, m);
      return Flow::Normal;
    }
    case SK::CallBlock: {
      auto m = std::make_shared<MacroObj>();
      m->def = &s;
      m->closure = frame_;
      m->name = "caller";
      track(m);
      const Expr& call = *s.expr;
      Value callee = eval(*call.args[0]);
      Args a;
      eval_args(call, 1, a);
      a.kw.emplace_back("caller", Value::from(T::Obj, m));
      line = s.line;
      emit(this->call(callee, a));
      return Flow::Normal;
    }
    case SK::With: {
      std::vector<Value> vals;
      for (const auto& v : s.values) vals.push_back(eval(*v));
      auto f = std::make_shared<Frame>();
      f->parent = frame_;
      FramePtr saved = frame_;
      frame_ = f;
      for (size_t i = 0; i < vals.size(); ++i) assign(s.targets[i], vals[i]);
      Flow fl = exec(s.body);
      frame_ = saved;
      return fl;
    }
    case SK::Scope: {
      auto f = std::make_shared<Frame>();
      f->parent = frame_;
      FramePtr saved = frame_;
      frame_ = f;
      Flow fl = exec(s.body);
      frame_ = saved;
      return fl;
    }
    case SK::Break: return Flow::Break;
    case SK::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

Value Interp::run_loop(const Stmt& s, const Value& iterable, int depth, bool capture) {
  line = s.line;
  std::vector<Value> all = iterate(*this, iterable);
  FramePtr outer = frame_;
  auto items = std::make_shared<std::vector<Value>>();
  if (s.cond) {
    // `for x in xs if cond`: filtered up front (loop.length counts what remains).
    for (auto& v : all) {
      auto f = std::make_shared<Frame>();
      f->parent = outer;
      frame_ = f;
      assign(s.target, v);
      if (truthy(eval(*s.cond))) items->push_back(std::move(v));
    }
    frame_ = outer;
  } else {
    *items = std::move(all);
  }
  std::string buf;
  std::string* saved_out = out_;
  if (capture) out_ = &buf;
  auto loop = std::make_shared<LoopObj>();
  loop->stmt = &s;
  loop->outer = outer;
  loop->items = items;
  loop->depth = depth;
  track(loop);
  Value loopv = Value::from(T::Obj, loop);
  // jinja2 runs the else block unless some iteration reached the end of the body: a
  // loop left by break (or whose every iteration hit continue) runs it too.
  bool completed = false;
  FramePtr f;
  size_t base_vars = 0;
  for (size_t i = 0; i < items->size(); ++i) {
    step();
    // A fresh scope per iteration; the previous one is reused when nothing (a macro
    // defined in the body) kept a reference to it.
    frame_ = outer;
    if (f && f.use_count() == 1) {
      // Only "loop" and the loop variables from the last iteration: they are all
      // overwritten below, so keep the entries (no reallocation per iteration).
      if (f->vars.size() > base_vars) f->vars.clear();
    } else {
      f = std::make_shared<Frame>();
      f->parent = outer;
    }
    frame_ = f;
    loop->index0 = static_cast<int64_t>(i);
    f->vars["loop"] = loopv;
    assign(s.target, (*items)[i]);
    if (i == 0) base_vars = f->vars.size();
    Flow fl = exec(s.body);
    if (fl == Flow::Break) break;
    if (fl == Flow::Normal) completed = true;
  }
  frame_ = outer;
  loop->active = false;
  if (!completed && !s.else_body.empty()) {
    auto f = std::make_shared<Frame>();
    f->parent = outer;
    frame_ = f;
    exec(s.else_body);
    frame_ = outer;
  }
  out_ = saved_out;
  return capture ? Value::str(std::move(buf)) : Value::none();
}

void Interp::assign(const Target& t, const Value& v) {
  switch (t.kind) {
    case Target::Name: frame_->vars[t.name] = v; return;
    case Target::Tuple: {
      if (!(v.is_undefined() || v.is_str() || v.is(T::List) || v.is(T::Dict) || v.is(T::Iter)))
        fail(fmt::format("TypeError: cannot unpack non-iterable {} object", type_name(v)));
      std::vector<Value> items = iterate(*this, v);
      if (items.size() > t.items.size())
        fail(fmt::format("ValueError: too many values to unpack (expected {})", t.items.size()));
      if (items.size() < t.items.size())
        fail(fmt::format("ValueError: not enough values to unpack (expected {}, got {})", t.items.size(),
                         items.size()));
      for (size_t i = 0; i < items.size(); ++i) assign(t.items[i], items[i]);
      return;
    }
    case Target::NSRef: {
      const Value* ns = frame_->lookup(t.name);
      if (!ns || !is_namespace(*ns))
        fail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
      namespace_set(*this, *ns, t.attr, v);
      return;
    }
  }
}

// ---- expressions -----------------------------------------------------------------------------------

void Interp::eval_args(const Expr& e, size_t first, Args& out) {
  for (size_t i = first; i < e.args.size(); ++i) out.pos.push_back(eval(*e.args[i]));
  for (const auto& [k, x] : e.kwargs) out.kw.emplace_back(k, eval(*x));
  if (e.dyn_args) {
    for (auto& v : iterate(*this, eval(*e.dyn_args))) out.pos.push_back(std::move(v));
  }
  if (e.dyn_kwargs) {
    Value d = eval(*e.dyn_kwargs);
    if (!d.is(T::Dict)) fail(fmt::format("TypeError: argument after ** must be a mapping, not {}", type_name(d)));
    for (const auto& [k, v] : d.dict().items) {
      if (!k.is_str()) fail("TypeError: keywords must be strings");
      out.kw.emplace_back(k.s(), v);
    }
  }
}

Value Interp::call(const Value& callee, Args& args) {
  step();
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.is(T::Obj) && callee.obj().callable()) return callee.obj().call(*this, args);
  fail(fmt::format("TypeError: '{}' object is not callable", type_name(callee)));
}

Value Interp::call_filter(const std::string& name, const Value& v, Args& args) {
  int id = find_filter(name);
  if (id < 0) fail(fmt::format("TemplateRuntimeError: No filter named '{}'.", name));
  return apply_filter(*this, id, v, args);
}

bool Interp::call_test(const std::string& name, const Value& v, Args& args) {
  int id = find_test(name);
  if (id < 0) fail(fmt::format("TemplateRuntimeError: No test named '{}'.", name));
  return apply_test(*this, id, v, args);
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (name.size() > 4 && name.compare(0, 2, "__") == 0 && name.compare(name.size() - 2, 2, "__") == 0) {
    // Python objects all have dunder attributes; the sandbox refuses them.
    return Value::undefined(fmt::format("SecurityError: access to attribute '{}' of '{}' object is unsafe.",
                                        name, type_name(obj)));
  }
  Value m;
  switch (obj.type()) {
    case T::Obj:
      if (obj.obj().get_attr(*this, name, m)) return m;
      break;
    case T::Dict:
      if (get_method(*this, obj, name, m)) return m;
      if (const Value* v = obj.dict().find_str(name)) return *v;
      break;
    default:
      if (get_method(*this, obj, name, m)) return m;
      break;
  }
  return missing_attr(obj, name);
}

namespace {
bool is_hashable(const Value& v) {
  if (v.is(T::Dict)) return false;
  if (v.is(T::List)) {
    if (v.list().kind != LKind::Tuple) return false;
    for (const Value& x : v.list().items)
      if (!is_hashable(x)) return false;
  }
  return true;
}
}  // namespace

Value Interp::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  switch (obj.type()) {
    case T::Dict:
      if (is_hashable(key)) {
        DepthGuard g(*this);
        if (const Value* v = obj.dict().find(hash_key(*this, key))) return *v;
      }
      break;
    case T::List: {
      const ListObj& l = obj.list();
      bool indexable = l.kind == LKind::List || l.kind == LKind::Tuple || l.kind == LKind::Range;
      if (indexable && key.is_intlike()) {
        int64_t n = static_cast<int64_t>(l.items.size()), i = key.i();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return l.items[static_cast<size_t>(i)];
      }
      break;
    }
    case T::Str:
      if (key.is_intlike()) {
        const std::string& s = obj.s();
        int64_t i = key.i();
        if (is_ascii(s)) {
          int64_t n = static_cast<int64_t>(s.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::str(std::string(1, s[static_cast<size_t>(i)]));
        } else {
          std::u32string u = decode(s);
          int64_t n = static_cast<int64_t>(u.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::str(encode(u.substr(static_cast<size_t>(i), 1)));
        }
      }
      break;
    default: break;
  }
  if (key.is_str()) {
    // The attribute, but not the item again (jinja2 SandboxedEnvironment.getitem).
    Value m;
    if (obj.is(T::Obj) && obj.obj().get_attr(*this, key.s(), m)) return m;
    if (!obj.is(T::Obj) && get_method(*this, obj, key.s(), m)) return m;
  }
  return missing_item(*this, obj, key);
}

Value Interp::eval_getitem(const Expr& e) {
  Value obj = eval(*e.args[0]);
  const Expr& k = *e.args[1];
  if (k.kind != EK::Slice) {
    Value key = eval(k);
    line = e.line;
    return getitem(obj, key);
  }
  // A slice is compiled to plain Python subscription: errors are not softened, except
  // when jinja2 folds it at compile time through the sandbox's forgiving getitem.
  Value parts[3];
  for (int i = 0; i < 3; ++i) parts[i] = k.args[i] ? eval(*k.args[i]) : Value::none();
  line = e.line;
  return slice(*this, obj, parts[0], parts[1], parts[2], folding_);
}

Value Interp::eval_call(const Expr& e) {
  Value callee = eval(*e.args[0]);
  Args a;
  eval_args(e, 1, a);
  line = e.line;
  return call(callee, a);
}

Value Interp::eval_compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t i = 0; i < e.cops.size(); ++i) {
    Value right = eval(*e.args[i + 1]);
    line = e.line;
    bool r;
    switch (e.cops[i]) {
      case CmpOp::Eq: r = py_eq(*this, left, right); break;
      case CmpOp::Ne: r = !py_eq(*this, left, right); break;
      case CmpOp::Lt: r = py_cmp(*this, left, right, "<") == -1; break;
      case CmpOp::Le: { int c = py_cmp(*this, left, right, "<="); r = c == -1 || c == 0; break; }
      case CmpOp::Gt: r = py_cmp(*this, left, right, ">") == 1; break;
      case CmpOp::Ge: { int c = py_cmp(*this, left, right, ">="); r = c == 1 || c == 0; break; }
      case CmpOp::In: r = contains(*this, right, left); break;
      case CmpOp::NotIn: r = !contains(*this, right, left); break;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interp::eval(const Expr& e) {
  step();
  check_stack();
  struct Nest {
    Interp& in;
    explicit Nest(Interp& i) : in(i) {
      if (++in.eval_depth_ > in.opt().max_depth * 10)
        in.fail("RecursionError: maximum recursion depth exceeded (evaluation nests too deeply)");
    }
    ~Nest() { --in.eval_depth_; }
  } nest(*this);
  line = e.line;
  if (folding_) {
    // Constant folding (jinja_fold.cpp): what jinja2's optimizer cannot evaluate at
    // compile time stops the fold.
    if (e.kind == EK::Name || e.kind == EK::Call || e.kind == EK::NSRef) throw Impossible{};
    if ((e.kind == EK::Filter || e.kind == EK::Test) && (e.filter_id < 0 || !e.args[0] || needs_context(e)))
      throw Impossible{};
  }
  switch (e.kind) {
    case EK::Const: return e.value;
    case EK::Name: {
      if (const Value* v = frame_->lookup(e.name)) return *v;
      return Value::undefined(fmt::format("UndefinedError: '{}' is undefined", e.name));
    }
    case EK::Getattr: {
      Value obj = eval(*e.args[0]);
      line = e.line;
      return getattr(obj, e.name);
    }
    case EK::Getitem: return eval_getitem(e);
    case EK::Call: return eval_call(e);
    case EK::Filter: {
      Value v = eval(*e.args[0]);
      Args a;
      eval_args(e, 1, a);
      line = e.line;
      if (e.filter_id < 0) fail(fmt::format("TemplateRuntimeError: No filter named '{}'.", e.name));
      return apply_filter(*this, e.filter_id, v, a);
    }
    case EK::Test: {
      Value v = eval(*e.args[0]);
      Args a;
      eval_args(e, 1, a);
      line = e.line;
      if (e.filter_id < 0) fail(fmt::format("TemplateRuntimeError: No test named '{}'.", e.name));
      return Value::boolean(apply_test(*this, e.filter_id, v, a));
    }
    case EK::Neg:
    case EK::Pos: {
      Value v = eval(*e.args[0]);
      line = e.line;
      if (v.is_undefined()) fail_undefined(v);
      const char* op = e.kind == EK::Neg ? "-" : "+";
      if (!v.is_number()) fail(fmt::format("TypeError: bad operand type for unary {}: '{}'", op, type_name(v)));
      if (e.kind == EK::Pos) return v.is(T::Float) ? v : Value::integer(v.i());
      if (v.is(T::Float)) return Value::real(-v.f());
      if (v.i() == INT64_MIN) fail("OverflowError: integer overflow (integers are 64-bit here)");
      return Value::integer(-v.i());
    }
    case EK::Not: return Value::boolean(!truthy(eval(*e.args[0])));
    case EK::Bin: {
      Value a = eval(*e.args[0]);
      Value b = eval(*e.args[1]);
      line = e.line;
      return binary_op(*this, e.bop, a, b);
    }
    case EK::And: {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    case EK::Or: {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    case EK::Concat: {
      std::string s;
      for (const auto& a : e.args) {
        size_t before = s.size();
        to_str(*this, eval(*a), s);
        step(static_cast<int64_t>((s.size() - before) / 64));
        check_size(s.size());
      }
      return Value::str(std::move(s));
    }
    case EK::Compare: return eval_compare(e);
    case EK::Cond: {
      if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
      if (e.args[2]) return eval(*e.args[2]);
      if (folding_) throw Impossible{};  // CondExpr.as_const leaves this to run time
      return Value::undefined(fmt::format(
          "UndefinedError: the inline if-expression on line {} evaluated to false and no else section was defined.",
          e.line));
    }
    case EK::List:
    case EK::Tuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a));
      return e.kind == EK::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case EK::Dict: {
      auto d = std::make_shared<DictObj>();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i]);
        Value v = eval(*e.args[i + 1]);
        line = e.line;
        d->set(*this, std::move(k), std::move(v));
      }
      return Value::from(T::Dict, d);
    }
    case EK::Slice:
    case EK::NSRef: fail("TemplateSyntaxError: unexpected expression");
  }
  return Value();
}

}  // namespace moe::jinja::detail

// ---- public API ------------------------------------------------------------------------------------

namespace moe::jinja {

struct Template::Impl {
  std::string name;
  Options opt;
  detail::Program prog;
};

Template::Template(const std::string& source, const std::string& name, Options opt)
    : impl_(std::make_unique<Impl>()) {
  impl_->name = name;
  impl_->opt = opt;
  detail::Ctx c(name, opt);
  c.set_stack_base();
  size_t bad = 0;
  if (!detail::validate_utf8(source, &bad)) {
    c.fail(fmt::format("the template is not valid UTF-8 (byte offset {})", bad));
  }
  impl_->prog = detail::parse(detail::lex(source, c), c);
  detail::fold_constants(impl_->prog, name, opt);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::json& context) const {
  detail::Interp in(impl_->name, impl_->opt);
  in.set_stack_base();
  return in.run(impl_->prog, detail::from_json(in, context));
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  detail::Interp in(impl_->name, impl_->opt);
  in.set_stack_base();
  return in.run(impl_->prog, detail::from_json(in, context));
}

}  // namespace moe::jinja
