// jinja2's filters (jinja2/filters.py; tests are in jinja_tests.cpp) with transformers'
// tojson override, for the Jinja interpreter. Each keeps its jinja2 signature, so
// positional and keyword arguments bind as in Python. Filters that return generators in
// jinja2 (map, select, reject, selectattr, rejectattr, unique, batch, items, reverse)
// return one-shot iterators here too, because that is observable: a generator is always
// true and has no length.
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "text/jinja_eval.h"

namespace moe::jinja::detail {

std::vector<std::optional<Value>> bind(Ctx& c, Args& a, const char* fn, std::initializer_list<const char*> names) {
  std::vector<std::optional<Value>> out(names.size());
  if (a.pos.size() > names.size())
    c.fail(fmt::format("TypeError: {}() takes at most {} argument(s) ({} given)", fn, names.size(), a.pos.size()));
  for (size_t i = 0; i < a.pos.size(); ++i) out[i] = a.pos[i];
  for (auto& [k, v] : a.kw) {
    size_t idx = 0;
    for (const char* n : names) {
      if (k == n) break;
      ++idx;
    }
    if (idx == names.size()) c.fail(fmt::format("TypeError: {}() got an unexpected keyword argument '{}'", fn, k));
    if (out[idx]) c.fail(fmt::format("TypeError: {}() got multiple values for argument '{}'", fn, k));
    out[idx] = v;
  }
  return out;
}

namespace {

using B = std::vector<std::optional<Value>>;

Value iter_of(std::vector<Value> items, const char* type = "generator") {
  auto it = std::make_shared<IterObj>();
  it->items = std::move(items);
  it->type_name = type;
  return Value::from(T::Iter, it);
}

bool opt_true(const std::optional<Value>& v) { return v && truthy(*v); }

int64_t opt_int(Interp& in, const std::optional<Value>& v, int64_t dflt, const char* what) {
  if (!v || v->is_none()) return dflt;
  if (v->is_undefined()) in.fail_undefined(*v);
  if (!v->is_intlike()) in.fail(fmt::format("TypeError: '{}' must be an integer, not '{}'", what, type_name(*v)));
  return v->i();
}

std::string soft_str(Interp& in, const Value& v) { return to_str(in, v); }

// make_attrgetter: "a.b.0" walks getitem (item, then attribute) part by part.
Value attr_get(Interp& in, const Value& item, const Value& attribute, const std::optional<Value>& dflt = std::nullopt) {
  Value v = item;
  if (attribute.is_str()) {
    const std::string& s = attribute.s();
    size_t b = 0;
    while (true) {
      size_t e = s.find('.', b);
      std::string part = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      v = in.getitem(v, digits && part.size() < 18 ? Value::integer(std::stoll(part)) : Value::str(part));
      if (dflt && !dflt->is_none() && v.is_undefined()) v = *dflt;
      if (e == std::string::npos) break;
      b = e + 1;
    }
  } else if (!attribute.is_none()) {
    v = in.getitem(v, attribute);
    if (dflt && !dflt->is_none() && v.is_undefined()) v = *dflt;
  }
  return v;
}

Value ignore_case(Value v) { return v.is_str() ? Value::str(py_lower(v.s())) : v; }

// make_multi_attrgetter: sort's key is always a list of values (one per comma-separated
// attribute), which matters: lists compare their items with == before <, so equal
// Undefined keys sort without an error.
Value sort_key(Interp& in, const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  if (!attribute || attribute->is_none()) return Value::list({case_sensitive ? item : ignore_case(item)});
  if (attribute->is_str() && attribute->s().find(',') != std::string::npos) {
    std::vector<Value> keys;
    const std::string& s = attribute->s();
    size_t b = 0;
    while (true) {
      size_t e = s.find(',', b);
      Value k = attr_get(in, item, Value::str(s.substr(b, e == std::string::npos ? std::string::npos : e - b)));
      keys.push_back(case_sensitive ? k : ignore_case(k));
      if (e == std::string::npos) break;
      b = e + 1;
    }
    return Value::list(std::move(keys));
  }
  Value k = attr_get(in, item, *attribute);
  return Value::list({case_sensitive ? k : ignore_case(k)});
}

void py_sort(Interp& in, std::vector<Value>& items, std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> idx(items.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  in.step(static_cast<int64_t>(items.size()) * 4);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return reverse ? py_cmp(in, keys[b], keys[a], "<") == -1 : py_cmp(in, keys[a], keys[b], "<") == -1;
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : idx) out.push_back(items[i]);
  items = std::move(out);
}

// ---- filters ----------------------------------------------------------------------------------------

#define FILTER(fn) Value fn(Interp& in, const Value& v, Args& a)

FILTER(f_abs) {
  bind(in, a, "abs", {});
  if (v.is_intlike()) {
    if (v.i() == INT64_MIN) in.fail("OverflowError: integer overflow (integers are 64-bit here)");
    return Value::integer(std::llabs(v.i()));
  }
  if (v.is(T::Float)) return Value::real(std::fabs(v.f()));
  in.fail(fmt::format("TypeError: bad operand type for abs(): '{}'", type_name(v)));
}

FILTER(f_attr) {
  B b = bind(in, a, "attr", {"name"});
  if (!b[0] || !b[0]->is_str()) in.fail("TypeError: attribute name must be string");
  const std::string& name = b[0]->s();
  Value out;
  if (v.is(T::Obj) ? v.obj().get_attr(in, name, out) : get_method(in, v, name, out)) return out;
  if (v.is_undefined()) in.fail_undefined(v);
  return missing_attr(v, name);
}

FILTER(f_batch) {
  B b = bind(in, a, "batch", {"linecount", "fill_with"});
  int64_t n = opt_int(in, b[0], -1, "linecount");
  if (n <= 0) in.fail("ValueError: batch size must be positive");
  std::vector<Value> out, tmp;
  for (Value& x : iterate(in, v)) {
    if (static_cast<int64_t>(tmp.size()) == n) out.push_back(Value::list(std::exchange(tmp, {})));
    tmp.push_back(std::move(x));
  }
  if (!tmp.empty()) {
    if (b[1] && !b[1]->is_none())
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(*b[1]);
    out.push_back(Value::list(std::move(tmp)));
  }
  return iter_of(std::move(out));
}

FILTER(f_capitalize) {
  bind(in, a, "capitalize", {});
  return Value::str(str_capitalize(soft_str(in, v)));
}

FILTER(f_center) {
  B b = bind(in, a, "center", {"width"});
  return Value::str(str_pad(in, soft_str(in, v), opt_int(in, b[0], 80, "width"), U' ', 'c'));
}

FILTER(f_length) {
  bind(in, a, "length", {});
  return Value::integer(py_len(in, v));
}

FILTER(f_default) {
  B b = bind(in, a, "default", {"default_value", "boolean"});
  if (v.is_undefined() || (opt_true(b[1]) && !truthy(v))) return b[0] ? *b[0] : Value::str("");
  return v;
}

FILTER(f_dictsort) {
  B b = bind(in, a, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is(T::Dict)) in.fail(fmt::format("AttributeError: '{}' object has no attribute 'items'", type_name(v)));
  std::string by = b[1] ? to_str(in, *b[1]) : "key";
  if (by != "key" && by != "value") in.fail("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items, keys;
  for (const auto& [k, x] : v.dict().items) {
    items.push_back(Value::tuple({k, x}));
    const Value& key = by == "key" ? k : x;
    keys.push_back(opt_true(b[0]) ? key : ignore_case(key));
  }
  py_sort(in, items, keys, opt_true(b[2]));
  return Value::list(std::move(items));
}

FILTER(f_escape) {
  bind(in, a, "escape", {});
  if (v.is_str() && static_cast<StrObj*>(v.ptr().get())->markup) return v;
  return Value::markup(html_escape(soft_str(in, v)));
}

FILTER(f_first) {
  bind(in, a, "first", {});
  if (v.is(T::Iter)) {
    IterObj& it = v.iter();
    if (it.pos < it.items.size()) return it.items[it.pos++];
  } else if (v.is_str() || v.is(T::List) || v.is(T::Dict)) {
    if (py_len(in, v) > 0) return v.is(T::List) ? v.list().items[0] : v.is(T::Dict) ? v.dict().items[0].first
                                                                                       : in.getitem(v, Value::integer(0));
  } else if (!v.is_undefined()) {
    iterate(in, v);  // raises the TypeError
  }
  return Value::undefined("UndefinedError: No first item, sequence was empty.");
}

FILTER(f_last) {
  bind(in, a, "last", {});
  if (v.is(T::Iter)) in.fail(fmt::format("TypeError: '{}' object is not reversible", v.iter().type_name));
  if (v.is_str() || v.is(T::List) || v.is(T::Dict)) {
    int64_t n = py_len(in, v);
    if (n > 0) return v.is(T::List) ? v.list().items.back() : v.is(T::Dict) ? v.dict().items.back().first
                                                                             : in.getitem(v, Value::integer(-1));
  } else if (!v.is_undefined()) {
    in.fail(fmt::format("TypeError: '{}' object is not reversible", type_name(v)));
  }
  return Value::undefined("UndefinedError: No last item, sequence was empty.");
}

FILTER(f_float) {
  B b = bind(in, a, "float", {"default"});
  Value dflt = b[0] ? *b[0] : Value::real(0.0);
  if (v.is_undefined()) in.fail_undefined(v);
  if (v.is_number()) return Value::real(v.f());
  double d;
  if (v.is_str() && parse_py_float(v.s(), d)) return Value::real(d);
  return dflt;
}

FILTER(f_format) {
  if (!a.pos.empty() && !a.kw.empty())
    in.fail("FilterArgumentError: can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    auto d = std::make_shared<DictObj>();
    for (auto& [k, x] : a.kw) d->set(in, Value::str(k), x);
    args = Value::from(T::Dict, d);
  } else {
    args = Value::tuple(a.pos);
  }
  return Value::str(percent_format(in, soft_str(in, v), args));
}

FILTER(f_groupby) {
  B b = bind(in, a, "groupby", {"attribute", "default", "case_sensitive"});
  if (!b[0]) in.fail("TypeError: groupby() missing required argument 'attribute'");
  bool cs = opt_true(b[2]);
  std::vector<Value> items = iterate(in, v), keys;
  for (const Value& x : items) {
    Value k = attr_get(in, x, *b[0], b[1]);
    keys.push_back(cs ? k : ignore_case(k));
  }
  std::vector<size_t> idx(items.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return py_cmp(in, keys[x], keys[y], "<") == -1; });
  std::vector<Value> out;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    std::vector<Value> group;
    while (j < idx.size() && py_eq(in, keys[idx[j]], keys[idx[i]])) group.push_back(items[idx[j++]]);
    Value grouper = cs ? keys[idx[i]] : attr_get(in, group[0], *b[0], b[1]);
    auto t = std::make_shared<ListObj>();
    t->kind = LKind::Tuple;
    t->group = true;
    t->items = {grouper, Value::list(std::move(group))};
    out.push_back(Value::from(T::List, t));
    i = j;
  }
  return Value::list(std::move(out));
}

FILTER(f_indent) {
  B b = bind(in, a, "indent", {"width", "first", "blank"});
  if (v.is_undefined()) in.fail_undefined(v);
  if (!v.is_str()) {
    // do_indent starts with s += "\n": a list takes it (and then has no splitlines).
    if (v.is(T::List) && v.list().kind == LKind::List)
      in.fail("AttributeError: 'list' object has no attribute 'splitlines'");
    in.fail(fmt::format("TypeError: unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
  }
  std::string ind = b[0] && b[0]->is_str() ? b[0]->s() : std::string(static_cast<size_t>(std::max<int64_t>(0, opt_int(in, b[0], 4, "width"))), ' ');
  std::vector<std::string> lines = str_splitlines(v.s() + "\n", false);
  std::string rv;
  if (opt_true(b[2])) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind) + lines[i];
  }
  if (opt_true(b[1])) rv = ind + rv;
  in.charge(rv.size());
  return Value::str(std::move(rv));
}

FILTER(f_int) {
  B b = bind(in, a, "int", {"default", "base"});
  Value dflt = b[0] ? *b[0] : Value::integer(0);
  if (v.is_undefined()) in.fail_undefined(v);
  if (v.is_intlike()) return Value::integer(v.i());
  auto from_float = [&](double d) -> Value {
    if (!std::isfinite(d)) return dflt;
    if (std::fabs(d) >= 9.2233720368547758e18) in.fail("OverflowError: integer overflow (integers are 64-bit here)");
    return Value::integer(static_cast<int64_t>(std::trunc(d)));
  };
  if (v.is(T::Float)) return from_float(v.f());
  if (v.is_str()) {
    int64_t r = 0;
    bool of;
    if (parse_py_int(v.s(), opt_int(in, b[1], 10, "base"), r, of)) {
      if (of) in.fail("OverflowError: integer overflow (integers are 64-bit here)");
      return Value::integer(r);
    }
    double d;
    if (parse_py_float(v.s(), d)) return from_float(d);
  }
  return dflt;
}

FILTER(f_items) {
  bind(in, a, "items", {});
  if (v.is_undefined()) return iter_of({});
  if (!v.is(T::Dict)) in.fail("TypeError: Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple({k, x}));
  return iter_of(std::move(out));
}

FILTER(f_join) {
  B b = bind(in, a, "join", {"d", "attribute"});
  std::string d = b[0] ? soft_str(in, *b[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& x : iterate(in, v)) {
    if (!first) out += d;
    first = false;
    size_t before = out.size();
    to_str(in, b[1] && !b[1]->is_none() ? attr_get(in, x, *b[1]) : x, out);
    in.step(static_cast<int64_t>((out.size() - before + d.size()) / 64));
    in.check_size(out.size());
  }
  return Value::str(std::move(out));
}

FILTER(f_list) {
  bind(in, a, "list", {});
  return Value::list(iterate(in, v));
}

FILTER(f_lower) {
  bind(in, a, "lower", {});
  return Value::str(py_lower(soft_str(in, v)));
}

FILTER(f_upper) {
  bind(in, a, "upper", {});
  return Value::str(py_upper(soft_str(in, v)));
}

FILTER(f_map) {
  std::vector<Value> out;
  if (!truthy(v)) return iter_of({});
  if (a.pos.empty()) {
    std::optional<Value> attr, dflt;
    for (auto& [k, x] : a.kw) {
      if (k == "attribute") attr = x;
      else if (k == "default") dflt = x;
      else in.fail(fmt::format("FilterArgumentError: Unexpected keyword argument '{}'", k));
    }
    if (!attr) in.fail("FilterArgumentError: map requires a filter argument");
    for (const Value& x : iterate(in, v)) out.push_back(attr_get(in, x, *attr, dflt));
    return iter_of(std::move(out));
  }
  std::string name = to_str(in, a.pos[0]);
  for (const Value& x : iterate(in, v)) {
    Args fa;
    fa.pos.assign(a.pos.begin() + 1, a.pos.end());
    fa.kw = a.kw;
    out.push_back(in.call_filter(name, x, fa));
  }
  return iter_of(std::move(out));
}

Value min_max(Interp& in, const Value& v, Args& a, bool is_max) {
  B b = bind(in, a, is_max ? "max" : "min", {"case_sensitive", "attribute"});
  std::vector<Value> items = iterate(in, v);
  if (items.empty()) return Value::undefined("UndefinedError: No aggregated item, sequence was empty.");
  bool cs = opt_true(b[0]);
  auto key = [&](const Value& x) {
    Value k = b[1] && !b[1]->is_none() ? attr_get(in, x, *b[1]) : x;
    return cs ? k : ignore_case(k);
  };
  size_t best = 0;
  Value bk = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (py_cmp(in, k, bk, is_max ? ">" : "<") == (is_max ? 1 : -1)) {
      best = i;
      bk = k;
    }
  }
  return items[best];
}
FILTER(f_max) { return min_max(in, v, a, true); }
FILTER(f_min) { return min_max(in, v, a, false); }

Value select_impl(Interp& in, const Value& v, Args& a, bool want, bool by_attr) {
  if (!truthy(v)) return iter_of({});
  size_t off = 0;
  Value attr;
  if (by_attr) {
    if (a.pos.empty()) in.fail("FilterArgumentError: Missing parameter for attribute name");
    attr = a.pos[0];
    off = 1;
  }
  std::vector<Value> out;
  for (const Value& x : iterate(in, v)) {
    Value subject = by_attr ? attr_get(in, x, attr) : x;
    bool r;
    if (a.pos.size() > off) {
      Args ta;
      ta.pos.assign(a.pos.begin() + static_cast<ptrdiff_t>(off) + 1, a.pos.end());
      ta.kw = a.kw;
      r = in.call_test(to_str(in, a.pos[off]), subject, ta);
    } else {
      r = truthy(subject);
    }
    if (r == want) out.push_back(x);
  }
  return iter_of(std::move(out));
}
FILTER(f_select) { return select_impl(in, v, a, true, false); }
FILTER(f_reject) { return select_impl(in, v, a, false, false); }
FILTER(f_selectattr) { return select_impl(in, v, a, true, true); }
FILTER(f_rejectattr) { return select_impl(in, v, a, false, true); }

FILTER(f_replace) {
  B b = bind(in, a, "replace", {"old", "new", "count"});
  if (!b[0] || !b[1]) in.fail("TypeError: replace() missing required arguments");
  return Value::str(str_replace(in, soft_str(in, v), soft_str(in, *b[0]), soft_str(in, *b[1]), opt_int(in, b[2], -1, "count")));
}

FILTER(f_reverse) {
  bind(in, a, "reverse", {});
  if (v.is_str()) {
    std::u32string u = decode(v.s());
    std::reverse(u.begin(), u.end());
    return Value::str(encode(u));
  }
  std::vector<Value> items;
  const char* type = "list_reverseiterator";
  if (v.is(T::Iter)) {
    items = iterate(in, v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (v.is(T::List) || v.is(T::Dict) || v.is_undefined()) {
    items = iterate(in, v);
    if (v.is(T::Dict)) type = "dict_reversekeyiterator";
    else if (v.is(T::List) && v.list().kind == LKind::Tuple) type = "reversed";
    else if (v.is(T::List) && v.list().kind == LKind::Range) type = "range_iterator";
    std::reverse(items.begin(), items.end());
    return iter_of(std::move(items), type);
  }
  in.fail("FilterArgumentError: argument must be iterable");
}

double round_half_even(double x) { return std::nearbyint(x); }

FILTER(f_round) {
  B b = bind(in, a, "round", {"precision", "method"});
  int64_t prec = opt_int(in, b[0], 0, "precision");
  std::string method = b[1] ? to_str(in, *b[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    in.fail("FilterArgumentError: method must be common, ceil or floor");
  if (!v.is_number()) in.fail(fmt::format("TypeError: type {} doesn't define __round__ method", type_name(v)));
  if (method != "common") {
    double p = std::pow(10.0, static_cast<double>(prec));
    double x = v.f() * p;
    return Value::real((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
  }
  if (v.is_intlike()) {
    if (prec >= 0) return Value::integer(v.i());
    if (prec < -18) return Value::integer(0);
    int64_t p = 1;
    for (int64_t i = 0; i < -prec; ++i) p *= 10;
    int64_t q = v.i() / p, r = v.i() % p;
    if (r < 0) {
      r += p;
      --q;
    }
    if (2 * r > p || (2 * r == p && (q & 1))) ++q;
    int64_t out;
    if (__builtin_mul_overflow(q, p, &out)) in.fail("OverflowError: integer overflow (integers are 64-bit here)");
    return Value::integer(out);
  }
  double x = v.f();
  if (!std::isfinite(x)) return Value::real(x);
  if (prec > 300) return Value::real(x);
  if (prec >= 0) {
    // Correctly rounded decimal conversion (as Python's dtoa-based round), read back.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), x);
    return Value::real(std::strtod(buf, nullptr));
  }
  double p = std::pow(10.0, static_cast<double>(-prec));
  return Value::real(round_half_even(x / p) * p);
}

FILTER(f_safe) {
  bind(in, a, "safe", {});
  return Value::markup(soft_str(in, v));
}

FILTER(f_slice) {
  B b = bind(in, a, "slice", {"slices", "fill_with"});
  int64_t slices = opt_int(in, b[0], -1, "slices");
  if (slices <= 0) in.fail("ValueError: slices must be positive");
  std::vector<Value> seq = iterate(in, v), out;
  int64_t length = static_cast<int64_t>(seq.size()), per = length / slices, extra = length % slices, offset = 0;
  in.charge_items(static_cast<size_t>(slices));
  for (int64_t n = 0; n < slices; ++n) {
    int64_t start = offset + n * per;
    if (n < extra) ++offset;
    int64_t end = offset + (n + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (b[1] && !b[1]->is_none() && n >= extra) tmp.push_back(*b[1]);
    out.push_back(Value::list(std::move(tmp)));
  }
  return iter_of(std::move(out));
}

FILTER(f_sort) {
  B b = bind(in, a, "sort", {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = iterate(in, v), keys;
  for (const Value& x : items) keys.push_back(sort_key(in, x, b[2], opt_true(b[1])));
  py_sort(in, items, keys, opt_true(b[0]));
  return Value::list(std::move(items));
}

FILTER(f_string) {
  bind(in, a, "string", {});
  return v.is_str() ? v : Value::str(soft_str(in, v));
}

FILTER(f_sum) {
  B b = bind(in, a, "sum", {"attribute", "start"});
  Value acc = b[1] ? *b[1] : Value::integer(0);
  if (acc.is_str()) in.fail("TypeError: sum() can't sum strings [use ''.join(seq) instead]");
  for (const Value& x : iterate(in, v)) acc = binary_op(in, BinOp::Add, acc, b[0] && !b[0]->is_none() ? attr_get(in, x, *b[0]) : x);
  return acc;
}

FILTER(f_title) {
  bind(in, a, "title", {});
  // "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s) if item)
  std::u32string u = decode(soft_str(in, v));
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  std::string out;
  for (size_t i = 0; i < u.size();) {
    size_t j = i;
    bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    std::string item = encode(std::u32string_view(u).substr(i, j - i));
    if (sep) {
      out += item;
    } else {
      out += py_upper(encode(std::u32string_view(u).substr(i, 1)));
      out += py_lower(encode(std::u32string_view(u).substr(i + 1, j - i - 1)));
    }
    i = j;
  }
  return Value::str(std::move(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) (no HTML escaping, unlike jinja2's own).
FILTER(f_tojson) {
  B b = bind(in, a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOpts o;
  o.ensure_ascii = opt_true(b[0]);
  o.sort_keys = opt_true(b[3]);
  if (b[1] && !b[1]->is_none()) {
    o.has_indent = true;
    if (b[1]->is_str()) o.indent = b[1]->s();
    else if (b[1]->is_intlike()) o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(b[1]->i(), 0, 1000)), ' ');
    else in.fail(fmt::format("TypeError: can't multiply sequence by non-int of type '{}'", type_name(*b[1])));
    o.item_sep = ",";
  }
  if (b[2] && !b[2]->is_none()) {
    std::vector<Value> seps = iterate(in, *b[2]);
    if (seps.size() != 2 || !seps[0].is_str() || !seps[1].is_str())
      in.fail("ValueError: separators must be a pair of strings");
    o.item_sep = seps[0].s();
    o.key_sep = seps[1].s();
  }
  std::string out;
  to_json(in, v, o, out);
  return Value::str(std::move(out));
}

FILTER(f_trim) {
  B b = bind(in, a, "trim", {"chars"});
  std::string s = soft_str(in, v);
  if (b[0] && !b[0]->is_none()) {
    if (!b[0]->is_str()) in.fail("TypeError: strip arg must be None or str");
    return Value::str(py_strip(s, &b[0]->s(), true, true));
  }
  return Value::str(py_strip(s, nullptr, true, true));
}

FILTER(f_truncate) {
  B b = bind(in, a, "truncate", {"length", "killwords", "end", "leeway"});
  int64_t length = opt_int(in, b[0], 255, "length");
  std::u32string end = decode(b[2] ? soft_str(in, *b[2]) : "...");
  int64_t leeway = opt_int(in, b[3], 5, "leeway");
  if (length < static_cast<int64_t>(end.size()))
    in.fail(fmt::format("AssertionError: expected length >= {}, got {}", end.size(), length));
  if (leeway < 0) in.fail(fmt::format("AssertionError: expected leeway >= 0, got {}", leeway));
  // do_truncate does not convert its value: len(s) decides, and a short value (an empty
  // Undefined, a short list) comes back unchanged.
  if (!v.is_str()) {
    if (py_len(in, v) <= length + leeway) return v;
    in.fail(fmt::format("AttributeError: '{}' object has no attribute 'rsplit'", type_name(v)));
  }
  std::u32string s = decode(v.s());
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::str(encode(s));
  std::u32string head = s.substr(0, static_cast<size_t>(length - static_cast<int64_t>(end.size())));
  if (!opt_true(b[1])) {
    size_t sp = head.rfind(U' ');
    if (sp != std::u32string::npos) head = head.substr(0, sp);
  }
  return Value::str(encode(head + end));
}

FILTER(f_unique) {
  B b = bind(in, a, "unique", {"case_sensitive", "attribute"});
  std::unordered_set<std::string> seen;
  std::vector<Value> out;
  for (const Value& x : iterate(in, v)) {
    Value k = b[1] && !b[1]->is_none() ? attr_get(in, x, *b[1]) : x;
    if (!opt_true(b[0])) k = ignore_case(k);
    if (seen.insert(hash_key(in, k)).second) out.push_back(x);
  }
  return iter_of(std::move(out));
}

FILTER(f_wordcount) {
  bind(in, a, "wordcount", {});
  std::u32string u = decode(soft_str(in, v));
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : u) {
    bool w = is_word_char(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

FILTER(f_unsupported) { in.fail("TemplateRuntimeError: this filter is not supported by moe-ep's Jinja"); }

#undef FILTER

struct FilterDef {
  const char* name;
  Value (*fn)(Interp&, const Value&, Args&);
};
const FilterDef kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},           {"batch", f_batch},       {"capitalize", f_capitalize},
    {"center", f_center},     {"count", f_length},        {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},            {"escape", f_escape},     {"first", f_first},
    {"float", f_float},       {"forceescape", f_escape},  {"format", f_format},     {"groupby", f_groupby},
    {"indent", f_indent},     {"int", f_int},             {"items", f_items},       {"join", f_join},
    {"last", f_last},         {"length", f_length},       {"list", f_list},         {"lower", f_lower},
    {"map", f_map},           {"max", f_max},             {"min", f_min},           {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},   {"round", f_round},
    {"safe", f_safe},         {"select", f_select},       {"selectattr", f_selectattr}, {"slice", f_slice},
    {"sort", f_sort},         {"string", f_string},       {"sum", f_sum},           {"title", f_title},
    {"tojson", f_tojson},     {"trim", f_trim},           {"truncate", f_truncate}, {"unique", f_unique},
    {"upper", f_upper},       {"wordcount", f_wordcount},
    // jinja2 has these; templates may mention them in branches that never run.
    {"filesizeformat", f_unsupported}, {"pprint", f_unsupported}, {"random", f_unsupported},
    {"striptags", f_unsupported}, {"urlencode", f_unsupported}, {"urlize", f_unsupported},
    {"wordwrap", f_unsupported}, {"xmlattr", f_unsupported},
};

}  // namespace

int find_filter(std::string_view name) {
  for (size_t i = 0; i < std::size(kFilters); ++i)
    if (name == kFilters[i].name) return static_cast<int>(i);
  return -1;
}


// Work proportional to the subject's size is charged up front (trim, upper, replace, ...
// are linear in it), so a loop over a huge string cannot outrun the step budget.
Value apply_filter(Interp& in, int id, const Value& v, Args& args) {
  in.step();
  if (v.is_str()) in.charge_text(v.s());
  return kFilters[id].fn(in, v, args);
}


}  // namespace moe::jinja::detail
