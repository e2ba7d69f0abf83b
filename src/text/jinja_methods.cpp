// Methods of str, dict and list values as a template sees them (s.split(','),
// d.items(), xs.index(2), '{}'.format(x)), with ImmutableSandboxedEnvironment's refusal
// of the mutating ones. Code-point semantics throughout (indices, widths, case).
#include <utf8proc.h>

#include <algorithm>

#include "text/jinja_eval.h"

namespace moe::jinja::detail {

namespace {

using B = std::vector<std::optional<Value>>;

utf8proc_category_t cat(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
bool is_cased(char32_t c) {
  auto k = cat(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
bool is_alpha(char32_t c) { return cat(c) >= UTF8PROC_CATEGORY_LU && cat(c) <= UTF8PROC_CATEGORY_LO; }
bool is_decimal(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; }
bool is_numeric(char32_t c) {
  auto k = cat(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }
char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }

int64_t int_arg(Interp& in, const std::optional<Value>& v, int64_t dflt) {
  if (!v || v->is_none()) return dflt;
  if (!v->is_intlike())
    in.fail("TypeError: slice indices must be integers or None or have an __index__ method");
  return v->i();
}

// Python's start/end arguments of find/count/startswith, clamped to [0, n].
void clamp_range(int64_t n, int64_t& b, int64_t& e) {
  if (b < 0) b = std::max<int64_t>(0, b + n);
  if (e < 0) e = std::max<int64_t>(0, e + n);
  b = std::min(b, n);
  e = std::min(e, n);
}

const std::string& str_arg(Interp& in, const std::optional<Value>& v, const char* fn) {
  if (!v) in.fail(fmt::format("TypeError: {}() missing a required argument", fn));
  if (v->is_undefined()) in.fail_undefined(*v);
  if (!v->is_str()) in.fail(fmt::format("TypeError: must be str, not {}", type_name(*v)));
  return v->s();
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::str(std::move(p)));
  return Value::list(std::move(out));
}

std::vector<std::string> split_ws(const std::u32string& u, int64_t maxsplit, bool right) {
  std::vector<std::string> out;
  int64_t n = static_cast<int64_t>(u.size());
  if (!right) {
    int64_t i = 0;
    while (maxsplit-- != 0) {
      while (i < n && py_isspace(u[static_cast<size_t>(i)])) ++i;
      if (i == n) break;
      int64_t j = i;
      while (i < n && !py_isspace(u[static_cast<size_t>(i)])) ++i;
      out.push_back(encode(std::u32string_view(u).substr(static_cast<size_t>(j), static_cast<size_t>(i - j))));
    }
    while (i < n && py_isspace(u[static_cast<size_t>(i)])) ++i;
    if (i < n) out.push_back(encode(std::u32string_view(u).substr(static_cast<size_t>(i))));
    return out;
  }
  int64_t i = n;
  while (maxsplit-- != 0) {
    while (i > 0 && py_isspace(u[static_cast<size_t>(i - 1)])) --i;
    if (i == 0) break;
    int64_t j = i;
    while (i > 0 && !py_isspace(u[static_cast<size_t>(i - 1)])) --i;
    out.push_back(encode(std::u32string_view(u).substr(static_cast<size_t>(i), static_cast<size_t>(j - i))));
  }
  while (i > 0 && py_isspace(u[static_cast<size_t>(i - 1)])) --i;
  if (i > 0) out.push_back(encode(std::u32string_view(u).substr(0, static_cast<size_t>(i))));
  std::reverse(out.begin(), out.end());
  return out;
}

// Byte-level search is exact for UTF-8: a match can only start at a character boundary.
std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit, bool right) {
  std::vector<std::string> out;
  if (!right) {
    size_t b = 0;
    while (maxsplit-- != 0) {
      size_t e = find_sub(s, sep, b);
      if (e == std::string::npos) break;
      out.push_back(s.substr(b, e - b));
      b = e + sep.size();
    }
    out.push_back(s.substr(b));
    return out;
  }
  size_t e = s.size();
  while (maxsplit-- != 0) {
    if (e < sep.size()) break;
    size_t b = rfind_sub(s, sep, e - sep.size());
    if (b == std::string::npos) break;
    out.push_back(s.substr(b + sep.size(), e - b - sep.size()));
    e = b;
  }
  out.push_back(s.substr(0, e));
  std::reverse(out.begin(), out.end());
  return out;
}

// ---- str methods -------------------------------------------------------------------------------

Value str_method(Interp& in, const std::string& s, const std::string& m, Args& a) {
  // Linear work in the string and its string arguments, charged up front.
  in.step();
  in.charge_text(s);
  for (const Value& x : a.pos)
    if (x.is_str()) in.charge_text(x.s());
  auto none = [&](const char* fn) { bind(in, a, fn, {}); };
  if (m == "upper") { none("upper"); return Value::str(py_upper(s)); }
  if (m == "lower" || m == "casefold") { none("lower"); return Value::str(py_lower(s)); }
  if (m == "capitalize") { none("capitalize"); return Value::str(str_capitalize(s)); }
  if (m == "title") {
    none("title");
    std::u32string u = decode(s);
    bool prev_cased = false;
    for (char32_t& c : u) {
      c = prev_cased ? to_lower(c) : to_title(c);
      prev_cased = is_cased(c);
    }
    return Value::str(encode(u));
  }
  if (m == "swapcase") {
    none("swapcase");
    std::u32string u = decode(s);
    for (char32_t& c : u) c = utf8proc_isupper(static_cast<utf8proc_int32_t>(c)) ? to_lower(c) : to_upper(c);
    return Value::str(encode(u));
  }
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    B b = bind(in, a, m.c_str(), {"chars"});
    const std::string* chars = nullptr;
    if (b[0] && !b[0]->is_none()) chars = &str_arg(in, b[0], m.c_str());
    return Value::str(py_strip(s, chars, m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    B b = bind(in, a, m.c_str(), {"sep", "maxsplit"});
    int64_t maxsplit = int_arg(in, b[1], -1);
    if (maxsplit < 0) maxsplit = -1;
    in.charge(s.size());
    if (!b[0] || b[0]->is_none()) return str_list(split_ws(decode(s), maxsplit, m == "rsplit"));
    const std::string& sep = str_arg(in, b[0], m.c_str());
    if (sep.empty()) in.fail("ValueError: empty separator");
    return str_list(split_sep(s, sep, maxsplit, m == "rsplit"));
  }
  if (m == "splitlines") {
    B b = bind(in, a, "splitlines", {"keepends"});
    return str_list(str_splitlines(s, b[0] && truthy(*b[0])));
  }
  if (m == "startswith" || m == "endswith") {
    B b = bind(in, a, m.c_str(), {"prefix", "start", "end"});
    if (!b[0]) in.fail(fmt::format("TypeError: {}() takes at least 1 argument (0 given)", m));
    std::vector<Value> cands;
    if (b[0]->is(T::List) && b[0]->list().kind == LKind::Tuple) cands = b[0]->list().items;
    else cands.push_back(*b[0]);
    std::u32string u = decode(s);
    int64_t st = int_arg(in, b[1], 0), en = int_arg(in, b[2], static_cast<int64_t>(u.size()));
    clamp_range(static_cast<int64_t>(u.size()), st, en);
    for (const Value& c : cands) {
      if (!c.is_str())
        in.fail(fmt::format("TypeError: {} first arg must be str or a tuple of str, not {}", m, type_name(c)));
      std::u32string p = decode(c.s());
      if (st > en || static_cast<int64_t>(p.size()) > en - st) continue;
      size_t pos = m == "startswith" ? static_cast<size_t>(st) : static_cast<size_t>(en) - p.size();
      if (u.compare(pos, p.size(), p) == 0) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (m == "replace") {
    B b = bind(in, a, "replace", {"old", "new", "count"});
    return Value::str(str_replace(in, s, str_arg(in, b[0], "replace"), str_arg(in, b[1], "replace"), int_arg(in, b[2], -1)));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    B b = bind(in, a, m.c_str(), {"sub", "start", "end"});
    std::u32string u = decode(s), sub = decode(str_arg(in, b[0], m.c_str()));
    int64_t n = static_cast<int64_t>(u.size());
    int64_t st = int_arg(in, b[1], 0), en = int_arg(in, b[2], n);
    clamp_range(n, st, en);
    in.step(n / 16);
    if (m == "count") {
      if (st > en) return Value::integer(0);
      if (sub.empty()) return Value::integer(en - st + 1);
      int64_t c = 0;
      std::u32string_view uv(u), sv(sub);
      for (size_t p = static_cast<size_t>(st); (p = find_sub(uv, sv, p)) != std::u32string::npos && static_cast<int64_t>(p + sub.size()) <= en; p += sub.size()) ++c;
      return Value::integer(c);
    }
    int64_t found = -1;
    if (st <= en && static_cast<int64_t>(sub.size()) <= en - st) {
      std::u32string_view w = std::u32string_view(u).substr(static_cast<size_t>(st), static_cast<size_t>(en - st));
      std::u32string_view sv(sub);
      size_t p = m[0] == 'r' ? rfind_sub(w, sv) : find_sub(w, sv);
      if (p != std::u32string_view::npos) found = st + static_cast<int64_t>(p);
    }
    if (found < 0 && (m == "index" || m == "rindex")) in.fail("ValueError: substring not found");
    return Value::integer(found);
  }
  if (m == "join") {
    B b = bind(in, a, "join", {"iterable"});
    if (!b[0]) in.fail("TypeError: join() takes exactly one argument (0 given)");
    std::string out;
    size_t k = 0;
    for (const Value& x : iterate(in, *b[0])) {
      if (!x.is_str())
        in.fail(fmt::format("TypeError: sequence item {}: expected str instance, {} found", k, type_name(x)));
      if (k++) out += s;
      out += x.s();
      in.step(static_cast<int64_t>((s.size() + x.s().size()) / 64));
      in.check_size(out.size());
    }
    return Value::str(std::move(out));
  }
  if (m == "format") return Value::str(str_format(in, s, a));
  if (m == "center" || m == "ljust" || m == "rjust") {
    B b = bind(in, a, m.c_str(), {"width", "fillchar"});
    char32_t fill = U' ';
    if (b[1]) {
      std::u32string f = decode(str_arg(in, b[1], m.c_str()));
      if (f.size() != 1) in.fail("TypeError: The fill character must be exactly one character long");
      fill = f[0];
    }
    return Value::str(str_pad(in, s, int_arg(in, b[0], 0), fill, m == "center" ? 'c' : m == "ljust" ? 'l' : 'r'));
  }
  if (m == "zfill") {
    B b = bind(in, a, "zfill", {"width"});
    int64_t w = int_arg(in, b[0], 0), n = static_cast<int64_t>(cp_len(s));
    if (w <= n) return Value::str(s);
    in.charge(static_cast<size_t>(w));
    std::string zeros(static_cast<size_t>(w - n), '0');
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) return Value::str(s.substr(0, 1) + zeros + s.substr(1));
    return Value::str(zeros + s);
  }
  if (m == "partition" || m == "rpartition") {
    B b = bind(in, a, m.c_str(), {"sep"});
    const std::string& sep = str_arg(in, b[0], m.c_str());
    if (sep.empty()) in.fail("ValueError: empty separator");
    size_t p = m == "partition" ? find_sub(s, sep) : rfind_sub(s, sep);
    if (p == std::string::npos)
      return m == "partition" ? Value::tuple({Value::str(s), Value::str(""), Value::str("")})
                              : Value::tuple({Value::str(""), Value::str(""), Value::str(s)});
    return Value::tuple({Value::str(s.substr(0, p)), Value::str(sep), Value::str(s.substr(p + sep.size()))});
  }
  if (m == "removeprefix" || m == "removesuffix") {
    B b = bind(in, a, m.c_str(), {"affix"});
    const std::string& x = str_arg(in, b[0], m.c_str());
    if (m == "removeprefix") return Value::str(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    bool ends = s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value::str(ends && !x.empty() ? s.substr(0, s.size() - x.size()) : s);
  }
  if (m == "expandtabs") {
    B b = bind(in, a, "expandtabs", {"tabsize"});
    int64_t ts = int_arg(in, b[0], 8);
    std::string out;
    int64_t col = 0;
    for (char32_t c : decode(s)) {
      if (c == '\t') {
        if (ts > 0) {
          int64_t nsp = ts - col % ts;
          in.step(nsp / 64);
          in.check_size(out.size() + static_cast<size_t>(nsp));
          out.append(static_cast<size_t>(nsp), ' ');
          col += nsp;
        }
      } else {
        append_utf8(out, c);
        col = (c == '\n' || c == '\r') ? 0 : col + 1;
      }
    }
    return Value::str(std::move(out));
  }
  // is* predicates
  std::u32string u = decode(s);
  auto all = [&](auto pred) { return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), pred)); };
  if (m == "isalpha") { none("isalpha"); return all(is_alpha); }
  if (m == "isdigit" || m == "isdecimal") { none("isdigit"); return all(is_decimal); }
  if (m == "isnumeric") { none("isnumeric"); return all(is_numeric); }
  if (m == "isalnum") { none("isalnum"); return all([](char32_t c) { return is_alpha(c) || is_numeric(c); }); }
  if (m == "isspace") { none("isspace"); return all(py_isspace); }
  if (m == "isascii") { none("isascii"); return Value::boolean(is_ascii(s)); }
  if (m == "islower" || m == "isupper") {
    none(m.c_str());
    bool any = false;
    for (char32_t c : u) {
      if (!is_cased(c)) continue;
      any = true;
      bool lower = utf8proc_islower(static_cast<utf8proc_int32_t>(c));
      if (m == "islower" ? !lower : lower || cat(c) == UTF8PROC_CATEGORY_LT) return Value::boolean(false);
    }
    return Value::boolean(any);
  }
  if (m == "istitle") {
    none("istitle");
    bool prev_cased = false, any = false;
    for (char32_t c : u) {
      bool up = utf8proc_isupper(static_cast<utf8proc_int32_t>(c)) || cat(c) == UTF8PROC_CATEGORY_LT;
      bool low = utf8proc_islower(static_cast<utf8proc_int32_t>(c));
      if (up) {
        if (prev_cased) return Value::boolean(false);
        prev_cased = any = true;
      } else if (low) {
        if (!prev_cased) return Value::boolean(false);
        prev_cased = any = true;
      } else {
        prev_cased = false;
      }
    }
    return Value::boolean(any);
  }
  in.fail(fmt::format("AttributeError: 'str' object has no attribute '{}'", m));
}

const char* const kStrMethods[] = {
    "upper", "lower", "casefold", "capitalize", "title", "swapcase", "strip", "lstrip", "rstrip", "split", "rsplit",
    "splitlines", "startswith", "endswith", "replace", "find", "rfind", "index", "rindex", "count", "join", "format",
    "center", "ljust", "rjust", "zfill", "partition", "rpartition", "removeprefix", "removesuffix", "expandtabs",
    "isalpha", "isdigit", "isdecimal", "isnumeric", "isalnum", "isspace", "isascii", "islower", "isupper", "istitle"};

bool in_list(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

Value unsafe(const Value& self, const std::string& name) {
  return Value::undefined(
      fmt::format("SecurityError: access to attribute '{}' of '{}' object is unsafe.", name, type_name(self)));
}

Value view(Interp& in, const DictObj& d, LKind kind) {
  auto l = std::make_shared<ListObj>();
  l->kind = kind;
  in.charge_items(d.items.size());
  for (const auto& [k, v] : d.items)
    l->items.push_back(kind == LKind::Keys ? k : kind == LKind::Values ? v : Value::tuple({k, v}));
  return Value::from(T::List, l);
}

}  // namespace

bool get_method(Interp& in, const Value& self, const std::string& name, Value& out) {
  switch (self.type()) {
    case T::Str:
      for (const char* m : kStrMethods) {
        if (name == m) {
          out = make_fn(name, [self, name](Interp& in, Args& a) { return str_method(in, self.s(), name, a); });
          return true;
        }
      }
      return false;
    case T::Dict:
      if (in_list(name, {"clear", "pop", "popitem", "setdefault", "update"})) {
        out = unsafe(self, name);
        return true;
      }
      if (in_list(name, {"items", "keys", "values", "get", "copy"})) {
        out = make_fn(name, [self, name](Interp& in, Args& a) -> Value {
          const DictObj& d = self.dict();
          if (name == "get") {
            B b = bind(in, a, "get", {"key", "default"});
            if (!b[0]) in.fail("TypeError: get expected at least 1 argument, got 0");
            const Value* v = nullptr;
            const Value& k = *b[0];
            if (!(k.is(T::Dict) || (k.is(T::List) && k.list().kind != LKind::Tuple))) v = d.find(hash_key(in, k));
            else in.fail(fmt::format("TypeError: unhashable type: '{}'", type_name(k)));
            return v ? *v : b[1] ? *b[1] : Value::none();
          }
          bind(in, a, name.c_str(), {});
          if (name == "copy") {
            auto c = std::make_shared<DictObj>(d);
            in.charge_items(d.items.size());
            return Value::from(T::Dict, c);
          }
          return view(in, d, name == "items" ? LKind::Items : name == "keys" ? LKind::Keys : LKind::Values);
        });
        return true;
      }
      return false;
    case T::List: {
      const LKind k = self.list().kind;
      if (k == LKind::List && in_list(name, {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove"})) {
        out = unsafe(self, name);
        return true;
      }
      bool seq = k == LKind::List || k == LKind::Tuple || k == LKind::Range;
      if ((seq && in_list(name, {"index", "count"})) || (k == LKind::List && name == "copy")) {
        out = make_fn(name, [self, name](Interp& in, Args& a) -> Value {
          const auto& items = self.list().items;
          if (name == "copy") {
            bind(in, a, "copy", {});
            in.charge_items(items.size());
            return Value::list(items);
          }
          B b = bind(in, a, name.c_str(), {"value", "start", "stop"});
          if (!b[0]) in.fail(fmt::format("TypeError: {}() takes at least 1 argument (0 given)", name));
          int64_t n = static_cast<int64_t>(items.size());
          int64_t st = int_arg(in, b[1], 0), en = int_arg(in, b[2], n);
          clamp_range(n, st, en);
          int64_t c = 0;
          for (int64_t i = st; i < en; ++i) {
            in.step();
            if (py_eq(in, items[static_cast<size_t>(i)], *b[0])) {
              if (name == "index") return Value::integer(i);
              ++c;
            }
          }
          if (name == "index") {
            std::string r;
            repr(in, *b[0], r);
            in.fail(fmt::format("ValueError: {} is not in list", r));
          }
          return Value::integer(c);
        });
        return true;
      }
      if (self.list().group && (name == "grouper" || name == "list")) {
        out = self.list().items[name == "grouper" ? 0 : 1];
        return true;
      }
      return false;
    }
    default: return false;
  }
}

// ---- shared str helpers ----------------------------------------------------------------------------

std::string str_capitalize(std::string_view s) {
  std::u32string u = decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_title(u[i]) : to_lower(u[i]);
  return encode(u);
}

std::string str_pad(Interp& in, const std::string& s, int64_t width, char32_t fill, char align) {
  int64_t n = static_cast<int64_t>(cp_len(s));
  if (width <= n) return s;
  in.charge(static_cast<size_t>(width) * 4);
  int64_t marg = width - n;
  int64_t left = align == 'l' ? 0 : align == 'r' ? marg : marg / 2 + (marg & width & 1);
  std::string l, r;
  for (int64_t i = 0; i < left; ++i) append_utf8(l, fill);
  for (int64_t i = 0; i < marg - left; ++i) append_utf8(r, fill);
  return l + s + r;
}

std::vector<std::string> str_splitlines(std::string_view s, bool keepends) {
  std::u32string u = decode(s);
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    char32_t c = u[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t e = i + 1;
    if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') e = i + 2;
    out.push_back(encode(std::u32string_view(u).substr(b, (keepends ? e : i) - b)));
    b = e;
    i = e - 1;
  }
  if (b < u.size()) out.push_back(encode(std::u32string_view(u).substr(b)));
  return out;
}

std::string str_replace(Interp& in, const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    std::u32string u = decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      if (i < u.size()) append_utf8(out, u[i]);
      in.step(static_cast<int64_t>(rep.size() / 64));
      in.check_size(out.size());
    }
    return out;
  }
  size_t b = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t e = find_sub(s, old, b);
    if (e == std::string::npos) break;
    out.append(s, b, e - b);
    out += rep;
    in.step(static_cast<int64_t>((e - b + rep.size()) / 64));
    in.check_size(out.size());
    b = e + old.size();
    ++done;
  }
  out.append(s, b);
  return out;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  auto k = cat(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_ND ||
         k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO || k == UTF8PROC_CATEGORY_MN ||
         k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_PC;
}

}  // namespace moe::jinja::detail
