// The tree-walking interpreter's internal interface: what jinja_filters.cpp (filters,
// tests, str/dict/list methods, builtins) needs from jinja_eval.cpp and back.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/jinja_parser.h"
#include "text/jinja_value.h"

namespace moe::jinja::detail {

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Binds `a` to parameters `names` as Python binds a call: positional first, then by
// keyword; unknown keywords, duplicates and extra positionals are TypeErrors naming `fn`.
// Missing parameters are nullopt.
std::vector<std::optional<Value>> bind(Ctx& c, Args& a, const char* fn, std::initializer_list<const char*> names);

// A scope. Loop bodies, macro calls and with-blocks get a child frame; if-blocks do not
// (their assignments are visible after the if, as in jinja2).
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
  const Value* lookup(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

// A {% macro %} (or the caller of a {% call %} block): its definition and the frame it was
// defined in, which its body reads at call time (so it sees later top-level sets).
struct MacroObj final : Object {
  const Stmt* def = nullptr;
  FramePtr closure;
  std::string name;
  const char* type_name() const override { return "Macro"; }
  void repr(Ctx& c, std::string& out) const override;
  bool callable() const override { return true; }
  void unlink() override { closure.reset(); }
  bool get_attr(Interp& in, const std::string& a, Value& out) override;
  Value call(Interp& in, Args& args) override;
};

struct ChangedState final : HeapObj {
  bool has = false;
  Value last;
};

// jinja2's LoopContext.
struct LoopObj final : Object {
  const Stmt* stmt = nullptr;
  FramePtr outer;  // where the loop runs, for loop(...) recursion
  std::shared_ptr<std::vector<Value>> items;
  int64_t index0 = 0;
  int depth = 1;
  bool active = true;  // loop(...) only works while the loop runs
  std::shared_ptr<ChangedState> changed = std::make_shared<ChangedState>();

  int64_t length() const { return static_cast<int64_t>(items->size()); }
  const char* type_name() const override { return "LoopContext"; }
  void repr(Ctx& c, std::string& out) const override;
  bool callable() const override { return true; }
  void unlink() override {
    outer.reset();
    changed->last = Value();  // loop.changed(loop) would otherwise keep a cycle
  }
  bool get_attr(Interp& interp, const std::string& a, Value& out) override;
  Value call(Interp& interp, Args& args) override;
};

struct Impossible {};  // thrown while folding: the expression is not constant

// Filters jinja2 passes the render context to (map, select, ...): never folded.
bool needs_context(const Expr& filter_or_test);

class Interp : public Ctx {
 public:
  Interp(const std::string& name, const Options& opt);
  ~Interp();
  std::string run(const Program& prog, const Value& context);

  // jinja2 sandbox semantics: getattr prefers the attribute then falls back to the item;
  // getitem the reverse. A missing one is Undefined (an error only when used).
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& callee, Args& args);
  Value call_filter(const std::string& name, const Value& v, Args& args);
  bool call_test(const std::string& name, const Value& v, Args& args);
  [[noreturn]] void fail_undefined(const Value& u) { fail(u.undef_msg()); }

  // Callables that capture a frame (macros) and namespaces can form reference cycles;
  // they are registered here and emptied when the render ends.
  void track(const std::shared_ptr<Object>& p) { tracked_.push_back(p); }

  enum class Flow { Normal, Break, Continue };
  // Used by macro calls, recursive loops and filters that call back into templates.
  std::string render_body(const Body& body, FramePtr frame);
  Flow render_body(const Body& body, FramePtr frame, std::string& out);
  int call_depth = 0;
  struct CallGuard {
    Interp& in;
    explicit CallGuard(Interp& i) : in(i) {
      if (++in.call_depth > in.opt().max_depth)
        in.fail(fmt::format("RecursionError: maximum recursion depth exceeded (calls nest deeper than {})",
                            in.opt().max_depth));
    }
    ~CallGuard() { --in.call_depth; }
  };

  // A for loop's state, for LoopObj (recursion via loop(...)).
  Value run_loop(const Stmt& s, const Value& iterable, int depth, bool capture);

  // jinja2's Expr.as_const: `e` evaluated at compile time, or nullopt where jinja2's
  // optimizer gives up (a name, a call, a filter that needs the context, any error).
  std::optional<Value> try_fold(const Expr& e);

 private:
  Value eval(const Expr& e);
  Flow exec(const Body& body);
  Flow exec_stmt(const Stmt& s);
  void assign(const Target& t, const Value& v);
  Value eval_call(const Expr& e);
  void eval_args(const Expr& e, size_t first, Args& out);
  Value eval_compare(const Expr& e);
  Value eval_getitem(const Expr& e);
  void emit(const Value& v);

  FramePtr frame_;
  std::string* out_ = nullptr;
  bool folding_ = false;  // evaluating a constant subexpression as jinja2's optimizer does
  int eval_depth_ = 0;
  std::vector<std::weak_ptr<Object>> tracked_;
  friend struct MacroObj;
  friend struct LoopObj;
};

// jinja2's optimizer: evaluates the constant expressions of `p` once (jinja_fold.cpp).
void fold_constants(Program& p, const std::string& name, const Options& opt);

// ---- registry (jinja_filters.cpp) ---------------------------------------------------------

int find_filter(std::string_view name);  // -1 when there is none
int find_test(std::string_view name);
Value apply_filter(Interp& in, int id, const Value& v, Args& args);
bool apply_test(Interp& in, int id, const Value& v, Args& args);

// Attributes of str / dict / list values: their methods, bound to the value. Mutating
// methods (list.append, dict.update, ...) are refused as ImmutableSandboxedEnvironment
// does: the attribute is an Undefined whose use raises SecurityError.
bool get_method(Interp& in, const Value& self, const std::string& name, Value& out);

// Python str helpers shared by filters and methods (code-point aware).
std::string str_capitalize(std::string_view s);
// center ('c'), ljust ('l'), rjust ('r') to `width` code points with `fill`.
std::string str_pad(Interp& in, const std::string& s, int64_t width, char32_t fill, char align);
std::vector<std::string> str_splitlines(std::string_view s, bool keepends);
std::string str_replace(Interp& in, const std::string& s, const std::string& old, const std::string& rep, int64_t count);
bool is_word_char(char32_t c);  // \w of Python's re (Unicode)

// Binary operators and helpers shared with filters.
Value binary_op(Interp& in, BinOp op, const Value& a, const Value& b);
bool contains(Interp& in, const Value& container, const Value& item);
// `soft`: a type error gives Undefined (a slice jinja2 folds at compile time).
Value slice(Interp& in, const Value& obj, const Value& start, const Value& stop, const Value& step, bool soft = false);
std::string percent_format(Interp& in, const std::string& fmt, const Value& args);
std::string str_format(Interp& in, const std::string& fmt, Args& args);  // str.format

// A callable object (builtin function or bound method) named `name`.
Value make_fn(std::string name, std::function<Value(Interp&, Args&)> fn);

// Python's float(str) / int(str, base) (whitespace, signs, underscores, inf/nan, 0x/0o/0b
// prefixes); false when Python would raise ValueError. `overflow`: beyond 64 bits.
bool parse_py_float(const std::string& s, double& out);
bool parse_py_int(const std::string& s, int64_t base, int64_t& out, bool& overflow);
std::string html_escape(std::string_view s);  // markupsafe.escape

// Globals: range, dict, namespace, cycler, joiner, raise_exception, strftime_now.
void add_globals(Interp& in, Frame& f);

// The Namespace object (set attributes with {% set ns.x = ... %}).
bool is_namespace(const Value& v);
void namespace_set(Interp& in, const Value& ns, const std::string& attr, Value v);

// Python-style "object_type_repr" for undefined messages: "dict object", "None", ...
std::string object_type_repr(const Value& v);
Value missing_attr(const Value& obj, const std::string& name);
Value missing_item(Ctx& c, const Value& obj, const Value& key);

}  // namespace moe::jinja::detail
