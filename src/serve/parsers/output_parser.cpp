#include "serve/parsers/output_parser.h"

#include <random>

namespace moe::serve::parsers {

IdSource random_ids(ToolCallKind kind) {
  const size_t n = kind == ToolCallKind::mistral ? 9 : 24;
  const char* prefix = kind == ToolCallKind::mistral ? "" : "call_";
  return [n, prefix] {
    // Ids must differ between calls, not be secret: one generator per thread.
    thread_local std::mt19937_64 rng([] {
      std::random_device rd;
      return (uint64_t(rd()) << 32) ^ rd();
    }());
    static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id = prefix;
    for (size_t i = 0; i < n; ++i) id += kAlnum[rng() % 62];
    return id;
  };
}

OutputParser::OutputParser(const ParseOptions& opt, IdSource ids) : reasoning_(opt.reasoning, opt.prompt) {
  if (opt.tools != ToolCallKind::none) {
    ToolCallOptions t;
    t.kind = opt.tools;
    t.tools = opt.tool_list;
    t.only_name = opt.only_name;
    t.new_id = ids ? std::move(ids) : random_ids(opt.tools);
    tools_.emplace(std::move(t));
  }
}

void OutputParser::route(ReasoningSplitter::Out&& o, Events& out) {
  add_text(out, Event::Kind::reasoning, o.reasoning);
  if (!tools_) {
    add_text(out, Event::Kind::content, o.content);
    return;
  }
  const size_t before = out.size();
  if (!o.content.empty()) tools_->push(o.content, out);
  for (size_t i = before; i < out.size(); ++i) calls_ += out[i].kind == Event::Kind::tool_call;
}

Events OutputParser::push(std::string_view text) {
  Events out;
  route(reasoning_.push(text), out);
  return out;
}

Events OutputParser::finish() {
  Events out;
  route(reasoning_.finish(), out);
  if (tools_) {
    const size_t before = out.size();
    tools_->finish(out);
    for (size_t i = before; i < out.size(); ++i) calls_ += out[i].kind == Event::Kind::tool_call;
  }
  return out;
}

ParsedOutput parse_output(const ParseOptions& opt, std::string_view text, IdSource ids) {
  OutputParser p(opt, std::move(ids));
  Events ev = p.push(text);
  for (Event& e : p.finish()) ev.push_back(std::move(e));
  ParsedOutput r;
  for (Event& e : ev) {
    switch (e.kind) {
      case Event::Kind::reasoning:
        if (!r.reasoning) r.reasoning.emplace();
        *r.reasoning += e.text;
        break;
      case Event::Kind::content: r.content += e.text; break;
      case Event::Kind::tool_call: r.calls.push_back(std::move(e.call)); break;
    }
  }
  return r;
}

}  // namespace moe::serve::parsers
