// The objects a template can hold besides plain data: macros (and callers), loop
// contexts (loop.index, loop.cycle(), loop(...) recursion) and builtin functions /
// bound methods. See jinja_eval.h.
#include <functional>

#include "text/jinja_eval.h"

namespace moe::jinja::detail {

// ---- macros ---------------------------------------------------------------------------------

void MacroObj::repr(Ctx& c, std::string& out) const { out += "<Macro " + str_repr(name) + ">"; }

bool MacroObj::get_attr(Interp& in, const std::string& a, Value& out) {
  if (a == "name") out = Value::str(name);
  else if (a == "arguments") {
    std::vector<Value> names;
    for (const auto& p : def->params) names.push_back(Value::str(p));
    out = Value::tuple(std::move(names));
  } else if (a == "catch_kwargs") out = Value::boolean(def->uses_kwargs);
  else if (a == "catch_varargs") out = Value::boolean(def->uses_varargs);
  else if (a == "caller") out = Value::boolean(def->uses_caller);
  else return false;
  return true;
}

// jinja2 runtime.Macro.__call__, step by step (the checks and their order matter for
// which error a bad call gets).
Value MacroObj::call(Interp& in, Args& args) {
  Interp::CallGuard guard(in);
  const Stmt& d = *def;
  const size_t count = d.params.size();
  auto f = std::make_shared<Frame>();
  f->parent = closure;
  std::vector<std::optional<Value>> bound;
  for (size_t i = 0; i < count && i < args.pos.size(); ++i) bound.emplace_back(args.pos[i]);
  bool found_caller = false;
  auto& kw = args.kw;
  auto pop_kw = [&](const std::string& key) -> std::optional<Value> {
    for (auto it = kw.begin(); it != kw.end(); ++it) {
      if (it->first == key) {
        Value v = it->second;
        kw.erase(it);
        return v;
      }
    }
    return std::nullopt;
  };
  if (bound.size() != count) {
    for (size_t i = bound.size(); i < count; ++i) {
      bound.push_back(pop_kw(d.params[i]));
      if (d.params[i] == "caller") found_caller = true;
    }
  } else {
    for (const auto& p : d.params) found_caller |= p == "caller";
  }
  if (d.uses_caller && !found_caller) {
    std::optional<Value> c = pop_kw("caller");
    f->vars["caller"] = c ? *c : Value::undefined("UndefinedError: No caller defined");
  }
  if (d.uses_kwargs) {
    auto kd = std::make_shared<DictObj>();
    for (auto& [k, v] : kw) kd->set(in, Value::str(k), v);
    f->vars["kwargs"] = Value::from(T::Dict, kd);
  } else if (!kw.empty()) {
    for (const auto& kv : kw)
      if (kv.first == "caller")
        in.fail(fmt::format("TypeError: macro '{}' was invoked with two values for the special caller "
                            "argument. This is most likely a bug.", name));
    in.fail(fmt::format("TypeError: macro '{}' takes no keyword argument '{}'", name, kw.front().first));
  }
  if (d.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = count; i < args.pos.size(); ++i) rest.push_back(args.pos[i]);
    f->vars["varargs"] = Value::tuple(std::move(rest));
  } else if (args.pos.size() > count) {
    in.fail(fmt::format("TypeError: macro '{}' takes not more than {} argument(s)", name, count));
  }
  // Parameters in order; a default is evaluated in the macro's frame when the
  // parameter is missing, so it can use the parameters before it.
  const size_t first_default = count - d.defaults.size();
  FramePtr saved = in.frame_;
  in.frame_ = f;
  for (size_t i = 0; i < count; ++i) {
    if (bound[i]) {
      f->vars[d.params[i]] = *bound[i];
    } else if (i >= first_default) {
      f->vars[d.params[i]] = in.eval(*d.defaults[i - first_default]);
    } else {
      f->vars[d.params[i]] =
          Value::undefined(fmt::format("UndefinedError: parameter '{}' was not provided", d.params[i]));
    }
  }
  in.frame_ = saved;
  return Value::str(in.render_body(d.body, f));
}

// ---- loops -----------------------------------------------------------------------------------

void LoopObj::repr(Ctx& c, std::string& out) const {
  out += fmt::format("<LoopContext {}/{}>", index0 + 1, length());
}

Value LoopObj::call(Interp& interp, Args& args) {
  if (!stmt->recursive) interp.fail("TypeError: 'LoopContext' object is not callable");
  if (!active || args.pos.size() != 1 || !args.kw.empty())
    interp.fail("TypeError: loop() takes one iterable, inside its recursive loop");
  Interp::CallGuard guard(interp);
  FramePtr saved = interp.frame_;
  interp.frame_ = outer;
  Value r = interp.run_loop(*stmt, args.pos[0], depth + 1, true);
  interp.frame_ = saved;
  return r;
}

bool LoopObj::get_attr(Interp& interp, const std::string& a, Value& out) {
  const int64_t n = length();
  if (a == "index") out = Value::integer(index0 + 1);
  else if (a == "index0") out = Value::integer(index0);
  else if (a == "revindex") out = Value::integer(n - index0);
  else if (a == "revindex0") out = Value::integer(n - index0 - 1);
  else if (a == "first") out = Value::boolean(index0 == 0);
  else if (a == "last") out = Value::boolean(index0 == n - 1);
  else if (a == "length") out = Value::integer(n);
  else if (a == "depth") out = Value::integer(depth);
  else if (a == "depth0") out = Value::integer(depth - 1);
  else if (a == "previtem")
    out = index0 > 0 ? (*items)[index0 - 1] : Value::undefined("UndefinedError: there is no previous item");
  else if (a == "nextitem")
    out = index0 + 1 < n ? (*items)[index0 + 1] : Value::undefined("UndefinedError: there is no next item");
  else if (a == "cycle") {
    int64_t i = index0;
    out = make_fn("cycle", [i](Interp& in, Args& args) {
      if (args.pos.empty()) in.fail("TypeError: no items for cycling given");
      return args.pos[static_cast<size_t>(i) % args.pos.size()];
    });
  } else if (a == "changed") {
    auto st = changed;
    out = make_fn("changed", [st](Interp& in, Args& args) {
      Value now = Value::tuple(args.pos);
      if (st->has && py_eq(in, st->last, now)) return Value::boolean(false);
      st->has = true;
      st->last = now;
      return Value::boolean(true);
    });
  } else {
    return false;
  }
  return true;
}

// ---- builtin functions ---------------------------------------------------------------------

namespace {
// A Python builtin or bound method: a name and a function.
struct FnObj final : Object {
  std::string name;
  std::function<Value(Interp&, Args&)> fn;
  const char* type_name() const override { return "builtin_function_or_method"; }
  void repr(Ctx& c, std::string& out) const override { out += "<built-in function " + name + ">"; }
  bool callable() const override { return true; }
  Value call(Interp& in, Args& args) override { return fn(in, args); }
};
}  // namespace

Value make_fn(std::string name, std::function<Value(Interp&, Args&)> fn) {
  auto f = std::make_shared<FnObj>();
  f->name = std::move(name);
  f->fn = std::move(fn);
  return Value::from(T::Obj, f);
}

Value Object::call(Interp& in, Args& args) {
  in.fail(fmt::format("TypeError: '{}' object is not callable", type_name()));
}

}  // namespace moe::jinja::detail
