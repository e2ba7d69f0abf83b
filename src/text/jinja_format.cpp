// String formatting for the Jinja interpreter: str.format with the format-spec
// mini-language ('{:>8}', '{0[key]}', '{:,.2f}') and printf-style `'%s' % x` / |format.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "text/jinja_eval.h"

namespace moe::jinja::detail {

namespace {

// ---- str.format ------------------------------------------------------------------------------------

std::string apply_spec(Interp& in, const Value& v, const std::string& spec);

std::string format_field(Interp& in, const std::string& field, Args& a, size_t& auto_idx) {
  // field_name[!conv][:spec]
  size_t colon = std::string::npos, bang = std::string::npos;
  int depth = 0;
  for (size_t i = 0; i < field.size(); ++i) {
    char ch = field[i];
    if (ch == '[') ++depth;
    else if (ch == ']') --depth;
    else if (depth == 0 && ch == '!' && bang == std::string::npos && colon == std::string::npos) bang = i;
    else if (depth == 0 && ch == ':' && colon == std::string::npos) { colon = i; break; }
  }
  std::string name = field.substr(0, std::min(bang, colon));
  std::string conv = bang != std::string::npos ? field.substr(bang + 1, (colon == std::string::npos ? field.size() : colon) - bang - 1) : "";
  std::string spec = colon != std::string::npos ? field.substr(colon + 1) : "";
  size_t p = 0;
  while (p < name.size() && name[p] != '.' && name[p] != '[') ++p;
  std::string first = name.substr(0, p);
  Value v;
  if (first.empty() || std::all_of(first.begin(), first.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); })) {
    size_t idx = first.empty() ? auto_idx++ : static_cast<size_t>(std::stoul(first.substr(0, 9)));
    if (idx >= a.pos.size()) in.fail(fmt::format("IndexError: Replacement index {} out of range for positional args tuple", idx));
    v = a.pos[idx];
  } else {
    bool found = false;
    for (auto& [k, x] : a.kw)
      if (k == first) { v = x; found = true; }
    if (!found) in.fail(fmt::format("KeyError: {}", str_repr(first)));
  }
  while (p < name.size()) {
    if (name[p] == '.') {
      size_t e = p + 1;
      while (e < name.size() && name[e] != '.' && name[e] != '[') ++e;
      v = in.getattr(v, name.substr(p + 1, e - p - 1));
      p = e;
    } else {
      size_t e = name.find(']', p);
      if (e == std::string::npos) in.fail("ValueError: Missing ']' in format string");
      std::string key = name.substr(p + 1, e - p - 1);
      bool digits = !key.empty() && key.size() < 18 && std::all_of(key.begin(), key.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
      v = in.getitem(v, digits ? Value::integer(std::stoll(key)) : Value::str(key));
      p = e + 1;
    }
  }
  if (v.is_undefined() && !spec.empty()) in.fail_undefined(v);
  if (conv == "r" || conv == "a") {
    std::string r;
    repr(in, v, r);
    v = Value::str(r);
  } else if (conv == "s") {
    v = Value::str(to_str(in, v));
  } else if (!conv.empty()) {
    in.fail(fmt::format("ValueError: Unknown conversion specifier {}", conv));
  }
  if (spec.find('{') != std::string::npos) {
    // Nested replacement fields in the spec, e.g. {:{width}}.
    std::string s2;
    for (size_t i = 0; i < spec.size(); ++i) {
      if (spec[i] == '{') {
        size_t e = spec.find('}', i);
        if (e == std::string::npos) in.fail("ValueError: unmatched '{' in format spec");
        s2 += format_field(in, spec.substr(i + 1, e - i - 1), a, auto_idx);
        i = e;
      } else {
        s2 += spec[i];
      }
    }
    spec = s2;
  }
  return apply_spec(in, v, spec);
}

// The format-spec mini-language: [[fill]align][sign][#][0][width][,|_][.precision][type].
std::string apply_spec(Interp& in, const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(in, v);
  std::u32string u = decode(spec);
  size_t i = 0;
  char32_t fill = U' ';
  char align = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (u.size() >= 2 && is_align(u[1])) {
    fill = u[0];
    align = static_cast<char>(u[1]);
    i = 2;
  } else if (!u.empty() && is_align(u[0])) {
    align = static_cast<char>(u[0]);
    i = 1;
  }
  char sign = 0;
  if (i < u.size() && (u[i] == '+' || u[i] == '-' || u[i] == ' ')) sign = static_cast<char>(u[i++]);
  bool alt = false;
  if (i < u.size() && u[i] == '#') { alt = true; ++i; }
  if (i < u.size() && u[i] == '0') {
    if (!align) { fill = U'0'; align = '='; }
    ++i;
  }
  int64_t width = 0;
  while (i < u.size() && u[i] >= '0' && u[i] <= '9') width = std::min<int64_t>(width * 10 + (u[i++] - '0'), 100000);
  char group = 0;
  if (i < u.size() && (u[i] == ',' || u[i] == '_')) group = static_cast<char>(u[i++]);
  int64_t prec = -1;
  if (i < u.size() && u[i] == '.') {
    ++i;
    prec = 0;
    while (i < u.size() && u[i] >= '0' && u[i] <= '9') prec = std::min<int64_t>(prec * 10 + (u[i++] - '0'), 1000);
  }
  char type = i < u.size() ? static_cast<char>(u[i++]) : 0;
  if (i != u.size()) in.fail("ValueError: Invalid format specifier");
  std::string body, prefix;
  if (v.is_str() || (type == 's')) {
    if (!v.is_str()) in.fail(fmt::format("ValueError: Unknown format code 's' for object of type '{}'", type_name(v)));
    std::u32string s = decode(v.s());
    if (prec >= 0 && static_cast<size_t>(prec) < s.size()) s.resize(static_cast<size_t>(prec));
    body = encode(s);
    if (!align) align = '<';
  } else if (v.is_number()) {
    bool as_int = v.is_intlike() && (type == 0 || std::strchr("bcdoxXn", type));
    double d = v.f();
    bool neg = as_int ? v.i() < 0 : std::signbit(d);
    char buf[1100];
    if (as_int) {
      unsigned long long m = v.i() < 0 ? 0ULL - static_cast<unsigned long long>(v.i()) : static_cast<unsigned long long>(v.i());
      if (type == 'x' || type == 'X' || type == 'o') {
        std::snprintf(buf, sizeof buf, type == 'x' ? "%llx" : type == 'X' ? "%llX" : "%llo", m);
        if (alt) prefix = type == 'o' ? "0o" : type == 'x' ? "0x" : "0X";
      } else if (type == 'b') {
        std::string bits;
        do { bits += static_cast<char>('0' + (m & 1)); m >>= 1; } while (m);
        std::reverse(bits.begin(), bits.end());
        std::snprintf(buf, sizeof buf, "%s", bits.c_str());
        if (alt) prefix = "0b";
      } else if (type == 'c') {
        std::string c;
        append_utf8(c, static_cast<char32_t>(v.i()));
        std::snprintf(buf, sizeof buf, "%s", c.c_str());
        neg = false;
      } else {
        std::snprintf(buf, sizeof buf, "%llu", m);
      }
      body = buf;
    } else {
      double a = std::fabs(d);
      int p = prec < 0 ? 6 : static_cast<int>(prec);
      switch (type) {
        case 'f': case 'F': std::snprintf(buf, sizeof buf, type == 'f' ? "%.*f" : "%.*F", p, a); break;
        case 'e': case 'E': std::snprintf(buf, sizeof buf, type == 'e' ? "%.*e" : "%.*E", p, a); break;
        case 'g': case 'G': std::snprintf(buf, sizeof buf, type == 'g' ? "%.*g" : "%.*G", prec < 0 ? 6 : std::max(p, 1), a); break;
        case '%': std::snprintf(buf, sizeof buf, "%.*f%%", p, a * 100); break;
        case 0:
          if (prec < 0) std::snprintf(buf, sizeof buf, "%s", float_repr(a).c_str());
          else std::snprintf(buf, sizeof buf, "%.*g", std::max(p, 1), a);
          break;
        default: in.fail(fmt::format("ValueError: Unknown format code '{}' for object of type 'float'", type));
      }
      body = buf;
    }
    if (group) {
      size_t dot = body.find_first_of(".eE%");
      std::string ip = body.substr(0, dot), rest = dot == std::string::npos ? "" : body.substr(dot);
      std::string g;
      for (size_t k = 0; k < ip.size(); ++k) {
        if (k && (ip.size() - k) % 3 == 0) g += group;
        g += ip[k];
      }
      body = g + rest;
    }
    std::string sgn = neg ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
    prefix = sgn + prefix;
    if (!align) align = '>';
  } else {
    in.fail(fmt::format("TypeError: unsupported format string passed to {}.__format__", type_name(v)));
  }
  int64_t len = static_cast<int64_t>(cp_len(prefix) + cp_len(body));
  std::string fills;
  for (int64_t k = len; k < width; ++k) append_utf8(fills, fill);
  if (align == '=') return prefix + fills + body;
  std::string all = prefix + body;
  if (align == '<') return all + fills;
  if (align == '>') return fills + all;
  int64_t total = width - len;
  if (total <= 0) return all;
  std::string l, r;
  for (int64_t k = 0; k < total / 2; ++k) append_utf8(l, fill);
  for (int64_t k = 0; k < total - total / 2; ++k) append_utf8(r, fill);
  return l + all + r;
}

}  // namespace

std::string str_format(Interp& in, const std::string& f, Args& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char ch = f[i];
    if (ch == '{') {
      if (i + 1 < f.size() && f[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      int depth = 1;
      size_t j = i + 1;
      for (; j < f.size() && depth; ++j) depth += f[j] == '{' ? 1 : f[j] == '}' ? -1 : 0;
      if (depth) in.fail("ValueError: expected '}' before end of string");
      std::string piece = format_field(in, f.substr(i + 1, j - i - 2), a, auto_idx);
      in.step(static_cast<int64_t>(piece.size() / 64));
      out += piece;
      in.check_size(out.size());
      i = j - 1;
    } else if (ch == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      in.fail("ValueError: Single '}' encountered in format string");
    } else {
      out += ch;
    }
  }
  return out;
}

// ---- printf-style formatting (str % args) --------------------------------------------------------

namespace {
std::string pad(const std::string& s, int64_t width, bool left, char fill = ' ') {
  int64_t n = static_cast<int64_t>(cp_len(s));
  if (width <= n) return s;
  std::string p(static_cast<size_t>(width - n), fill);
  return left ? s + p : p + s;
}
}  // namespace

std::string percent_format(Interp& in, const std::string& f, const Value& args) {
  // PyUnicode_Format: a tuple supplies the arguments; anything else is the one argument,
  // and one that supports item access (dict, list, Undefined, ...) is also the mapping
  // for %(name)s and is never reported as "not all arguments converted".
  std::vector<Value> pos;
  const Value* mapping = nullptr;
  bool dict_like = false;
  if (args.is(T::List) && args.list().kind == LKind::Tuple) {
    pos = args.list().items;
  } else {
    pos.push_back(args);
    dict_like = args.is(T::Dict) || args.is_undefined() ||
                (args.is(T::List) && (args.list().kind == LKind::List || args.list().kind == LKind::Range));
    if (args.is(T::Dict)) mapping = &args;
  }
  size_t next = 0;
  std::string out;
  auto take = [&]() -> Value {
    if (next >= pos.size()) in.fail("TypeError: not enough arguments for format string");
    return pos[next++];
  };
  in.step(static_cast<int64_t>(f.size() / 64));
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) in.fail("ValueError: incomplete format");
    Value arg;
    bool have_arg = false;
    if (f[i] == '(') {
      size_t e = f.find(')', i);
      if (e == std::string::npos) in.fail("ValueError: incomplete format key");
      if (!mapping) in.fail("TypeError: format requires a mapping");
      const Value* v = mapping->dict().find_str(f.substr(i + 1, e - i - 1));
      if (!v) in.fail(fmt::format("KeyError: {}", str_repr(f.substr(i + 1, e - i - 1))));
      arg = *v;
      have_arg = true;
      i = e + 1;
    }
    std::string flags;
    while (i < f.size() && std::strchr("-+ #0", f[i])) flags += f[i++];
    auto number = [&]() -> int64_t {
      if (i < f.size() && f[i] == '*') {
        ++i;
        Value w = take();
        if (!w.is_intlike()) in.fail("TypeError: * wants int");
        return w.i();
      }
      int64_t n = 0;
      while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) n = std::min<int64_t>(n * 10 + (f[i++] - '0'), 100000);
      return n;
    };
    int64_t width = number();
    int64_t prec = -1;
    if (i < f.size() && f[i] == '.') {
      ++i;
      prec = number();
    }
    while (i < f.size() && (f[i] == 'l' || f[i] == 'h' || f[i] == 'L')) ++i;
    if (i >= f.size()) in.fail("ValueError: incomplete format");
    char conv = f[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!have_arg) arg = take();
    bool left = flags.find('-') != std::string::npos;
    std::string piece;
    switch (conv) {
      case 's': piece = to_str(in, arg); if (prec >= 0) piece = encode(decode(piece).substr(0, static_cast<size_t>(prec))); break;
      case 'r':
      case 'a': repr(in, arg, piece); break;
      case 'c':
        if (arg.is_str()) piece = arg.s();
        else if (arg.is_intlike()) append_utf8(piece, static_cast<char32_t>(arg.i()));
        else in.fail("TypeError: %c requires int or char");
        break;
      case 'd': case 'i': case 'u': case 'x': case 'X': case 'o':
      case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
        if (arg.is_undefined()) in.fail_undefined(arg);
        if (!arg.is_number())
          in.fail(fmt::format("TypeError: %{} format: a real number is required, not {}", conv, type_name(arg)));
        std::string spec = "%" + flags;
        if (width) spec += std::to_string(width);
        if (prec >= 0) spec += fmt::format(".{}", prec);
        char buf[512];
        bool is_int_conv = std::strchr("diuxXo", conv) != nullptr;
        if (is_int_conv) {
          spec += "ll";
          spec += conv == 'u' ? 'd' : conv == 'i' ? 'd' : conv;
          long long v = arg.is(T::Float) ? static_cast<long long>(std::trunc(arg.f())) : arg.i();
          std::snprintf(buf, sizeof buf, spec.c_str(), v);
        } else {
          spec += conv;
          std::snprintf(buf, sizeof buf, spec.c_str(), arg.f());
        }
        out += buf;
        in.check_size(out.size());
        continue;
      }
      default: in.fail(fmt::format("ValueError: unsupported format character '{}'", conv));
    }
    out += pad(piece, width, left);
    in.step(static_cast<int64_t>(piece.size() / 64));
    in.check_size(out.size());
  }
  if (!dict_like && next < pos.size()) in.fail("TypeError: not all arguments converted during string formatting");
  return out;
}

}  // namespace moe::jinja::detail
