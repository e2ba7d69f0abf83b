// The Jinja interpreter against jinja2 3.1.6 configured as transformers 5.24 configures
// it (tests/fixtures/text/jinja_cases.json, from tools/gen_jinja_cases.py), plus the
// limits that keep hostile templates from crashing, hanging or exhausting memory.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "text/jinja.h"

using moe::jinja::Options;
using moe::jinja::Template;
using ojson = nlohmann::ordered_json;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::string name, tmpl, output, error;
  ojson context;
  bool is_error = false, loose = false;
};

std::vector<Case> load_cases() {
  std::vector<Case> out;
  std::string text = read_file(std::string(MOE_FIXTURES_DIR) + "/text/jinja_cases.json");
  if (text.empty()) return out;
  for (const auto& j : ojson::parse(text)) {
    Case c;
    c.name = j.at("name").get<std::string>();
    c.tmpl = j.at("template").get<std::string>();
    c.context = j.at("context");
    if (j.contains("error")) {
      c.is_error = true;
      c.error = j.at("error").get<std::string>();
      c.loose = j.value("loose_error", false);
    } else {
      c.output = j.at("output").get<std::string>();
    }
    out.push_back(std::move(c));
  }
  return out;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = load_cases();
  return c;
}

std::string render(const std::string& src, const ojson& ctx = ojson::object(), Options opt = {}) {
  return Template(src, "t", opt).render(ctx);
}

// The error message of rendering `src`, or "" when it renders.
std::string error_of(const std::string& src, const ojson& ctx = ojson::object(), Options opt = {}) {
  try {
    render(src, ctx, opt);
  } catch (const moe::Error& e) {
    return e.what();
  }
  return "";
}

class JinjaCase : public ::testing::TestWithParam<size_t> {};

TEST_P(JinjaCase, MatchesJinja2) {
  const Case& c = cases()[GetParam()];
  SCOPED_TRACE("template: " + c.tmpl);
  if (!c.is_error) {
    std::string got;
    try {
      got = Template(c.tmpl, c.name).render(c.context);
    } catch (const moe::Error& e) {
      FAIL() << "unexpected error: " << e.what() << "\nexpected: " << c.output;
    }
    EXPECT_EQ(got, c.output);
    return;
  }
  std::string err;
  try {
    std::string got = Template(c.tmpl, c.name).render(c.context);
    FAIL() << "rendered " << ::testing::PrintToString(got) << " but jinja2 raised " << c.error;
  } catch (const moe::Error& e) {
    err = e.what();
  }
  if (!c.loose) {
    EXPECT_NE(err.find(c.error), std::string::npos) << "ours: " << err << "\njinja2: " << c.error;
  }
  // Every error names the template.
  EXPECT_NE(err.find(c.name + ":"), std::string::npos) << err;
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) { return cases()[info.param].name; }

std::vector<size_t> case_indices() {
  std::vector<size_t> v(cases().size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

INSTANTIATE_TEST_SUITE_P(JinjaGolden, JinjaCase, ::testing::ValuesIn(case_indices()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(JinjaCase);

TEST(JinjaGoldenFile, HasCases) { EXPECT_GE(cases().size(), 250u) << "tests/fixtures/text/jinja_cases.json"; }

// ---- errors name the line -------------------------------------------------------------------------

TEST(JinjaErrors, SyntaxErrorNamesLine) {
  std::string e;
  try {
    Template("line1\nline2\n{% if x %}\n{{ 1 + }}\n", "my_tmpl");
  } catch (const moe::Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("my_tmpl:4:"), std::string::npos) << e;
}

TEST(JinjaErrors, RuntimeErrorNamesLine) {
  std::string e = error_of("a\nb\n\n{{ nope + 1 }}");
  EXPECT_NE(e.find("t:4:"), std::string::npos) << e;
  EXPECT_NE(e.find("'nope' is undefined"), std::string::npos) << e;
}

TEST(JinjaErrors, ErrorInsideMacroNamesMacroLine) {
  std::string e = error_of("{% macro m() %}\n\n{{ raise_exception('deep') }}{% endmacro %}\n\n{{ m() }}");
  EXPECT_NE(e.find("t:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("TemplateError: deep"), std::string::npos) << e;
}

TEST(JinjaErrors, UnknownFilterAtParseTime) {
  EXPECT_THROW(Template("{{ x|nope }}"), moe::Error);
  // Inside an if, jinja2 defers it to run time.
  EXPECT_EQ(render("{% if false %}{{ x|nope }}{% endif %}ok"), "ok");
  EXPECT_NE(error_of("{% if true %}{{ x|nope }}{% endif %}").find("No filter named 'nope'"), std::string::npos);
}

TEST(JinjaErrors, InvalidUtf8TemplateRejected) {
  EXPECT_THROW(Template(std::string("ab\xff") + "cd"), moe::Error);
}

TEST(JinjaErrors, UnsupportedTagsRejected) {
  EXPECT_THROW(Template("{% include 'x.jinja' %}"), moe::Error);
  EXPECT_THROW(Template("{% extends 'x.jinja' %}"), moe::Error);
  EXPECT_THROW(Template("{% import 'x' as y %}"), moe::Error);
  EXPECT_THROW(Template("{% autoescape true %}{% endautoescape %}"), moe::Error);
}

// ---- globals ------------------------------------------------------------------------------------

TEST(JinjaGlobals, StrftimeNowFormats) {
  std::string out = render("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}");
  EXPECT_TRUE(std::regex_match(out, std::regex(R"(\d{4}-\d{2}-\d{2}\|\d{2} [A-Z][a-z]{2} \d{4})"))) << out;
}

TEST(JinjaGlobals, OrderedContextKeepsKeyOrder) {
  ojson ctx = ojson::parse(R"({"tool": {"type": "function", "function": {"name": "f", "a": 1}}})");
  EXPECT_EQ(render("{{ tool|tojson }}", ctx), R"({"type": "function", "function": {"name": "f", "a": 1}})");
  // The nlohmann::json overload sees sorted keys (std::map): documented in jinja.h.
  nlohmann::json sorted = ctx;
  EXPECT_EQ(Template("{{ tool|tojson }}").render(sorted), R"({"function": {"a": 1, "name": "f"}, "type": "function"})");
}

TEST(JinjaConcurrency, RendersFromManyThreads) {
  Template t("{% for m in messages %}{{ m.role }}:{{ m.content|upper }};{% endfor %}{% set ns = namespace(n=0) %}"
             "{% for i in range(100) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}");
  ojson ctx = ojson::parse(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})");
  const std::string want = "user:HI;assistant:YO;4950";
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&] {
      for (int i = 0; i < 200; ++i)
        if (t.render(ctx) != want) ++bad;
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- limits: hostile templates fail fast ------------------------------------------------------------

// Runs `src` and returns its error, checking it took well under a few seconds.
std::string fast_error(const std::string& src, Options opt = {}) {
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of(src, ojson::object(), opt);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0) << src.substr(0, 80);
  return e;
}

TEST(JinjaLimits, InfiniteMacroRecursion) {
  std::string e = fast_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
  EXPECT_NE(e.find("RecursionError"), std::string::npos) << e;
}

TEST(JinjaLimits, MutualRecursionThroughCaller) {
  std::string e = fast_error("{% macro a() %}{% call a() %}x{% endcall %}{{ caller() }}{% endmacro %}{{ a() }}");
  EXPECT_NE(e.find("RecursionError"), std::string::npos) << e;
}

TEST(JinjaLimits, HugeRange) {
  EXPECT_NE(fast_error("{% for i in range(10**9) %}{% endfor %}").find("Range too big"), std::string::npos);
}

TEST(JinjaLimits, NestedLoopsRunOutOfSteps) {
  std::string e = fast_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(e.find("too long"), std::string::npos) << e;
}

TEST(JinjaLimits, StringMultiplicationBomb) {
  EXPECT_NE(fast_error("{{ 'a' * 10**12 }}").find("too large"), std::string::npos);
  EXPECT_NE(fast_error("{{ [1, 2] * 10**12 }}").find("too large"), std::string::npos);
  EXPECT_NE(fast_error("{{ ('a' * 1000000) * 1000 }}").find("too large"), std::string::npos);
}

TEST(JinjaLimits, StringDoublingLoop) {
  std::string e = fast_error("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
                             "{% endfor %}{{ ns.s|length }}");
  EXPECT_FALSE(e.empty());
}

TEST(JinjaLimits, RepeatedBigCopiesRunOutOfSteps) {
  std::string e = fast_error("{% set big = 'x' * 30000000 %}{% for i in range(100000) %}{% set y = big ~ big %}"
                             "{% endfor %}");
  EXPECT_NE(e.find("too long"), std::string::npos) << e;
}

TEST(JinjaLimits, OutputCap) {
  Options o;
  o.max_output = 1000;
  EXPECT_NE(fast_error("{% for i in range(500) %}xxxxx{% endfor %}", o).find("output too large"), std::string::npos);
  EXPECT_NE(fast_error("{{ 'x' * 2000 }}", o).find("too large"), std::string::npos);
}

TEST(JinjaLimits, DeepParentheses) {
  std::string src = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_NE(fast_error(src).find("nested too deeply"), std::string::npos);
  std::string lists = "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}";
  EXPECT_NE(fast_error(lists).find("nested too deeply"), std::string::npos);
  std::string neg = "{{ " + std::string(100000, '-') + "1 }}";
  EXPECT_NE(fast_error(neg).find("nested too deeply"), std::string::npos);
  std::string nots;
  for (int i = 0; i < 20000; ++i) nots += "not ";
  EXPECT_NE(fast_error("{{ " + nots + "1 }}").find("nested too deeply"), std::string::npos);
}

TEST(JinjaLimits, LongOperatorChain) {
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  chain += " }}";
  EXPECT_NE(fast_error(chain).find("nested too deeply"), std::string::npos);
  std::string filters = "{{ 1";
  for (int i = 0; i < 100000; ++i) filters += "|abs";
  EXPECT_NE(fast_error(filters + " }}").find("nested too deeply"), std::string::npos);
}

TEST(JinjaLimits, DeepStatementNesting) {
  std::string src;
  for (int i = 0; i < 5000; ++i) src += "{% if true %}";
  src += "x";
  for (int i = 0; i < 5000; ++i) src += "{% endif %}";
  EXPECT_NE(fast_error(src).find("nested too deeply"), std::string::npos);
}

TEST(JinjaLimits, DeepBlocksInsideRecursionStayOnTheStack) {
  // Each limit alone allows this (150 nested loops, calls 200 deep); together they would
  // overflow the C++ stack without the stack measurement.
  std::string body;
  for (int i = 0; i < 150; ++i) body += "{% for x in [1] %}";
  body += "{{ r(k + 1) }}";
  for (int i = 0; i < 150; ++i) body += "{% endfor %}";
  std::string e = fast_error("{% macro r(k) %}" + body + "{% endmacro %}{{ r(0) }}");
  EXPECT_NE(e.find("RecursionError"), std::string::npos) << e;
  std::string ifs;
  for (int i = 0; i < 190; ++i) ifs += "{% if true %}";
  ifs += "{{ r(k + 1) }}";
  for (int i = 0; i < 190; ++i) ifs += "{% endif %}";
  e = fast_error("{% macro r(k) %}" + ifs + "{% endmacro %}{{ r(0) }}");
  EXPECT_NE(e.find("RecursionError"), std::string::npos) << e;
}

TEST(JinjaLimits, ModerateNestingStillWorks) {
  // What real templates need, and what jinja2 itself handles, must pass.
  std::string src = "{{ " + std::string(60, '(') + "1" + std::string(60, ')') + " }}";
  EXPECT_EQ(render(src), "1");
  std::string ifs;
  for (int i = 0; i < 50; ++i) ifs += "{% if true %}";
  ifs += "y";
  for (int i = 0; i < 50; ++i) ifs += "{% endif %}";
  EXPECT_EQ(render(ifs), "y");
  EXPECT_EQ(render("{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% else %}done{% endif %}{% endmacro %}{{ r(150) }}"),
            "done");
}

TEST(JinjaLimits, DeepValueBuiltInLoop) {
  // Building a deeply nested list is allowed (within the step budget), printing it is
  // refused, and dropping it must not overflow the stack.
  std::string e = fast_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                             "{% endfor %}{{ ns.x }}");
  EXPECT_NE(e.find("nested too deeply"), std::string::npos) << e;
  EXPECT_EQ(render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                   "{% set ns.x = none %}ok"),
            "ok");
}

TEST(JinjaLimits, NamespaceChainDropped) {
  // A 100000-long chain of namespaces, then released in one assignment.
  EXPECT_EQ(render("{% set ns = namespace(head=none) %}{% for i in range(100000) %}"
                   "{% set ns.head = namespace(next=ns.head) %}{% endfor %}{% set ns.head = none %}ok"),
            "ok");
}

TEST(JinjaLimits, SelfReferencingNamespaceDoesNotLeakOrLoop) {
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me.me is defined }}"), "True");
  EXPECT_NE(fast_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}").find("nested too deeply"),
            std::string::npos);
}

TEST(JinjaLimits, AdversarialSubstringSearchIsLinear) {
  // Naive search would take ~10^11 steps here.
  const std::string setup = "{% set a = 'a' * 2000000 %}{% set b = 'a' * 1000000 ~ 'b' %}";
  EXPECT_EQ(render(setup + "{{ b in a }}|{{ a.find(b) }}|{{ a.rfind(b) }}|{{ a.count(b) }}|{{ a.split(b)|length }}|"
                           "{{ a.rsplit(b)|length }}|{{ a.replace(b, 'x')|length }}|{{ a.partition(b)[1] }}|"
                           "{{ a.rpartition(b)[1] }}|{{ a.strip(b)|length }}"),
            "False|-1|-1|0|1|1|2000000|||0");
  EXPECT_EQ(render("{% set a = 'a' * 2000000 %}{% set b = 'a' * 1000000 %}{{ a.rfind(b) }} {{ a.find(b, 5) }} "
                   "{{ a.count(b) }} {{ ('x' ~ a).rfind(b ~ 'a') }}"),
            "1000000 5 2 1000000");
}

TEST(JinjaLimits, WorkOnBigStringsIsCharged) {
  const std::string big = "{% set a = 'a' * 1000000 %}";
  EXPECT_NE(fast_error(big + "{% for i in range(100000) %}{% set x = a|trim %}{% endfor %}").find("too long"),
            std::string::npos);
  EXPECT_NE(fast_error(big + "{% for i in range(100000) %}{% set x = a.upper() %}{% endfor %}").find("too long"),
            std::string::npos);
  EXPECT_NE(fast_error(big + "{{ ([a] * 100000)|unique|list|length }}").find("too long"), std::string::npos);
  EXPECT_NE(fast_error(big + "{% for i in range(100000) %}{% set x = a == a ~ '' %}{% endfor %}").find("too long"),
            std::string::npos);
  EXPECT_NE(fast_error(big + "{% for i in range(100000) %}{% set x = a|tojson %}{% endfor %}").find("too long"),
            std::string::npos);
}

TEST(JinjaLimits, IntegerOverflowIsAnError) {
  EXPECT_NE(fast_error("{{ 2 ** 64 }}").find("OverflowError"), std::string::npos);
  EXPECT_NE(fast_error("{{ 9223372036854775807 + 1 }}").find("OverflowError"), std::string::npos);
  EXPECT_NE(fast_error("{{ 99999999999999999999 }}").find("too large"), std::string::npos);
}

TEST(JinjaLimits, CustomStepBudget) {
  Options o;
  o.max_steps = 1000;
  EXPECT_NE(fast_error("{% for i in range(10000) %}{{ i }}{% endfor %}", o).find("too long"), std::string::npos);
}

}  // namespace
