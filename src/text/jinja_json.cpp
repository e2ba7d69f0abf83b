// JSON in and out for the Jinja interpreter: the render context (nlohmann JSON, key order
// kept for ordered_json) becomes Values, and |tojson writes Python's json.dumps exactly
// (separators, indent, ensure_ascii, sort_keys, NaN/Infinity, int/float/bool/None keys).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "text/jinja_value.h"

namespace moe::jinja::detail {

// ---- JSON ------------------------------------------------------------------------------------------

namespace {
template <class J>
Value json_to_value(Ctx& c, const J& j) {
  c.step();
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) c.fail("integer in the context is out of range");
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::real(j.template get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = j.template get_ref<const std::string&>();
      c.charge(s.size());
      return Value::str(s);
    }
    case nlohmann::json::value_t::array: {
      DepthGuard g(c);
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(json_to_value(c, e));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      DepthGuard g(c);
      auto d = std::make_shared<DictObj>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(c, Value::str(it.key()), json_to_value(c, it.value()));
      return Value::from(T::Dict, std::move(d));
    }
    default: c.fail("unsupported JSON value in the context (binary)");
  }
}
}  // namespace

Value from_json(Ctx& c, const nlohmann::ordered_json& j) { return json_to_value(c, j); }
Value from_json(Ctx& c, const nlohmann::json& j) { return json_to_value(c, j); }

namespace {
void json_str(std::string_view s, bool ascii, std::string& out) {
  out += '"';
  for (char32_t ch : decode(s)) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (ch < 0x20 || (ascii && ch >= 0x7f)) {
          if (ch >= 0x10000) {
            char32_t v = ch - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(ch));
          }
        } else {
          append_utf8(out, ch);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

[[noreturn]] void not_serializable(Ctx& c, const Value& v) {
  const char* tn = type_name(v);
  if (v.is(T::Obj) && std::strcmp(tn, "Namespace") == 0) tn = "TemplateNamespace";
  c.fail(fmt::format("TypeError: Object of type {} is not JSON serializable", tn));
}

void newline_indent(const JsonOpts& o, int level, std::string& out) {
  out += '\n';
  for (int i = 0; i < level; ++i) out += o.indent;
}
}  // namespace

void to_json(Ctx& c, const Value& v, const JsonOpts& o, std::string& out, int level) {
  c.step();
  if (out.size() > static_cast<size_t>(c.opt().max_output)) c.charge(out.size());
  switch (v.type()) {
    case T::None: out += "null"; return;
    case T::Bool: out += v.b() ? "true" : "false"; return;
    case T::Int: out += std::to_string(v.i()); return;
    case T::Float: out += json_float(v.f()); return;
    case T::Str:
      c.step(static_cast<int64_t>(v.s().size() / 16));
      json_str(v.s(), o.ensure_ascii, out);
      return;
    case T::List: {
      const ListObj& l = v.list();
      if (l.kind != LKind::List && l.kind != LKind::Tuple) not_serializable(c, v);
      if (l.items.empty()) {
        out += "[]";
        return;
      }
      DepthGuard g(c);
      out += '[';
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.has_indent) newline_indent(o, level + 1, out);
        to_json(c, l.items[i], o, out, level + 1);
      }
      if (o.has_indent) newline_indent(o, level, out);
      out += ']';
      return;
    }
    case T::Dict: {
      const DictObj& d = v.dict();
      if (d.items.empty()) {
        out += "{}";
        return;
      }
      DepthGuard g(c);
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : d.items) items.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [&](auto* a, auto* b) {
          return py_cmp(c, a->first, b->first, "<") < 0;
        });
      }
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += o.item_sep;
        first = false;
        if (o.has_indent) newline_indent(o, level + 1, out);
        const Value& k = kv->first;
        switch (k.type()) {
          case T::Str: json_str(k.s(), o.ensure_ascii, out); break;
          case T::None: out += "\"null\""; break;
          case T::Bool: out += k.b() ? "\"true\"" : "\"false\""; break;
          case T::Int: out += '"' + std::to_string(k.i()) + '"'; break;
          case T::Float: out += '"' + json_float(k.f()) + '"'; break;
          default:
            c.fail(fmt::format("TypeError: keys must be str, int, float, bool or None, not {}",
                               type_name(k)));
        }
        out += o.key_sep;
        to_json(c, kv->second, o, out, level + 1);
      }
      if (o.has_indent) newline_indent(o, level, out);
      out += '}';
      return;
    }
    default: not_serializable(c, v);
  }
}

}  // namespace moe::jinja::detail
