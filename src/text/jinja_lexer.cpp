// Jinja tokenizer: jinja2 lexer.py's rules, hand-applied. Comments cite the regex each
// piece replicates, because the exact whitespace behaviour is what makes a rendered chat
// prompt byte-identical to transformers'.
#include "text/jinja_lexer.h"

#include <utf8proc.h>

#include <cmath>
#include <cstring>

namespace moe::jinja::detail {

namespace {

// Python's \s (str patterns are Unicode-aware) at s[i]: returns the byte length or 0.
size_t space_at(std::string_view s, size_t i) {
  unsigned char b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return py_isspace(b) ? 1 : 0;
  char32_t cp = 0;
  size_t n = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
  if (!n || i + n > s.size()) return 0;
  std::u32string u = decode(s.substr(i, n));
  if (u.size() != 1) return 0;
  cp = u[0];
  return py_isspace(cp) ? n : 0;
}

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t n = space_at(s, i);
    if (!n) break;
    i += n;
  }
  return i;
}

// Python's str.rstrip() (Unicode whitespace) as a byte length to keep.
size_t rstrip_len(std::string_view s) {
  size_t e = s.size();
  while (e > 0) {
    size_t b = e - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80 && e - b < 4) --b;
    if (space_at(s, b) != e - b) break;
    e = b;
  }
  return e;
}

bool all_spaces(std::string_view s) {
  if (s.empty()) return false;  // whitespace_re (\s+) needs one character
  return skip_spaces(s, 0) == s.size();
}

int count_nl(std::string_view s) {
  int n = 0;
  for (char ch : s) n += ch == '\n';
  return n;
}

bool is_word_cp(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_NL: return true;
    default: return false;
  }
}

// Length of the name (\w+, Unicode) at s[i], 0 if none.
size_t name_at(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size()) {
    unsigned char b = static_cast<unsigned char>(s[j]);
    if (b < 0x80) {
      if (!(std::isalnum(b) || b == '_')) break;
      ++j;
      continue;
    }
    size_t n = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || j + n > s.size()) break;
    std::u32string u = decode(s.substr(j, n));
    if (u.size() != 1 || u[0] == 0xFFFD || !is_word_cp(u[0])) break;
    j += n;
  }
  return j - i;
}

// (\d+_)*\d+ : digits with single underscores between them.
size_t digits_at(std::string_view s, size_t i, bool (*ok)(char)) {
  size_t j = i;
  if (j >= s.size() || !ok(s[j])) return 0;
  while (j < s.size()) {
    if (ok(s[j])) {
      ++j;
    } else if (s[j] == '_' && j + 1 < s.size() && ok(s[j + 1])) {
      j += 1;
    } else {
      break;
    }
  }
  return j - i;
}
bool is_dec(char ch) { return ch >= '0' && ch <= '9'; }
bool is_bin(char ch) { return ch == '0' || ch == '1'; }
bool is_oct(char ch) { return ch >= '0' && ch <= '7'; }
bool is_hex(char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; }

std::string strip_us(std::string_view s) {
  std::string out;
  for (char ch : s)
    if (ch != '_') out += ch;
  return out;
}

const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                            "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

class Lexer {
 public:
  Lexer(std::string_view src, Ctx& c) : c_(c) {
    // newline_re.split + keep_trailing_newline=False: normalise, drop one final newline.
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_ += src[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    const std::string_view s = src_;
    while (pos_ < s.size()) {
      // root: (.*?)(?:raw_begin|{#|{%|{{)(\-|\+|)
      size_t q = pos_;
      size_t tag = std::string_view::npos;
      while ((q = s.find('{', q)) != std::string_view::npos) {
        if (q + 1 < s.size() && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) {
          tag = q;
          break;
        }
        ++q;
      }
      if (tag == std::string_view::npos) {  // data: .+
        emit_data(s.substr(pos_));
        line_ += count_nl(s.substr(pos_));
        break;
      }
      char kind = s[tag + 1];
      char sign = tag + 2 < s.size() && (s[tag + 2] == '-' || s[tag + 2] == '+') ? s[tag + 2] : 0;
      size_t after = tag + 2 + (sign ? 1 : 0);
      size_t raw_end = kind == '%' ? match_raw_begin(after) : 0;
      std::string_view text = s.substr(pos_, tag - pos_);
      int text_nl = count_nl(text);
      emit_data(lstrip(text, sign, kind == '{'));
      line_ += text_nl;
      if (raw_end) {
        line_ += count_nl(s.substr(tag, raw_end - tag));
        line_starting_ = s[raw_end - 1] == '\n';
        lex_raw(raw_end);
      } else if (kind == '#') {
        lex_comment(after);
      } else {
        line_starting_ = false;
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, std::string(s.substr(tag, after - tag)));
        pos_ = after;
        lex_tag(kind == '{');
      }
    }
    push(Tok::Eof, "");
    return std::move(toks_);
  }

 private:
  [[noreturn]] void fail(const std::string& msg) {
    c_.line = line_;
    c_.fail("TemplateSyntaxError: " + msg);
  }

  void push(Tok t, std::string text) { toks_.push_back(Token{t, line_, std::move(text)}); }

  void emit_data(std::string_view text) {
    if (!text.empty()) push(Tok::Data, std::string(text));
  }

  // OptionalLStrip: what remains of the text before a tag with whitespace sign `sign`.
  std::string_view lstrip(std::string_view text, char sign, bool is_var) {
    if (sign == '-') return text.substr(0, rstrip_len(text));
    if (sign != '+' && c_.opt().lstrip_blocks && !is_var) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_spaces(text.substr(l_pos))) return text.substr(0, l_pos);
    }
    return text;
  }

  // {%(\-|\+|)\s*raw\s*(?:\-%}\s*|%}) starting after the sign; returns the end or 0.
  size_t match_raw_begin(size_t i) {
    std::string_view s = src_;
    i = skip_spaces(s, i);
    if (s.compare(i, 3, "raw") != 0) return 0;
    i = skip_spaces(s, i + 3);
    if (s.compare(i, 3, "-%}") == 0) return skip_spaces(s, i + 3);
    if (s.compare(i, 2, "%}") == 0) return i + 2;
    return 0;
  }

  // (.*?)((?:{%(\-|\+|))\s*endraw\s*(?:\+%}|\-%}\s*|%}\n?))
  void lex_raw(size_t start) {
    std::string_view s = src_;
    for (size_t q = start; (q = s.find("{%", q)) != std::string_view::npos; ++q) {
      size_t i = q + 2;
      char sign = i < s.size() && (s[i] == '-' || s[i] == '+') ? s[i] : 0;
      if (sign) ++i;
      i = skip_spaces(s, i);
      if (s.compare(i, 6, "endraw") != 0) continue;
      i = skip_spaces(s, i + 6);
      size_t end;
      if (s.compare(i, 3, "+%}") == 0) end = i + 3;
      else if (s.compare(i, 3, "-%}") == 0) end = skip_spaces(s, i + 3);
      else if (s.compare(i, 2, "%}") == 0) end = i + 2 + (c_.opt().trim_blocks && i + 2 < s.size() && s[i + 2] == '\n');
      else continue;
      std::string_view text = s.substr(start, q - start);
      emit_data(lstrip(text, sign, false));
      line_ += count_nl(s.substr(start, end - start));
      line_starting_ = s[end - 1] == '\n';
      pos_ = end;
      return;
    }
    fail("Missing end of raw directive");
  }

  // (.*?)((?:\+#}|\-#}\s*|#}\n?))
  void lex_comment(size_t start) {
    std::string_view s = src_;
    size_t q = s.find("#}", start);
    if (q == std::string_view::npos) fail("Missing end of comment tag");
    size_t end;
    if (q > start && s[q - 1] == '-') end = skip_spaces(s, q + 2);
    else if (q > start && s[q - 1] == '+') end = q + 2;
    else end = q + 2 + (c_.opt().trim_blocks && q + 2 < s.size() && s[q + 2] == '\n');
    line_ += count_nl(s.substr(start, end - start));
    line_starting_ = s[end - 1] == '\n';
    pos_ = end;
  }

  // Inside {{ }} or {% %}: end rule first (only with balanced brackets), then whitespace,
  // float, integer, name, string, operator.
  void lex_tag(bool is_var) {
    std::string_view s = src_;
    while (true) {
      size_t p = pos_;
      if (p >= s.size()) return;  // the parser reports the missing end
      if (balance_.empty()) {
        size_t end = 0;
        if (is_var) {
          if (s.compare(p, 3, "-}}") == 0) end = skip_spaces(s, p + 3);
          else if (s.compare(p, 2, "}}") == 0) end = p + 2;
        } else {
          if (s.compare(p, 3, "+%}") == 0) end = p + 3;
          else if (s.compare(p, 3, "-%}") == 0) end = skip_spaces(s, p + 3);
          else if (s.compare(p, 2, "%}") == 0)
            end = p + 2 + (c_.opt().trim_blocks && p + 2 < s.size() && s[p + 2] == '\n');
        }
        if (end) {
          push(is_var ? Tok::VarEnd : Tok::BlockEnd, std::string(s.substr(p, end - p)));
          line_ += count_nl(s.substr(p, end - p));
          line_starting_ = s[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      if (size_t n = space_at(s, p)) {
        size_t e = skip_spaces(s, p + n);
        line_ += count_nl(s.substr(p, e - p));
        line_starting_ = s[e - 1] == '\n';
        pos_ = e;
        continue;
      }
      line_starting_ = false;
      if (lex_number(p)) continue;
      if (size_t n = name_at(s, p)) {
        push(Tok::Name, std::string(s.substr(p, n)));
        pos_ = p + n;
        continue;
      }
      if (s[p] == '\'' || s[p] == '"') {
        if (lex_string(p)) continue;
      }
      lex_operator(p);
    }
  }

  bool lex_number(size_t p) {
    std::string_view s = src_;
    if (!is_dec(s[p])) return false;
    // float: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)
    if (p == 0 || s[p - 1] != '.') {
      size_t n = digits_at(s, p, is_dec);
      size_t j = p + n, frac = 0;
      if (j < s.size() && s[j] == '.') frac = digits_at(s, j + 1, is_dec);
      size_t k = frac ? j + 1 + frac : j;
      size_t exp_end = 0;
      if (k < s.size() && (s[k] == 'e' || s[k] == 'E')) {
        size_t m = k + 1;
        if (m < s.size() && (s[m] == '+' || s[m] == '-')) ++m;
        size_t ed = digits_at(s, m, is_dec);
        if (ed) exp_end = m + ed;
      }
      size_t end = exp_end ? exp_end : frac ? k : 0;
      if (end) {
        std::string lit = strip_us(s.substr(p, end - p));
        Token t{Tok::Float, line_, lit};
        t.fval = std::strtod(lit.c_str(), nullptr);
        toks_.push_back(std::move(t));
        pos_ = end;
        return true;
      }
    }
    // integer: 0b.. | 0o.. | 0x.. | [1-9](_?\d)* | 0(_?0)*
    size_t end = 0;
    int base = 10;
    if (s[p] == '0' && p + 1 < s.size()) {
      char x = static_cast<char>(std::tolower(static_cast<unsigned char>(s[p + 1])));
      bool (*ok)(char) = x == 'b' ? is_bin : x == 'o' ? is_oct : x == 'x' ? is_hex : nullptr;
      if (ok) {
        size_t j = p + 2;
        if (j < s.size() && s[j] == '_') ++j;
        size_t n = digits_at(s, j, ok);
        if (n) {
          end = j + n;
          base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
        }
      }
    }
    if (!end) {
      if (s[p] == '0') {
        end = p + 1;
        while (end < s.size() && (s[end] == '0' || (s[end] == '_' && end + 1 < s.size() && s[end + 1] == '0')))
          end += s[end] == '_' ? 2 : 1;
      } else {
        end = p + digits_at(s, p, is_dec);
      }
    }
    std::string lit = strip_us(s.substr(p, end - p));
    std::string digits = base == 10 ? lit : lit.substr(2);
    errno = 0;
    char* stop = nullptr;
    unsigned long long v = std::strtoull(digits.c_str(), &stop, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
      fail("integer literal too large (integers are 64-bit here)");
    Token t{Tok::Int, line_, lit};
    t.ival = static_cast<int64_t>(v);
    toks_.push_back(std::move(t));
    pos_ = end;
    return true;
  }

  // '([^'\\]*(?:\\.[^'\\]*)*)' and its double-quoted twin, unescaped as Python's
  // .encode("ascii", "backslashreplace").decode("unicode-escape") does.
  bool lex_string(size_t p) {
    std::string_view s = src_;
    char q = s[p];
    size_t i = p + 1;
    while (i < s.size() && s[i] != q) i += s[i] == '\\' ? 2 : 1;
    if (i >= s.size()) return false;
    std::string_view body = s.substr(p + 1, i - p - 1);
    Token t{Tok::Str, line_, unescape(body)};
    toks_.push_back(std::move(t));
    line_ += count_nl(body);
    pos_ = i + 1;
    return true;
  }

  std::string unescape(std::string_view b) {
    std::string out;
    for (size_t i = 0; i < b.size(); ++i) {
      char ch = b[i];
      if (ch != '\\') {
        out += ch;
        continue;
      }
      if (++i >= b.size()) {
        fail("\\ at end of string");
      }
      char e = b[i];
      auto hex = [&](size_t n, const char* what) {
        uint32_t v = 0;
        for (size_t k = 1; k <= n; ++k) {
          if (i + k >= b.size() || !is_hex(b[i + k])) fail(std::string("truncated ") + what + " escape");
          char h = static_cast<char>(std::tolower(static_cast<unsigned char>(b[i + k])));
          v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
        }
        i += n;
        return v;
      };
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': append_utf8(out, hex(2, "\\xXX")); break;
        case 'u': append_utf8(out, hex(4, "\\uXXXX")); break;
        case 'U': {
          uint32_t v = hex(8, "\\UXXXXXXXX");
          if (v > 0x10FFFF) fail("illegal Unicode character");
          append_utf8(out, v);
          break;
        }
        case 'N': fail("\\N{...} escapes are not supported");
        default:
          if (is_oct(e)) {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i + 1 < b.size() && is_oct(b[i + 1]); ++k) v = v * 8 + (b[++i] - '0');
            append_utf8(out, v);
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            // backslashreplace turned the character into \xNN / \uNNNN / \UNNNNNNNN, whose
            // backslash the template's backslash then escapes.
            size_t n = 1;
            while (i + n < b.size() && (static_cast<unsigned char>(b[i + n]) & 0xC0) == 0x80) ++n;
            std::u32string u = decode(b.substr(i, n));
            char32_t cp = u.empty() ? 0xFFFD : u[0];
            out += '\\';
            out += cp < 0x100 ? fmt::format("x{:02x}", static_cast<uint32_t>(cp))
                   : cp < 0x10000 ? fmt::format("u{:04x}", static_cast<uint32_t>(cp))
                                  : fmt::format("U{:08x}", static_cast<uint32_t>(cp));
            i += n - 1;
          } else {
            out += '\\';  // unknown escapes stay as written
            out += e;
          }
      }
    }
    return out;
  }

  void lex_operator(size_t p) {
    std::string_view s = src_;
    for (const char* op : kOps) {
      size_t n = std::strlen(op);
      if (s.compare(p, n, op) != 0) continue;
      char ch = op[0];
      if (n == 1 && (ch == '{' || ch == '(' || ch == '[')) {
        balance_ += ch == '{' ? '}' : ch == '(' ? ')' : ']';
      } else if (n == 1 && (ch == '}' || ch == ')' || ch == ']')) {
        if (balance_.empty()) fail(fmt::format("unexpected '{}'", ch));
        char want = balance_.back();
        balance_.pop_back();
        if (want != ch) fail(fmt::format("unexpected '{}', expected '{}'", ch, want));
      }
      push(Tok::Op, op);
      pos_ = p + n;
      return;
    }
    std::u32string u = decode(s.substr(p, 4));
    fail(fmt::format("unexpected char {} at {}", str_repr(encode(u.substr(0, 1))), p));
  }

  Ctx& c_;
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::string balance_;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, Ctx& c) { return Lexer(source, c).run(); }

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Data: return "template data";
    case Tok::VarBegin: return "begin of print statement";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockBegin: return "begin of statement block";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::Name: return t.text;
    case Tok::Str: return "string";
    case Tok::Int: return "integer";
    case Tok::Float: return "float";
    case Tok::Op: return t.text;
    case Tok::Eof: return "end of template";
  }
  return "token";
}

}  // namespace moe::jinja::detail
