// Constant folding, as jinja2's optimizer does it when it compiles a template: every
// expression that can be evaluated without the context (no names, no calls) is evaluated
// once at parse time and replaced by its value. Mostly a speed-up, but also observable:
// the fold goes through Expr.as_const, whose getitem is the sandbox's forgiving one, so a
// constant slice of a non-sequence ("{{ (2)[1:] }}") is Undefined rather than a TypeError,
// and `and` / `or` / `if` fold when only the branch they take is constant. A folded value
// replaces its node only when it has a "safe repr" (no Undefined, generator or object in
// it), except for a whole {{ }} expression, which jinja2 folds to its text regardless.
#include "core/check.h"
#include "text/jinja_eval.h"

namespace moe::jinja::detail {

bool needs_context(const Expr& e) {
  if (e.kind != EK::Filter) return false;
  for (const char* f : {"map", "select", "reject", "selectattr", "rejectattr"})
    if (e.name == f) return true;
  return false;
}

std::optional<Value> Interp::try_fold(const Expr& e) {
  if (!frame_) frame_ = std::make_shared<Frame>();
  struct Folding {
    bool& f;
    explicit Folding(bool& flag) : f(flag) { f = true; }
    ~Folding() { f = false; }
  } guard(folding_);
  try {
    return eval(e);
  } catch (const Impossible&) {
  } catch (const moe::Error&) {
    // jinja2 leaves the node to run (and fail, if it runs) at render time.
  }
  return std::nullopt;
}

namespace {

// nodes.Const.from_untrusted: has_safe_repr.
bool safe_repr(const Value& v) {
  switch (v.type()) {
    case T::Undefined:
    case T::Iter:
    case T::Obj: return false;
    case T::List:
      if (v.list().kind != LKind::List && v.list().kind != LKind::Tuple && v.list().kind != LKind::Range)
        return false;
      for (const Value& x : v.list().items)
        if (!safe_repr(x)) return false;
      return true;
    case T::Dict:
      for (const auto& [k, x] : v.dict().items)
        if (!safe_repr(k) || !safe_repr(x)) return false;
      return true;
    default: return true;
  }
}

// A folded value lives as long as the template: big ones are recomputed instead.
bool small(const Value& v) {
  if (v.is_str()) return v.s().size() <= (64u << 10);
  if (v.is(T::List)) return v.list().items.size() <= 4096;
  if (v.is(T::Dict)) return v.dict().items.size() <= 4096;
  return true;
}

bool foldable_kind(EK k) {
  switch (k) {
    case EK::Getattr: case EK::Getitem: case EK::Slice: case EK::Filter: case EK::Test: case EK::Neg:
    case EK::Pos: case EK::Not: case EK::Bin: case EK::And: case EK::Or: case EK::Concat: case EK::Compare:
    case EK::Cond: case EK::List: case EK::Tuple: case EK::Dict:
      return true;
    default: return false;
  }
}

struct Folder {
  Interp& in;

  // Folds below `e`, then `e` itself; returns whether `e` can be evaluated without the
  // context (so a parent may try to fold).
  bool fold(ExprP& e, bool output_root) {
    if (!e) return true;
    if (e->kind == EK::Const) return true;
    bool all = true;
    for (auto& a : e->args) all &= fold(a, false);
    for (auto& kv : e->kwargs) all &= fold(kv.second, false);
    if (e->dyn_args) all &= fold(e->dyn_args, false);
    if (e->dyn_kwargs) all &= fold(e->dyn_kwargs, false);
    if (!foldable_kind(e->kind)) return false;
    if (e->kind == EK::Slice) return all;  // only meaningful inside its Getitem
    // and / or / if evaluate lazily: a constant first operand may be enough.
    bool lazy_ok = (e->kind == EK::And || e->kind == EK::Or) ? evaluable(*e->args[0])
                   : e->kind == EK::Cond                     ? evaluable(*e->args[1])
                                                             : false;
    if (!all && !lazy_ok) return false;
    std::optional<Value> v = in.try_fold(*e);
    if (!v) return false;
    if ((output_root || safe_repr(*v)) && small(*v)) {
      auto c = std::make_unique<Expr>();
      c->kind = EK::Const;
      c->line = e->line;
      c->value = std::move(*v);
      e = std::move(c);
    }
    return true;
  }

  static bool evaluable(const Expr& e) {
    if (e.kind == EK::Const) return true;
    if (!foldable_kind(e.kind)) return false;
    for (const auto& a : e.args)
      if (a && !evaluable(*a)) return false;
    for (const auto& kv : e.kwargs)
      if (!evaluable(*kv.second)) return false;
    return true;
  }

  void body(Body& b) {
    for (auto& s : b) {
      fold(s->expr, s->kind == SK::Output);
      fold(s->cond, false);
      for (auto& c : s->conds) fold(c, false);
      for (auto& x : s->bodies) body(x);
      body(s->body);
      body(s->else_body);
      for (auto& d : s->defaults) fold(d, false);
      for (auto& v : s->values) fold(v, false);
    }
  }
};

}  // namespace

void fold_constants(Program& p, const std::string& name, const Options& opt) {
  Interp in(name, opt);
  in.set_stack_base();
  Folder{in}.body(p.body);
}

}  // namespace moe::jinja::detail
