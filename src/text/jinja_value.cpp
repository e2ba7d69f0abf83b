// Python object semantics for the Jinja interpreter: the step budget, deferred
// destruction, printing (str/repr, Python's float repr), equality and ordering, hashing
// for dict keys, iteration and len(). JSON is in jinja_json.cpp, UTF-8 in jinja_utf8.cpp.
#include "text/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace moe::jinja::detail {

// ---- Ctx ---------------------------------------------------------------------------------

void Ctx::fail(const std::string& msg) const { MOE_FAIL("{}:{}: {}", name_, line, msg); }

#if defined(__SANITIZE_ADDRESS__)
constexpr uintptr_t kStackScale = 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr uintptr_t kStackScale = 4;
#else
constexpr uintptr_t kStackScale = 1;
#endif
#else
constexpr uintptr_t kStackScale = 1;
#endif

Ctx::Ctx(std::string name, const Options& opt) : name_(std::move(name)), opt_(opt) {
  stack_limit_ = static_cast<uintptr_t>(std::max<int64_t>(opt.max_stack, 64 << 10)) * kStackScale;
}

void Ctx::fail_stack() const {
  fail(fmt::format("RecursionError: maximum recursion depth exceeded (more than {} bytes of stack)", stack_limit_));
}

void Ctx::charge_text(std::string_view s) {
  step(static_cast<int64_t>(is_ascii(s) ? s.size() / 64 : s.size() / 4));
}

void Ctx::fail_budget() const {
  fail(fmt::format("template runs too long (more than {} evaluation steps)", opt_.max_steps));
}

void Ctx::fail_size(size_t n) const {
  fail(fmt::format("value too large ({} bytes or items; the limit is {})", n, opt_.max_output));
}

// ---- deferred destruction ------------------------------------------------------------------

namespace {
thread_local std::vector<HeapPtr>* g_grave = nullptr;
}

void bury(HeapPtr&& p) {
  // A shared object only loses a reference: no cascade.
  if (p.use_count() > 1) {
    p.reset();
    return;
  }
  if (g_grave) {
    g_grave->push_back(std::move(p));
    return;
  }
  std::vector<HeapPtr> grave;
  g_grave = &grave;
  grave.push_back(std::move(p));
  while (!grave.empty()) {
    HeapPtr x = std::move(grave.back());
    grave.pop_back();
    x.reset();  // its children's Values land in `grave`
  }
  g_grave = nullptr;
}

// ---- Value ---------------------------------------------------------------------------------

namespace {
struct UndefObj final : HeapObj {
  explicit UndefObj(std::string m) : msg(std::move(m)) {}
  std::string msg;
};
const std::string kEmpty;
const std::string kUndefMsg = "UndefinedError: value is undefined";
}  // namespace

Value Value::str(std::string s) { return from(T::Str, std::make_shared<StrObj>(std::move(s))); }
Value Value::markup(std::string s) {
  auto o = std::make_shared<StrObj>(std::move(s));
  o->markup = true;
  return from(T::Str, std::move(o));
}
Value Value::undefined(std::string msg) {
  return from(T::Undefined, std::make_shared<UndefObj>(std::move(msg)));
}
Value Value::list(std::vector<Value> items) {
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  return from(T::List, std::move(l));
}
Value Value::tuple(std::vector<Value> items) {
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  l->kind = LKind::Tuple;
  return from(T::List, std::move(l));
}
const std::string& Value::s() const {
  return t_ == T::Str ? static_cast<StrObj*>(p_.get())->s : kEmpty;
}
const std::string& Value::undef_msg() const {
  if (t_ == T::Undefined && p_) return static_cast<UndefObj*>(p_.get())->msg;
  return kUndefMsg;
}

// ---- Dict ----------------------------------------------------------------------------------

const Value* DictObj::find(const std::string& key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &items[it->second].second;
}

const Value* DictObj::find_str(std::string_view key) const {
  std::string k;
  k.reserve(key.size() + 1);
  k += 's';
  k += key;
  return find(k);
}

void DictObj::set(Ctx& c, Value key, Value value) {
  std::string k = hash_key(c, key);
  auto it = index.find(k);
  if (it != index.end()) {
    items[it->second].second = std::move(value);  // Python keeps the first key object
    return;
  }
  index.emplace(std::move(k), items.size());
  items.emplace_back(std::move(key), std::move(value));
}

// ---- Object ----------------------------------------------------------------------------------

void Object::repr(Ctx& c, std::string& out) const { out += fmt::format("<{} object>", type_name()); }

// ---- type names, truthiness ------------------------------------------------------------------

const char* type_name(const Value& v) {
  switch (v.type()) {
    case T::Undefined: return "Undefined";
    case T::None: return "NoneType";
    case T::Bool: return "bool";
    case T::Int: return "int";
    case T::Float: return "float";
    case T::Str: return "str";
    case T::List:
      switch (v.list().kind) {
        case LKind::List: return "list";
        case LKind::Tuple: return "tuple";
        case LKind::Range: return "range";
        case LKind::Keys: return "dict_keys";
        case LKind::Values: return "dict_values";
        case LKind::Items: return "dict_items";
      }
      return "list";
    case T::Dict: return "dict";
    case T::Iter: return v.iter().type_name;
    case T::Obj: return v.obj().type_name();
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case T::Undefined:
    case T::None: return false;
    case T::Bool:
    case T::Int: return v.i() != 0;
    case T::Float: return v.f() != 0.0;
    case T::Str: return !v.s().empty();
    case T::List: return !v.list().items.empty();
    case T::Dict: return !v.dict().items.empty();
    case T::Iter:
    case T::Obj: return true;  // generators are always true, as in Python
  }
  return false;
}

// ---- printing ---------------------------------------------------------------------------------

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: exponent form when the decimal
  // point would sit before -4 or after 16 digits, else fixed with at least one decimal.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exp10 = std::atoi(sci.c_str() + e + 1);
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    x = std::abs(x);
    if (x < 10) out += '0';
    out += std::to_string(x);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out.append(decpt - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, decpt);
    out += '.';
    out.append(digits, decpt);
  }
  return out;
}

namespace {
bool py_printable(char32_t c) {
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}
}  // namespace

std::string str_repr(std::string_view s) {
  bool has_sq = s.find('\'') != std::string_view::npos;
  bool has_dq = s.find('"') != std::string_view::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (py_printable(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
    }
  }
  out += q;
  return out;
}

namespace {
void repr_seq(Ctx& c, const std::vector<Value>& items, std::string& out, const char* open,
              const char* close) {
  out += open;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    repr(c, items[i], out);
  }
  out += close;
}
}  // namespace

void repr(Ctx& c, const Value& v, std::string& out) {
  c.step();
  if (out.size() > static_cast<size_t>(c.opt().max_output)) c.charge(out.size());
  switch (v.type()) {
    case T::Undefined: out += "Undefined"; return;
    case T::Str:
      c.step(static_cast<int64_t>(v.s().size() / 16));
      if (static_cast<StrObj*>(v.ptr().get())->markup) {  // markupsafe.Markup's repr
        out += "Markup(" + str_repr(v.s()) + ")";
      } else {
        out += str_repr(v.s());
      }
      return;
    case T::List: {
      DepthGuard g(c);
      const ListObj& l = v.list();
      switch (l.kind) {
        case LKind::List: repr_seq(c, l.items, out, "[", "]"); return;
        case LKind::Tuple:
          repr_seq(c, l.items, out, "(", l.items.size() == 1 ? ",)" : ")");
          return;
        case LKind::Range:
          out += l.r_step == 1 ? fmt::format("range({}, {})", l.r_start, l.r_stop)
                               : fmt::format("range({}, {}, {})", l.r_start, l.r_stop, l.r_step);
          return;
        case LKind::Keys: repr_seq(c, l.items, out, "dict_keys([", "])"); return;
        case LKind::Values: repr_seq(c, l.items, out, "dict_values([", "])"); return;
        case LKind::Items: repr_seq(c, l.items, out, "dict_items([", "])"); return;
      }
      return;
    }
    case T::Dict: {
      DepthGuard g(c);
      out += '{';
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        repr(c, k, out);
        out += ": ";
        repr(c, val, out);
      }
      out += '}';
      return;
    }
    case T::Iter: out += fmt::format("<{} object>", v.iter().type_name); return;
    case T::Obj: {
      DepthGuard g(c);
      v.obj().repr(c, out);
      return;
    }
    default: to_str(c, v, out); return;
  }
}

void to_str(Ctx& c, const Value& v, std::string& out) {
  switch (v.type()) {
    case T::Undefined: return;
    case T::None: out += "None"; return;
    case T::Bool: out += v.b() ? "True" : "False"; return;
    case T::Int: out += std::to_string(v.i()); return;
    case T::Float: out += float_repr(v.f()); return;
    case T::Str: out += v.s(); return;
    default: repr(c, v, out); return;
  }
}

std::string to_str(Ctx& c, const Value& v) {
  if (v.is_str()) return v.s();
  std::string s;
  to_str(c, v, s);
  return s;
}

// ---- equality, ordering, hashing -------------------------------------------------------------

namespace {
bool num_eq(const Value& a, const Value& b) {
  if (a.is_intlike() && b.is_intlike()) return a.i() == b.i();
  return a.f() == b.f();
}
// list == list and tuple == tuple compare items; a list never equals a tuple or a range.
bool seq_kind_eq(LKind a, LKind b) { return a == b; }
}  // namespace

bool py_eq(Ctx& c, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return num_eq(a, b);
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::Undefined:
    case T::None: return true;
    case T::Str:
      c.step(static_cast<int64_t>(a.s().size() / 64));
      return a.s() == b.s();
    case T::List: {
      const ListObj &x = a.list(), &y = b.list();
      if (!seq_kind_eq(x.kind, y.kind) || x.items.size() != y.items.size()) return false;
      DepthGuard g(c);
      for (size_t i = 0; i < x.items.size(); ++i) {
        c.step();
        if (!py_eq(c, x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case T::Dict: {
      const DictObj &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      DepthGuard g(c);
      for (const auto& [k, v] : x.items) {
        c.step();
        const Value* o = y.find(hash_key(c, k));
        if (!o || !py_eq(c, v, *o)) return false;
      }
      return true;
    }
    default: return a.ptr() == b.ptr();
  }
}

int py_cmp(Ctx& c, const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) c.fail(a.undef_msg());
  if (b.is_undefined()) c.fail(b.undef_msg());
  if (a.is_number() && b.is_number()) {
    if (a.is_intlike() && b.is_intlike()) return a.i() < b.i() ? -1 : a.i() > b.i() ? 1 : 0;
    double x = a.f(), y = b.f();
    if (std::isnan(x) || std::isnan(y)) return 2;  // unordered: every comparison is false
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_str() && b.is_str()) {
    c.step(static_cast<int64_t>(std::min(a.s().size(), b.s().size()) / 64));
    int r = a.s().compare(b.s());  // UTF-8 byte order is code point order
    return r < 0 ? -1 : r > 0 ? 1 : 0;
  }
  if (a.is(T::List) && b.is(T::List) && a.list().kind == b.list().kind &&
      (a.list().kind == LKind::List || a.list().kind == LKind::Tuple)) {
    DepthGuard g(c);
    const auto &x = a.list().items, &y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      c.step();
      if (!py_eq(c, x[i], y[i])) return py_cmp(c, x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  c.fail(fmt::format("TypeError: '{}' not supported between instances of '{}' and '{}'", op,
                     type_name(a), type_name(b)));
}

std::string hash_key(Ctx& c, const Value& v) {
  switch (v.type()) {
    case T::Undefined: return "U";
    case T::None: return "N";
    case T::Bool:
    case T::Int: return fmt::format("n{}", v.i());
    case T::Float: {
      double d = v.f();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18)
        return fmt::format("n{}", static_cast<int64_t>(d));
      return fmt::format("f{}", float_repr(d));
    }
    case T::Str: {
      c.step(static_cast<int64_t>(v.s().size() / 64));
      std::string k;
      k.reserve(v.s().size() + 1);
      k += 's';
      k += v.s();
      return k;
    }
    case T::List:
      if (v.list().kind == LKind::Tuple) {
        DepthGuard g(c);
        std::string k = "t";
        for (const Value& x : v.list().items) {
          std::string e = hash_key(c, x);
          k += std::to_string(e.size());
          k += ':';
          k += e;
        }
        return k;
      }
      break;
    case T::Dict: break;
    default: return fmt::format("o{}", static_cast<const void*>(v.ptr().get()));
  }
  c.fail(fmt::format("TypeError: unhashable type: '{}'", type_name(v)));
}

// ---- iteration -----------------------------------------------------------------------------------

std::vector<Value> iterate(Ctx& c, const Value& v) {
  switch (v.type()) {
    case T::Undefined: return {};
    case T::Str: {
      std::vector<Value> out;
      const std::string& s = v.s();
      c.charge_items(s.size());
      for (size_t i = 0; i < s.size();) {
        size_t n = 1;
        unsigned char b = static_cast<unsigned char>(s[i]);
        if (b >= 0xF0) n = 4;
        else if (b >= 0xE0) n = 3;
        else if (b >= 0xC0) n = 2;
        n = std::min(n, s.size() - i);
        out.push_back(Value::str(s.substr(i, n)));
        i += n;
      }
      return out;
    }
    case T::List: c.charge_items(v.list().items.size()); return v.list().items;
    case T::Dict: {
      std::vector<Value> out;
      c.charge_items(v.dict().items.size());
      for (const auto& kv : v.dict().items) out.push_back(kv.first);
      return out;
    }
    case T::Iter: {
      IterObj& it = v.iter();
      std::vector<Value> out(it.items.begin() + static_cast<ptrdiff_t>(it.pos), it.items.end());
      it.pos = it.items.size();
      c.charge_items(out.size());
      return out;
    }
    default: break;
  }
  c.fail(fmt::format("TypeError: '{}' object is not iterable", type_name(v)));
}

int64_t py_len(Ctx& c, const Value& v) {
  switch (v.type()) {
    case T::Undefined: return 0;
    case T::Str: return static_cast<int64_t>(cp_len(v.s()));
    case T::List: return static_cast<int64_t>(v.list().items.size());
    case T::Dict: return static_cast<int64_t>(v.dict().items.size());
    default: break;
  }
  c.fail(fmt::format("TypeError: object of type '{}' has no len()", type_name(v)));
}

}  // namespace moe::jinja::detail
