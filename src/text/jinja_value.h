// Values of the Jinja interpreter (internal to src/text/jinja_*.cpp).
//
// They model the Python objects a chat template sees under transformers: None, bool,
// int, float, str, list, tuple, dict, range, dict views, generators, jinja2's Undefined,
// and a few objects (namespace, macro, loop, bound methods, builtins). Python semantics
// matter because the output must equal jinja2's byte for byte: str()/repr() formatting,
// truthiness, == across int/float/bool, ordering errors, dict insertion order.
//
// Containers are immutable once built (the sandbox forbids list.append etc.), so values
// share them freely through shared_ptr. Only namespaces (and frames) mutate. Heap objects
// never destroy their children recursively: a Value's destructor hands its object to
// bury(), which frees a chain of any length iteratively, so a template cannot overflow the
// stack by building a deep structure and dropping it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace moe::jinja::detail {

// ---- budget and errors ---------------------------------------------------------------

// Step budget, size limits and error reporting shared by every part of a render. Every
// error names the template and the line of the node being evaluated.
class Ctx {
 public:
  Ctx(std::string name, const Options& opt);
  [[noreturn]] void fail(const std::string& msg) const;
  void step(int64_t n = 1) {
    steps_ += n;
    if (steps_ > opt_.max_steps) fail_budget();
  }
  // A string/list of `n` bytes/items is about to be built: charge for the copy and refuse
  // sizes no chat template needs.
  void charge(size_t n) {
    if (n > static_cast<size_t>(opt_.max_output)) fail_size(n);
    step(static_cast<int64_t>(n / 64));
  }
  // Work linear in string `s`: 64 bytes a step, but 4 code points a step when the
  // operation has to decode it (case mapping, stripping, slicing of non-ASCII text).
  void charge_text(std::string_view s);
  // `n` items (Values) are about to be built or copied: they cost more than bytes.
  void charge_items(size_t n) {
    if (n > static_cast<size_t>(opt_.max_output)) fail_size(n);
    step(static_cast<int64_t>(n / 4));
  }
  // A string or list that grows piece by piece: refuse it past the size limit (the
  // caller charges each piece as it appends it).
  void check_size(size_t n) const {
    if (n > static_cast<size_t>(opt_.max_output)) fail_size(n);
  }
  const Options& opt() const { return opt_; }
  const std::string& name() const { return name_; }
  // Marks the current frame as the bottom of the stack the limit is measured from.
  void set_stack_base() {
    char here;
    stack_base_ = reinterpret_cast<uintptr_t>(&here);
  }
  bool has_stack_base() const { return stack_base_ != 0; }
  // Fails when nesting has used more than Options::max_stack bytes of C++ stack.
  void check_stack() const {
    char here;
    uintptr_t p = reinterpret_cast<uintptr_t>(&here);
    uintptr_t used = stack_base_ > p ? stack_base_ - p : p - stack_base_;
    if (stack_base_ && used > stack_limit_) fail_stack();
  }
  int line = 1;
  int value_depth = 0;  // recursion guard for repr/==/tojson over nested values

 private:
  [[noreturn]] void fail_budget() const;
  [[noreturn]] void fail_size(size_t n) const;
  [[noreturn]] void fail_stack() const;
  std::string name_;
  Options opt_;
  int64_t steps_ = 0;
  uintptr_t stack_base_ = 0;
  uintptr_t stack_limit_ = 0;
};

// RAII guard for functions that recurse into nested values.
struct DepthGuard {
  Ctx& c;
  explicit DepthGuard(Ctx& ctx) : c(ctx) {
    if (++c.value_depth > c.opt().max_depth * 2) c.fail("value nested too deeply");
    c.check_stack();
  }
  ~DepthGuard() { --c.value_depth; }
};

// ---- heap objects ----------------------------------------------------------------------

struct HeapObj {
  virtual ~HeapObj() = default;
};
using HeapPtr = std::shared_ptr<HeapObj>;
// Releases `p` without recursing: children freed by a destructor are queued and freed
// by the outermost bury() in a loop.
void bury(HeapPtr&& p);

enum class T : uint8_t { Undefined, None, Bool, Int, Float, Str, List, Dict, Iter, Obj };

struct StrObj;
struct ListObj;
struct DictObj;
struct IterObj;
struct Object;

class Value {
 public:
  Value() : i_(0) {}
  ~Value() {
    // Strings and undefined hold no children: only containers and objects can start a
    // destruction cascade.
    if (p_ && t_ != T::Str && t_ != T::Undefined) bury(std::move(p_));
  }
  Value(const Value& o) = default;
  Value(Value&& o) noexcept = default;
  // By value and swap, so the old contents die in a Value destructor (through bury).
  Value& operator=(Value o) noexcept {
    std::swap(t_, o.t_);
    std::swap(i_, o.i_);
    p_.swap(o.p_);
    return *this;
  }

  static Value none() { return Value(T::None); }
  static Value boolean(bool b) {
    Value v(T::Bool);
    v.i_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(T::Int);
    v.i_ = i;
    return v;
  }
  static Value real(double f) {
    Value v(T::Float);
    v.f_ = f;
    return v;
  }
  static Value str(std::string s);
  static Value markup(std::string s);
  // jinja2's Undefined; `msg` is what an operation on it raises.
  static Value undefined(std::string msg);
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value from(T t, HeapPtr p) {
    Value v(t);
    v.p_ = std::move(p);
    return v;
  }

  T type() const { return t_; }
  bool is(T t) const { return t_ == t; }
  bool is_undefined() const { return t_ == T::Undefined; }
  bool is_none() const { return t_ == T::None; }
  bool is_str() const { return t_ == T::Str; }
  // Python int (bool counts as int, as isinstance(True, int)).
  bool is_intlike() const { return t_ == T::Int || t_ == T::Bool; }
  bool is_number() const { return t_ == T::Int || t_ == T::Bool || t_ == T::Float; }

  bool b() const { return i_ != 0; }
  int64_t i() const { return i_; }  // Int or Bool
  double f() const { return t_ == T::Float ? f_ : static_cast<double>(i_); }
  const std::string& s() const;
  const std::string& undef_msg() const;
  inline ListObj& list() const;
  inline DictObj& dict() const;
  inline IterObj& iter() const;
  inline Object& obj() const;
  const HeapPtr& ptr() const { return p_; }

 private:
  explicit Value(T t) : t_(t), i_(0) {}
  T t_ = T::Undefined;
  union {
    int64_t i_;
    double f_;
  };
  HeapPtr p_;
};

struct StrObj final : HeapObj {
  explicit StrObj(std::string v) : s(std::move(v)) {}
  std::string s;
  bool markup = false;  // markupsafe.Markup (from |safe, |escape): only `is escaped` sees it
};

// list, tuple, range, and dict views: all re-iterable sequences of `items`.
enum class LKind : uint8_t { List, Tuple, Range, Keys, Values, Items };
struct ListObj final : HeapObj {
  std::vector<Value> items;
  LKind kind = LKind::List;
  int64_t r_start = 0, r_stop = 0, r_step = 1;  // range(...) as printed
  bool group = false;  // groupby's (grouper, list) named tuple
};

// A one-shot Python iterator (generators from select/map/..., reversed()): iterating
// consumes it, it is always true, and it has no len().
struct IterObj final : HeapObj {
  std::vector<Value> items;
  size_t pos = 0;
  const char* type_name = "generator";
};

// A dict in insertion order. Keys are hashable Values (str, numbers, None, tuples); lookup
// uses hash_key(), so 1, 1.0 and True are the same key, as in Python.
struct DictObj final : HeapObj {
  std::vector<std::pair<Value, Value>> items;
  std::unordered_map<std::string, size_t> index;  // hash_key -> position
  const Value* find(const std::string& key) const;
  const Value* find_str(std::string_view key) const;
  void set(Ctx& c, Value key, Value value);
};

struct Args;
class Interp;

// Namespaces, macros, loops, bound methods, builtin functions.
struct Object : HeapObj {
  virtual const char* type_name() const = 0;
  virtual void repr(Ctx& c, std::string& out) const;
  // Sets `out` and returns true when the object has attribute `name`.
  virtual bool get_attr(Interp& in, const std::string& name, Value& out) { return false; }
  virtual bool callable() const { return false; }
  virtual Value call(Interp& in, Args& args);
  // Drops references to frames and other values, to break cycles when a render ends.
  virtual void unlink() {}
};

inline ListObj& Value::list() const { return *static_cast<ListObj*>(p_.get()); }
inline DictObj& Value::dict() const { return *static_cast<DictObj*>(p_.get()); }
inline IterObj& Value::iter() const { return *static_cast<IterObj*>(p_.get()); }
inline Object& Value::obj() const { return *static_cast<Object*>(p_.get()); }

// ---- Python semantics ----------------------------------------------------------------

const char* type_name(const Value& v);  // Python's type(v).__name__
bool truthy(const Value& v);
void to_str(Ctx& c, const Value& v, std::string& out);  // str(v)
std::string to_str(Ctx& c, const Value& v);
void repr(Ctx& c, const Value& v, std::string& out);  // repr(v)
std::string float_repr(double d);                    // repr(float)
std::string str_repr(std::string_view s);            // repr(str)
bool py_eq(Ctx& c, const Value& a, const Value& b);
// Python's <, <=, >, >= ordering: -1, 0 or 1; TypeError for unorderable types. `op` names
// the operator in the error.
int py_cmp(Ctx& c, const Value& a, const Value& b, const char* op);
// A string equal for equal hashable values (dict keys, unique, sets); TypeError for
// unhashable ones (list, dict).
std::string hash_key(Ctx& c, const Value& v);
// The items iteration yields: list/tuple/range/views items, dict keys, string characters,
// an iterator's remaining items (consuming it), nothing for Undefined. TypeError
// otherwise ("'int' object is not iterable").
std::vector<Value> iterate(Ctx& c, const Value& v);
// len(); TypeError when the value has none.
int64_t py_len(Ctx& c, const Value& v);

Value from_json(Ctx& c, const nlohmann::ordered_json& j);
Value from_json(Ctx& c, const nlohmann::json& j);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python writes it.
struct JsonOpts {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // indent string when has_indent (an int n means n spaces)
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
void to_json(Ctx& c, const Value& v, const JsonOpts& o, std::string& out, int level = 0);

// ---- substring search -------------------------------------------------------------------

// find / rfind that stay linear on adversarial inputs: the library's are naive (O(n*m)
// in the worst case, e.g. 'aaa...ab' in 'aaa...a'), so long needles in long haystacks
// go through Knuth-Morris-Pratt.
template <class C>
size_t kmp_find(std::basic_string_view<C> h, std::basic_string_view<C> n, size_t from) {
  const size_t m = n.size();
  std::vector<size_t> fail(m, 0);
  for (size_t i = 1, k = 0; i < m; ++i) {
    while (k && n[i] != n[k]) k = fail[k - 1];
    if (n[i] == n[k]) ++k;
    fail[i] = k;
  }
  for (size_t i = from, k = 0; i < h.size(); ++i) {
    while (k && h[i] != n[k]) k = fail[k - 1];
    if (h[i] == n[k]) ++k;
    if (k == m) return i + 1 - m;
  }
  return std::basic_string_view<C>::npos;
}
inline bool naive_ok(size_t hay, size_t needle) { return needle <= 32 || (hay / 1024 + 1) * needle <= 1024; }
template <class C>
size_t find_sub(std::basic_string_view<C> h, std::basic_string_view<C> n, size_t from = 0) {
  if (from > h.size()) return std::basic_string_view<C>::npos;
  if (n.empty() || naive_ok(h.size() - from, n.size())) return h.find(n, from);
  return kmp_find(h, n, from);
}
// The last occurrence that starts at or before `pos`.
template <class C>
size_t rfind_sub(std::basic_string_view<C> h, std::basic_string_view<C> n,
                 size_t pos = std::basic_string_view<C>::npos) {
  if (n.empty() || naive_ok(h.size(), n.size())) return h.rfind(n, pos);
  size_t lim = pos >= h.size() ? h.size() : std::min(h.size(), pos + n.size());
  std::basic_string<C> rh(h.substr(0, lim)), rn(n);
  std::reverse(rh.begin(), rh.end());
  std::reverse(rn.begin(), rn.end());
  size_t j = kmp_find(std::basic_string_view<C>(rh), std::basic_string_view<C>(rn), 0);
  return j == std::basic_string_view<C>::npos ? j : lim - j - n.size();
}
inline size_t find_sub(const std::string& h, const std::string& n, size_t from = 0) {
  return find_sub(std::string_view(h), std::string_view(n), from);
}
inline size_t rfind_sub(const std::string& h, const std::string& n, size_t pos = std::string::npos) {
  return rfind_sub(std::string_view(h), std::string_view(n), pos);
}

// ---- UTF-8 / Python str helpers ----------------------------------------------------------

bool is_ascii(std::string_view s);
// Code points of `s`; bytes that are not valid UTF-8 decode to U+FFFD.
std::u32string decode(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
std::string encode(std::u32string_view s);
size_t cp_len(std::string_view s);
bool py_isspace(char32_t c);  // str.isspace() / the \s of Python's re
// Python-style str.strip family: `chars` null means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
bool validate_utf8(std::string_view s, size_t* bad_offset);

}  // namespace moe::jinja::detail
