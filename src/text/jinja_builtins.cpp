// Python operators (+ - * / // % ** with int/float/str/list semantics), `in`, slicing,
// Python's str-to-number parsing, HTML escaping, the namespace object and the template
// globals (range, dict, namespace, cycler, joiner, raise_exception, strftime_now) for the
// Jinja interpreter. (`str % args` itself is in jinja_format.cpp.)
#include <cmath>
#include <cstring>
#include <ctime>

#include "text/jinja_eval.h"

namespace moe::jinja::detail {

namespace {

[[noreturn]] void unsupported(Interp& in, const char* op, const Value& a, const Value& b) {
  in.fail(fmt::format("TypeError: unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
}

[[noreturn]] void overflow(Interp& in) { in.fail("OverflowError: integer overflow (integers are 64-bit here)"); }

bool is_seq(const Value& v) {
  return v.is_str() || (v.is(T::List) && (v.list().kind == LKind::List || v.list().kind == LKind::Tuple));
}

Value repeat(Interp& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_str()) {
    const std::string& s = seq.s();
    if (!s.empty() && static_cast<uint64_t>(n) > static_cast<uint64_t>(in.opt().max_output) / s.size())
      in.charge(static_cast<size_t>(in.opt().max_output) + 1);  // refuses: too large
    in.charge(s.size() * static_cast<size_t>(n));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::str(std::move(out));
  }
  const ListObj& l = seq.list();
  if (!l.items.empty() && static_cast<uint64_t>(n) > static_cast<uint64_t>(in.opt().max_output) / l.items.size())
    in.charge(static_cast<size_t>(in.opt().max_output) + 1);
  in.charge_items(l.items.size() * static_cast<size_t>(n));
  std::vector<Value> out;
  out.reserve(l.items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return l.kind == LKind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

// CPython's float floor division and modulo (Objects/floatobject.c float_divmod).
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Value int_pow(Interp& in, int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1)
      if (__builtin_mul_overflow(result, base, &result)) overflow(in);
    exp >>= 1;
    if (exp && __builtin_mul_overflow(base, base, &base)) overflow(in);
  }
  return Value::integer(result);
}

}  // namespace

Value binary_op(Interp& in, BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) in.fail_undefined(a);
  // str % x is str.__mod__, which accepts an Undefined argument (it prints as "").
  if (op == BinOp::Mod && a.is_str()) return Value::str(percent_format(in, a.s(), b));
  if (b.is_undefined()) in.fail_undefined(b);
  const bool ints = a.is_intlike() && b.is_intlike();
  const bool nums = a.is_number() && b.is_number();
  switch (op) {
    case BinOp::Add: {
      if (ints) {
        int64_t r;
        if (__builtin_add_overflow(a.i(), b.i(), &r)) overflow(in);
        return Value::integer(r);
      }
      if (nums) return Value::real(a.f() + b.f());
      if (a.is_str() && b.is_str()) {
        in.charge(a.s().size() + b.s().size());
        return Value::str(a.s() + b.s());
      }
      if (a.is(T::List) && b.is(T::List) && a.list().kind == b.list().kind &&
          (a.list().kind == LKind::List || a.list().kind == LKind::Tuple)) {
        in.charge_items(a.list().items.size() + b.list().items.size());
        std::vector<Value> out = a.list().items;
        out.insert(out.end(), b.list().items.begin(), b.list().items.end());
        return a.list().kind == LKind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      if (is_seq(a))
        in.fail(fmt::format("TypeError: can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b),
                            type_name(a)));
      unsupported(in, "+", a, b);
    }
    case BinOp::Sub: {
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(a.i(), b.i(), &r)) overflow(in);
        return Value::integer(r);
      }
      if (nums) return Value::real(a.f() - b.f());
      unsupported(in, "-", a, b);
    }
    case BinOp::Mul: {
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(a.i(), b.i(), &r)) overflow(in);
        return Value::integer(r);
      }
      if (nums) return Value::real(a.f() * b.f());
      if (is_seq(a) && b.is_intlike()) return repeat(in, a, b.i());
      if (is_seq(b) && a.is_intlike()) return repeat(in, b, a.i());
      if (is_seq(a) || is_seq(b))
        in.fail(fmt::format("TypeError: can't multiply sequence by non-int of type '{}'",
                            type_name(is_seq(a) ? b : a)));
      unsupported(in, "*", a, b);
    }
    case BinOp::Div:
      if (!nums) unsupported(in, "/", a, b);
      if (b.f() == 0) in.fail(ints ? "ZeroDivisionError: division by zero" : "ZeroDivisionError: float division by zero");
      return Value::real(a.f() / b.f());
    case BinOp::FloorDiv: {
      if (!nums) unsupported(in, "//", a, b);
      if (ints) {
        if (b.i() == 0) in.fail("ZeroDivisionError: integer division or modulo by zero");
        if (a.i() == INT64_MIN && b.i() == -1) overflow(in);
        int64_t q = a.i() / b.i();
        if ((a.i() % b.i() != 0) && ((a.i() < 0) != (b.i() < 0))) --q;
        return Value::integer(q);
      }
      if (b.f() == 0) in.fail("ZeroDivisionError: float floor division by zero");
      double q, m;
      float_divmod(a.f(), b.f(), q, m);
      return Value::real(q);
    }
    case BinOp::Mod: {
      if (a.is_str()) return Value::str(percent_format(in, a.s(), b));
      if (!nums) unsupported(in, "%", a, b);
      if (ints) {
        if (b.i() == 0) in.fail("ZeroDivisionError: integer modulo by zero");
        if (b.i() == -1) return Value::integer(0);
        int64_t m = a.i() % b.i();
        if (m != 0 && ((m < 0) != (b.i() < 0))) m += b.i();
        return Value::integer(m);
      }
      if (b.f() == 0) in.fail("ZeroDivisionError: float modulo");
      double q, m;
      float_divmod(a.f(), b.f(), q, m);
      return Value::real(m);
    }
    case BinOp::Pow: {
      if (!nums) unsupported(in, "** or pow()", a, b);
      if (ints && b.i() >= 0) return int_pow(in, a.i(), b.i());
      double x = a.f(), y = b.f();
      if (x == 0 && y < 0) in.fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) in.fail("ValueError: complex numbers are not supported");
      double r = std::pow(x, y);
      if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
        in.fail("OverflowError: (34, 'Numerical result out of range')");
      return Value::real(r);
    }
  }
  unsupported(in, "?", a, b);
}

bool contains(Interp& in, const Value& container, const Value& item) {
  switch (container.type()) {
    case T::Undefined: return false;
    case T::Str:
      if (!item.is_str())
        in.fail(fmt::format("TypeError: 'in <string>' requires string as left operand, not {}", type_name(item)));
      in.step(static_cast<int64_t>((container.s().size() + item.s().size()) / 64));
      return find_sub(container.s(), item.s()) != std::string::npos;
    case T::List:
      for (const Value& v : container.list().items) {
        in.step();
        if (py_eq(in, v, item)) return true;
      }
      return false;
    case T::Dict:
      if (item.is(T::Dict) || (item.is(T::List) && item.list().kind != LKind::Tuple))
        in.fail(fmt::format("TypeError: unhashable type: '{}'", type_name(item)));
      return container.dict().find(hash_key(in, item)) != nullptr;
    case T::Iter: {
      IterObj& it = container.iter();
      while (it.pos < it.items.size()) {
        in.step();
        if (py_eq(in, it.items[it.pos++], item)) return true;
      }
      return false;
    }
    default:
      in.fail(fmt::format("TypeError: argument of type '{}' is not iterable",
                          is_namespace(container) ? "TemplateNamespace" : type_name(container)));
  }
}

// ---- slicing ---------------------------------------------------------------------------------------

namespace {
int64_t slice_index(Interp& in, const Value& v, int64_t dflt) {
  if (v.is_none()) return dflt;
  if (!v.is_intlike())
    in.fail("TypeError: slice indices must be integers or None or have an __index__ method");
  return v.i();
}
}  // namespace

Value slice(Interp& in, const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v, bool soft) {
  if (obj.is_undefined()) in.fail_undefined(obj);
  bool ok = obj.is_str() || (obj.is(T::List) && (obj.list().kind == LKind::List || obj.list().kind == LKind::Tuple ||
                                                 obj.list().kind == LKind::Range));
  auto index_ok = [](const Value& v) { return v.is_none() || v.is_intlike(); };
  if (soft && (!ok || !index_ok(start_v) || !index_ok(stop_v) || !index_ok(step_v))) {
    std::string r = "slice(";
    for (const Value* p : {&start_v, &stop_v, &step_v}) {
      if (p != &start_v) r += ", ";
      repr(in, *p, r);
    }
    return Value::undefined(fmt::format("UndefinedError: {} has no element {})", object_type_repr(obj), r));
  }
  if (!ok) {
    if (obj.is(T::Dict)) in.fail("TypeError: unhashable type: 'slice'");
    in.fail(fmt::format("TypeError: '{}' object is not subscriptable", type_name(obj)));
  }
  int64_t step = slice_index(in, step_v, 1);
  if (step == 0) in.fail("ValueError: slice step cannot be zero");
  if (step == INT64_MIN) step = -INT64_MAX;
  int64_t start = slice_index(in, start_v, step < 0 ? INT64_MAX : 0);
  int64_t stop = slice_index(in, stop_v, step < 0 ? INT64_MIN : INT64_MAX);
  std::u32string u;
  bool ascii = obj.is_str() && is_ascii(obj.s());
  if (obj.is_str() && !ascii) u = decode(obj.s());
  int64_t len = obj.is_str() ? (ascii ? static_cast<int64_t>(obj.s().size()) : static_cast<int64_t>(u.size()))
                             : static_cast<int64_t>(obj.list().items.size());
  // PySlice_AdjustIndices
  auto adjust = [&](int64_t& i) {
    if (i < 0) {
      i = i < -len ? (step < 0 ? -1 : 0) : i + len;
    } else if (i >= len) {
      i = step < 0 ? len - 1 : len;
    }
  };
  adjust(start);
  adjust(stop);
  int64_t count = 0;
  if (step < 0) {
    if (stop < start) count = (start - stop - 1) / (-step) + 1;
  } else if (start < stop) {
    count = (stop - start - 1) / step + 1;
  }
  in.charge_items(static_cast<size_t>(count));
  if (obj.is_str()) {
    if (ascii && step == 1) return Value::str(obj.s().substr(static_cast<size_t>(start), static_cast<size_t>(count)));
    std::u32string out;
    for (int64_t k = 0, i = start; k < count; ++k, i += step)
      out += ascii ? static_cast<char32_t>(static_cast<unsigned char>(obj.s()[static_cast<size_t>(i)]))
                   : u[static_cast<size_t>(i)];
    return Value::str(encode(out));
  }
  const ListObj& l = obj.list();
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t k = 0, i = start; k < count; ++k, i += step) out.push_back(l.items[static_cast<size_t>(i)]);
  if (l.kind == LKind::Range) {
    auto r = std::make_shared<ListObj>();
    r->items = std::move(out);
    r->kind = LKind::Range;
    r->r_step = l.r_step * step;
    r->r_start = l.r_start + start * l.r_step;
    r->r_stop = l.r_start + (start + count * step) * l.r_step;
    return Value::from(T::List, r);
  }
  return l.kind == LKind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

// ---- str to number, HTML escaping ----------------------------------------------------------

std::string html_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

// Python's float() of a string: whitespace around, sign, digits with single
// underscores, inf/infinity/nan in any case.
bool parse_py_float(const std::string& raw, double& out) {
  std::string s = py_strip(raw, nullptr, true, true);
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1])))
        return false;
      continue;
    }
    t += s[i];
  }
  std::string l = py_lower(t);
  size_t p = (!l.empty() && (l[0] == '+' || l[0] == '-')) ? 1 : 0;
  std::string body = l.substr(p);
  if (body == "inf" || body == "infinity" || body == "nan") {
    double v = body == "nan" ? NAN : INFINITY;
    out = l[0] == '-' ? -v : v;
    return true;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end && *end == '\0' && !t.empty();
}

// Python's int(str, base).
bool parse_py_int(const std::string& raw, int64_t base, int64_t& out, bool& overflow) {
  overflow = false;
  std::string s = py_strip(raw, nullptr, true, true);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (i + 1 < s.size() && s[i] == '0') {
      char x = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + 1])));
      int64_t pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
      if (pb && (base == 0 || base == pb)) {
        base = pb;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36 || i >= s.size()) return false;
  unsigned __int128 v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char ch = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    if (ch == '_') {
      if (!prev_digit || i + 1 >= s.size()) return false;
      prev_digit = false;
      continue;
    }
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'z' ? ch - 'a' + 10 : 99;
    if (d >= base) return false;
    v = v * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (v > static_cast<unsigned __int128>(INT64_MAX) + 1) overflow = true;
    prev_digit = true;
  }
  if (!prev_digit) return false;
  if (overflow || (!neg && v > static_cast<unsigned __int128>(INT64_MAX))) {
    overflow = true;
    return true;
  }
  out = neg ? static_cast<int64_t>(-static_cast<__int128>(v)) : static_cast<int64_t>(v);
  return true;
}

// ---- namespace ------------------------------------------------------------------------------------

namespace {
struct NamespaceObj final : Object {
  std::shared_ptr<DictObj> attrs = std::make_shared<DictObj>();
  const char* type_name() const override { return "Namespace"; }
  void repr(Ctx& c, std::string& out) const override {
    out += "<Namespace ";
    detail::repr(c, Value::from(T::Dict, attrs), out);
    out += ">";
  }
  bool get_attr(Interp& in, const std::string& name, Value& out) override {
    if (const Value* v = attrs->find_str(name)) {
      out = *v;
      return true;
    }
    return false;
  }
  void unlink() override { attrs->items.clear(); attrs->index.clear(); }
};

void check_ns_name(Interp& in, const Value& k) {
  if (k.is_str() && !k.s().empty() && k.s()[0] == '_')
    in.fail(fmt::format("SecurityError: Chat templates cannot store underscore-prefixed attributes on a namespace, "
                        "but got {}. Please rename the attribute.", str_repr(k.s())));
}

// dict(*args, **kwargs) with at most one positional: a mapping or an iterable of pairs.
std::shared_ptr<DictObj> make_dict(Interp& in, Args& a, const char* fn) {
  auto d = std::make_shared<DictObj>();
  if (a.pos.size() > 1) in.fail(fmt::format("TypeError: {} expected at most 1 argument, got {}", fn, a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is(T::Dict)) {
      for (const auto& [k, v] : src.dict().items) d->set(in, k, v);
    } else {
      size_t i = 0;
      for (const Value& pair : iterate(in, src)) {
        std::vector<Value> kv = iterate(in, pair);
        if (kv.size() != 2)
          in.fail(fmt::format("ValueError: dictionary update sequence element #{} has length {}; 2 is required", i,
                              kv.size()));
        d->set(in, kv[0], kv[1]);
        ++i;
      }
    }
  }
  for (auto& [k, v] : a.kw) d->set(in, Value::str(k), v);
  return d;
}

struct CyclerState final : HeapObj {
  std::vector<Value> items;
  size_t pos = 0;
};

struct CyclerObj final : Object {
  std::shared_ptr<CyclerState> st = std::make_shared<CyclerState>();
  const char* type_name() const override { return "Cycler"; }
  bool get_attr(Interp& in, const std::string& name, Value& out) override;
};

bool CyclerObj::get_attr(Interp& in, const std::string& name, Value& out) {
  auto s = st;
  if (name == "current") out = s->items[s->pos];
  else if (name == "next")
    out = make_fn("next", [s](Interp&, Args&) {
      Value v = s->items[s->pos];
      s->pos = (s->pos + 1) % s->items.size();
      return v;
    });
  else if (name == "reset")
    out = make_fn("reset", [s](Interp&, Args&) {
      s->pos = 0;
      return Value::none();
    });
  else return false;
  return true;
}

Value make_range(Interp& in, Args& a) {
  if (!a.kw.empty()) in.fail("TypeError: range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3)
    in.fail(fmt::format("TypeError: range expected at least 1 argument, got {}", a.pos.size()));
  for (const Value& v : a.pos) {
    if (v.is_undefined()) in.fail_undefined(v);
    if (!v.is_intlike())
      in.fail(fmt::format("TypeError: '{}' object cannot be interpreted as an integer", type_name(v)));
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].i();
  } else {
    start = a.pos[0].i();
    stop = a.pos[1].i();
    if (a.pos.size() == 3) step = a.pos[2].i();
  }
  if (step == 0) in.fail("ValueError: range() arg 3 must not be zero");
  // len(range) without overflow: the sandbox refuses more than MAX_RANGE items.
  long double span = step > 0 ? (static_cast<long double>(stop) - start) : (static_cast<long double>(start) - stop);
  long double n = span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<long double>(step)));
  if (n > 100000)
    in.fail("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  auto r = std::make_shared<ListObj>();
  r->kind = LKind::Range;
  r->r_start = start;
  r->r_stop = stop;
  r->r_step = step;
  in.charge_items(static_cast<size_t>(n));
  for (int64_t k = 0, v = start; k < static_cast<int64_t>(n); ++k, v += step) r->items.push_back(Value::integer(v));
  return Value::from(T::List, r);
}

}  // namespace

bool is_namespace(const Value& v) { return v.is(T::Obj) && dynamic_cast<NamespaceObj*>(&v.obj()) != nullptr; }

void namespace_set(Interp& in, const Value& ns, const std::string& attr, Value v) {
  Value k = Value::str(attr);
  check_ns_name(in, k);
  static_cast<NamespaceObj&>(ns.obj()).attrs->set(in, std::move(k), std::move(v));
}

void add_globals(Interp& in, Frame& f) {
  f.vars["range"] = make_fn("range", make_range);
  f.vars["dict"] = make_fn("dict", [](Interp& in, Args& a) { return Value::from(T::Dict, make_dict(in, a, "dict")); });
  f.vars["namespace"] = make_fn("namespace", [](Interp& in, Args& a) {
    auto ns = std::make_shared<NamespaceObj>();
    ns->attrs = make_dict(in, a, "dict");
    for (const auto& kv : ns->attrs->items) check_ns_name(in, kv.first);
    in.track(ns);
    return Value::from(T::Obj, ns);
  });
  f.vars["cycler"] = make_fn("cycler", [](Interp& in, Args& a) {
    if (a.pos.empty()) in.fail("RuntimeError: at least one item has to be provided");
    auto c = std::make_shared<CyclerObj>();
    c->st->items = a.pos;
    return Value::from(T::Obj, c);
  });
  f.vars["joiner"] = make_fn("joiner", [](Interp& in, Args& a) {
    auto b = bind(in, a, "joiner", {"sep"});
    std::string sep = b[0] ? to_str(in, *b[0]) : ", ";
    auto used = std::make_shared<bool>(false);
    return make_fn("joiner", [sep, used](Interp&, Args&) {
      if (!*used) {
        *used = true;
        return Value::str("");
      }
      return Value::str(sep);
    });
  });
  f.vars["raise_exception"] = make_fn("raise_exception", [](Interp& in, Args& a) -> Value {
    auto b = bind(in, a, "raise_exception", {"message"});
    in.fail("TemplateError: " + (b[0] ? to_str(in, *b[0]) : std::string()));
  });
  f.vars["strftime_now"] = make_fn("strftime_now", [](Interp& in, Args& a) {
    auto b = bind(in, a, "strftime_now", {"format"});
    if (!b[0] || !b[0]->is_str()) in.fail("TypeError: strftime() argument 1 must be str");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    const std::string& f = b[0]->s();
    if (f.size() > 1000) in.fail("ValueError: strftime format too long");
    std::string buf(f.size() * 16 + 64, '\0');
    size_t n = f.empty() ? 0 : std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    buf.resize(n);
    return Value::str(buf);
  });
}

}  // namespace moe::jinja::detail
