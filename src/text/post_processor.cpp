// See post_processor.h (tokenizers' src/processors/{template,bert,roberta,sequence}.rs).
#include "text/post_processor.h"

#include <map>

namespace moe::text {

namespace {

using js::json;
using Added = std::vector<std::pair<std::string, int32_t>>;

// A template of a single sequence: the special tokens before and after $A.
class TemplateP final : public PostProcessor {
 public:
  struct Piece {
    bool is_seq;
    std::vector<int32_t> ids;
    std::vector<std::string> tokens;
  };
  std::vector<Piece> single;
  void process(std::vector<int32_t>& ids, bool add) const override {
    if (!add) return;
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& p : single) {
      if (p.is_seq)
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
    ids.swap(out);
  }
  void added_tokens(Added& front, Added& back) const override {
    bool seen = false;
    for (const auto& p : single) {
      if (p.is_seq) {
        seen = true;
        continue;
      }
      for (size_t k = 0; k < p.ids.size(); ++k) (seen ? back : front).emplace_back(p.tokens[k], p.ids[k]);
    }
  }
};

class SequenceP final : public PostProcessor {
 public:
  std::vector<std::unique_ptr<PostProcessor>> items;
  void process(std::vector<int32_t>& ids, bool add) const override {
    for (const auto& p : items) p->process(ids, add);
  }
  void added_tokens(Added& front, Added& back) const override {
    for (const auto& p : items) p->added_tokens(front, back);
  }
};

class NoopP final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&, bool) const override {}
  void added_tokens(Added&, Added&) const override {}
};

// (token, id) pair as BertProcessing / RobertaProcessing store cls and sep.
std::pair<std::string, int32_t> token_pair(const json& j, const char* key, const std::string& where) {
  const json& v = js::req(j, key, where);
  MOE_CHECK(v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_number_integer(),
            "{}: '{}' must be [\"token\", id]", where, key);
  const int64_t id = v[1].get<int64_t>();
  MOE_CHECK(id >= 0 && id < (int64_t{1} << 31), "{}: '{}' id {} is out of range", where, key, id);
  return {v[0].get<std::string>(), static_cast<int32_t>(id)};
}

std::vector<TemplateP::Piece> parse_template(const json& t, const std::map<std::string, TemplateP::Piece>& specials,
                                             const std::string& where) {
  MOE_CHECK(t.is_array(), "{}: a template must be a list of pieces", where);
  std::vector<TemplateP::Piece> out;
  for (size_t i = 0; i < t.size(); ++i) {
    const json& p = t[i];
    const std::string w = fmt::format("{}[{}]", where, i);
    std::string special;
    bool is_seq = false;
    if (p.is_string()) {
      // "$A", "$B:1", "[CLS]", "[CLS]:0" (the string form the Python API accepts).
      std::string s = p.get<std::string>();
      if (const size_t c = s.rfind(':'); c != std::string::npos) s.resize(c);
      if (!s.empty() && s[0] == '$')
        is_seq = true;
      else
        special = s;
    } else if (const json* sq = js::find(p, "Sequence")) {
      MOE_CHECK(sq->is_object(), "{}: 'Sequence' must be an object", w);
      const std::string id = js::str(*sq, "id", w + ".Sequence");
      MOE_CHECK(id == "A" || id == "B", "{}: sequence id must be A or B, got '{}'", w, id);
      if (id == "B") continue;  // only in pair templates
      is_seq = true;
    } else if (const json* sp = js::find(p, "SpecialToken")) {
      special = js::str(*sp, "id", w + ".SpecialToken");
    } else {
      MOE_FAIL("{}: a template piece must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", w);
    }
    if (is_seq) {
      out.push_back({true, {}, {}});
      continue;
    }
    auto it = specials.find(special);
    MOE_CHECK(it != specials.end(), "{}: special token '{}' is used in the template but missing from "
              "special_tokens", w, special);
    out.push_back(it->second);
  }
  return out;
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = js::type_of(j, where);
  if (type == "TemplateProcessing") {
    std::map<std::string, TemplateP::Piece> specials;
    if (const json* st = js::find(j, "special_tokens"); st && !st->is_null()) {
      MOE_CHECK(st->is_object(), "{}: 'special_tokens' must be an object", where);
      for (auto it = st->begin(); it != st->end(); ++it) {
        const std::string w = fmt::format("{}.special_tokens['{}']", where, it.key());
        const json& ids = js::arr(it.value(), "ids", w);
        const json& toks = js::arr(it.value(), "tokens", w);
        MOE_CHECK(ids.size() == toks.size(), "{}: ids and tokens must be of the same length", w);
        TemplateP::Piece p{false, {}, {}};
        for (size_t k = 0; k < ids.size(); ++k) {
          MOE_CHECK(ids[k].is_number_integer() && ids[k].get<int64_t>() >= 0 &&
                        ids[k].get<int64_t>() < (int64_t{1} << 31),
                    "{}: ids must be integers in [0, 2^31)", w);
          MOE_CHECK(toks[k].is_string(), "{}: tokens must be strings", w);
          p.ids.push_back(static_cast<int32_t>(ids[k].get<int64_t>()));
          p.tokens.push_back(toks[k].get<std::string>());
        }
        specials.emplace(it.key(), std::move(p));
      }
    }
    auto t = std::make_unique<TemplateP>();
    if (const json* s = js::find(j, "single"))
      t->single = parse_template(*s, specials, where + ".single");
    else
      t->single = {{true, {}, {}}};
    if (const json* p = js::find(j, "pair")) parse_template(*p, specials, where + ".pair");
    return t;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto [cls, cls_id] = token_pair(j, "cls", where);
    auto [sep, sep_id] = token_pair(j, "sep", where);
    auto t = std::make_unique<TemplateP>();
    t->single = {{false, {cls_id}, {cls}}, {true, {}, {}}, {false, {sep_id}, {sep}}};
    return t;
  }
  if (type == "ByteLevel") return std::make_unique<NoopP>();
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceP>();
    const json& list = js::arr(j, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_post_processor(list[i], fmt::format("{}.processors[{}]", where, i));
      MOE_CHECK(p != nullptr, "{}.processors[{}]: null post-processor in a Sequence", where, i);
      seq->items.push_back(std::move(p));
    }
    return seq;
  }
  MOE_FAIL("{}: unsupported post_processor type '{}' (supported: TemplateProcessing, BertProcessing, "
           "RobertaProcessing, ByteLevel, Sequence)",
           where, type);
}

}  // namespace moe::text
