// jinja2's tests (jinja2/tests.py): `x is defined`, `x is string`, `x is divisibleby 3`,
// the comparison aliases (eq, equalto, ==, gt, ...), for the Jinja interpreter.
#include <string_view>

#include "text/jinja_eval.h"

namespace moe::jinja::detail {

namespace {

using B = std::vector<std::optional<Value>>;

// ---- tests ------------------------------------------------------------------------------------------

#define TEST(fn) bool fn(Interp& in, const Value& v, Args& a)

Value arg1(Interp& in, Args& a, const char* name) {
  B b = bind(in, a, name, {"other"});
  if (!b[0]) in.fail(fmt::format("TypeError: {}() missing 1 required positional argument", name));
  return *b[0];
}

TEST(t_odd) { bind(in, a, "odd", {}); return py_eq(in, binary_op(in, BinOp::Mod, v, Value::integer(2)), Value::integer(1)); }
TEST(t_even) { bind(in, a, "even", {}); return py_eq(in, binary_op(in, BinOp::Mod, v, Value::integer(2)), Value::integer(0)); }
TEST(t_divisibleby) { return py_eq(in, binary_op(in, BinOp::Mod, v, arg1(in, a, "divisibleby")), Value::integer(0)); }
TEST(t_defined) { return !v.is_undefined(); }
TEST(t_undefined) { return v.is_undefined(); }
TEST(t_filter) { return v.is_str() && find_filter(v.s()) >= 0; }
TEST(t_test) { return v.is_str() && find_test(v.s()) >= 0; }
TEST(t_none) { return v.is_none(); }
TEST(t_boolean) { return v.is(T::Bool); }
TEST(t_false) { return v.is(T::Bool) && !v.b(); }
TEST(t_true) { return v.is(T::Bool) && v.b(); }
TEST(t_integer) { return v.is(T::Int); }
TEST(t_float) { return v.is(T::Float); }
bool cased_all(const std::string& s, bool upper) {
  std::string o = upper ? py_upper(s) : py_lower(s);
  std::string other = upper ? py_lower(s) : py_upper(s);
  return o == s && other != s;  // str.islower(): some cased character, none of the other case
}
TEST(t_lower) { return cased_all(to_str(in, v), false); }
TEST(t_upper) { return cased_all(to_str(in, v), true); }
TEST(t_string) { return v.is_str(); }
TEST(t_mapping) { return v.is(T::Dict); }
TEST(t_number) { return v.is_number(); }
TEST(t_sequence) {
  if (v.is_undefined() || v.is_str() || v.is(T::Dict)) return true;
  return v.is(T::List) && (v.list().kind == LKind::List || v.list().kind == LKind::Tuple || v.list().kind == LKind::Range);
}
TEST(t_iterable) {
  return v.is_undefined() || v.is_str() || v.is(T::List) || v.is(T::Dict) || v.is(T::Iter) ||
         (v.is(T::Obj) && std::string_view(v.obj().type_name()) == "LoopContext");
}
TEST(t_callable) { return v.is_undefined() || (v.is(T::Obj) && v.obj().callable()); }
TEST(t_sameas) {
  Value o = arg1(in, a, "sameas");
  if (v.type() != o.type()) return false;
  switch (v.type()) {
    case T::None:
    case T::Undefined: return v.ptr() == o.ptr() || v.is_none();
    case T::Bool: return v.b() == o.b();
    case T::Int: return v.i() == o.i() && v.i() >= -5 && v.i() <= 256;  // CPython's small-int cache
    case T::Float: return false;
    default: return v.ptr() == o.ptr();
  }
}
TEST(t_escaped) { return v.is_str() && static_cast<StrObj*>(v.ptr().get())->markup; }
TEST(t_in) { return contains(in, arg1(in, a, "in"), v); }
TEST(t_eq) { return py_eq(in, v, arg1(in, a, "eq")); }
TEST(t_ne) { return !py_eq(in, v, arg1(in, a, "ne")); }
TEST(t_gt) { return py_cmp(in, v, arg1(in, a, "gt"), ">") == 1; }
TEST(t_ge) { int c = py_cmp(in, v, arg1(in, a, "ge"), ">="); return c == 1 || c == 0; }
TEST(t_lt) { return py_cmp(in, v, arg1(in, a, "lt"), "<") == -1; }
TEST(t_le) { int c = py_cmp(in, v, arg1(in, a, "le"), "<="); return c == -1 || c == 0; }

#undef TEST

struct TestDef {
  const char* name;
  bool (*fn)(Interp&, const Value&, Args&);
};
const TestDef kTests[] = {
    {"odd", t_odd},         {"even", t_even},       {"divisibleby", t_divisibleby}, {"defined", t_defined},
    {"undefined", t_undefined}, {"filter", t_filter}, {"test", t_test},             {"none", t_none},
    {"boolean", t_boolean}, {"false", t_false},     {"true", t_true},               {"integer", t_integer},
    {"float", t_float},     {"lower", t_lower},     {"upper", t_upper},             {"string", t_string},
    {"mapping", t_mapping}, {"number", t_number},   {"sequence", t_sequence},       {"iterable", t_iterable},
    {"callable", t_callable}, {"sameas", t_sameas}, {"escaped", t_escaped},         {"in", t_in},
    {"==", t_eq},           {"eq", t_eq},           {"equalto", t_eq},              {"!=", t_ne},
    {"ne", t_ne},           {">", t_gt},            {"gt", t_gt},                   {"greaterthan", t_gt},
    {"ge", t_ge},           {">=", t_ge},           {"<", t_lt},                    {"lt", t_lt},
    {"lessthan", t_lt},     {"<=", t_le},           {"le", t_le},
};

}  // namespace

int find_test(std::string_view name) {
  for (size_t i = 0; i < std::size(kTests); ++i)
    if (name == kTests[i].name) return static_cast<int>(i);
  return -1;
}

// Tests that take no argument besides the value reject extra ones, with Python's message
// (`x is boolean not in y` passes `not` as an argument in jinja2's grammar).
static bool takes_argument(std::string_view name) {
  for (const char* n : {"divisibleby", "sameas", "in", "==", "eq", "equalto", "!=", "ne", ">", "gt", "greaterthan",
                        "ge", ">=", "<", "lt", "lessthan", "<=", "le"})
    if (name == n) return true;
  return false;
}

bool apply_test(Interp& in, int id, const Value& v, Args& args) {
  in.step();
  const std::string_view name = kTests[id].name;
  const size_t given = 1 + args.pos.size() + args.kw.size();
  if (!takes_argument(name) && given > 1) {
    if (name == "callable") in.fail(fmt::format("TypeError: callable() takes exactly one argument ({} given)", given));
    in.fail(fmt::format("TypeError: test_{}() takes 1 positional argument but {} were given", name, given));
  }
  if (takes_argument(name) && given > 2) {
    if (name == "divisibleby" || name == "sameas" || name == "in")
      in.fail(fmt::format("TypeError: test_{}() takes 2 positional arguments but {} were given", name, given));
    in.fail(fmt::format("TypeError: expected 2 arguments, got {}", given));
  }
  return kTests[id].fn(in, v, args);
}

}  // namespace moe::jinja::detail
