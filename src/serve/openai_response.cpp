// The OpenAI API's responses (serve/openai.h): error bodies, chat and completion
// responses with logprobs and usage, and the SSE chunks of a stream, with the reply
// split by the output parsers (serve/parsers/) into content, reasoning_content and
// tool_calls. The requests are parsed in openai.cpp.
#include "serve/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace moe::serve {

using json = Json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json error_json(const ServeError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json() : json(e.param)},
            {"code", e.code.empty() ? json() : json(e.code)}}}};
}

namespace {

// JSON has no -inf; vLLM writes -9999.0 for a token the filter made impossible.
double finite_logprob(float lp) { return std::isfinite(lp) ? double(lp) : -9999.0; }

std::string token_text(const text::Tokenizer& tok, int32_t id) {
  try {
    return tok.decode({id});
  } catch (const std::exception&) {
    return "";  // an id out of range is an engine bug; the logprobs entry stays usable
  }
}

json utf8_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// Characters (code points) in UTF-8 text: OpenAI's text_offset counts characters.
int64_t char_count(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}
json chat_logprobs(const std::vector<TokenLogprob>& toks, const text::Tokenizer& tok) {
  json content = json::array();
  for (const TokenLogprob& t : toks) {
    const std::string s = token_text(tok, t.id);
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string ts = token_text(tok, id);
      top.push_back({{"token", ts}, {"logprob", finite_logprob(lp)}, {"bytes", utf8_bytes(ts)}});
    }
    content.push_back({{"token", s}, {"logprob", finite_logprob(t.logprob)}, {"bytes", utf8_bytes(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; *offset is
// the characters of the choice's text before these tokens and advances past them.
json completion_logprobs(const std::vector<TokenLogprob>& toks, const text::Tokenizer& tok, int64_t* offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : toks) {
    const std::string s = token_text(tok, t.id);
    tokens.push_back(s);
    lps.push_back(finite_logprob(t.logprob));
    json top = json::object();
    for (const auto& [id, lp] : t.top) top[token_text(tok, id)] = finite_logprob(lp);
    tops.push_back(std::move(top));
    offsets.push_back(*offset);
    *offset += char_count(s);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// OpenAI's usage, with prompt_tokens_details.cached_tokens (the prompt tokens the prefix
// cache served) as OpenAI and vLLM report it.
json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}


// A reply that called tools ends with "tool_calls" (OpenAI's reason); one cut by
// max_tokens keeps "length", so the client sees that it was cut.
const char* parsed_finish_reason(Finish f, bool called) {
  return called && f == Finish::stop ? "tool_calls" : finish_reason(f);
}

json tool_call_json(const parsers::ToolCall& c) {
  return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// The assistant message of a chat reply: content, plus reasoning_content (when a
// reasoning parser runs) and tool_calls (when there are any). content is null when
// the reply is all reasoning or calls, as in OpenAI's and vLLM's answers.
json chat_message(const ApiRequest& req, const Output& out, parsers::IdSource ids, const char** finish) {
  *finish = finish_reason(out.finish);
  if (!req.parse.active()) return {{"role", "assistant"}, {"content", out.text}};
  parsers::ParsedOutput p = parsers::parse_output(req.parse, out.text, std::move(ids));
  const bool other = p.reasoning || !p.calls.empty();
  json msg = {{"role", "assistant"}, {"content", p.content.empty() && other ? json() : json(p.content)}};
  if (req.parse.reasoning != parsers::ReasoningKind::none)
    msg["reasoning_content"] = p.reasoning ? json(*p.reasoning) : json();
  if (!p.calls.empty()) {
    json calls = json::array();
    for (const parsers::ToolCall& c : p.calls) calls.push_back(tool_call_json(c));
    msg["tool_calls"] = std::move(calls);
  }
  *finish = parsed_finish_reason(out.finish, !p.calls.empty());
  return msg;
}

}  // namespace

json response_json(const ApiRequest& req, const ResponseMeta& meta, const std::vector<Output>& outs,
                   const text::Tokenizer& tok, parsers::IdSource ids) {
  json choices = json::array();
  int64_t completion = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Output& out = outs[i];
    completion += out.completion_tokens;
    if (req.api == Api::chat) {
      const char* finish = nullptr;
      json message = chat_message(req, out, ids, &finish);
      choices.push_back({{"index", i},
                         {"message", std::move(message)},
                         {"logprobs", req.logprobs ? chat_logprobs(out.tokens, tok) : json()},
                         {"finish_reason", finish}});
    } else {
      int64_t offset = char_count(req.echo_text);
      choices.push_back({{"index", i},
                         {"text", req.echo_text + out.text},
                         {"logprobs", req.logprobs ? completion_logprobs(out.tokens, tok, &offset) : json()},
                         {"finish_reason", finish_reason(out.finish)}});
    }
  }
  // The prompt counts once, however many choices share it (OpenAI's usage); its cached
  // tokens are those of the first choice (the others read its blocks: serve/choices.h).
  return {{"id", meta.id},
          {"object", req.api == Api::chat ? "chat.completion" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", std::move(choices)},
          {"usage", usage_json(req.prompt_tokens, completion, outs.empty() ? 0 : outs[0].cached_tokens)}};
}

json response_json(const ApiRequest& req, const ResponseMeta& meta, const Output& out, const text::Tokenizer& tok,
                   parsers::IdSource ids) {
  return response_json(req, meta, std::vector<Output>{out}, tok, std::move(ids));
}

ChunkWriter::ChunkWriter(const ApiRequest& req, ResponseMeta meta, const text::Tokenizer& tok, parsers::IdSource ids)
    : req_(req), meta_(std::move(meta)), tok_(tok), choices_(size_t(std::max(1, req.n))) {
  if (req.api == Api::chat && req.parse.active())
    for (Choice& c : choices_) c.parser = std::make_unique<parsers::OutputParser>(req.parse, ids);
}

ChunkWriter::~ChunkWriter() = default;

std::string ChunkWriter::event_chunks(int index, const parsers::Events& events, json logprobs) {
  std::string out;
  auto put = [&](json delta) {
    out += sse_event(chunk(
        {{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}}));
    logprobs = nullptr;  // only the first chunk of a piece carries them
  };
  Choice& c = choices_[size_t(index)];
  for (const parsers::Event& e : events) {
    switch (e.kind) {
      case parsers::Event::Kind::reasoning: put({{"reasoning_content", e.text}}); break;
      case parsers::Event::Kind::content: put({{"content", e.text}}); break;
      case parsers::Event::Kind::tool_call: {
        const int call = c.calls_sent++;
        put({{"tool_calls", json::array({{{"index", call},
                                          {"id", e.call.id},
                                          {"type", "function"},
                                          {"function", {{"name", e.call.name}, {"arguments", ""}}}}})}});
        put({{"tool_calls", json::array({{{"index", call}, {"function", {{"arguments", e.call.arguments}}}}})}});
        break;
      }
    }
  }
  return out;
}

json ChunkWriter::chunk(json choice) const {
  json c = {{"id", meta_.id},
            {"object", req_.api == Api::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", json::array({std::move(choice)})}};
  // OpenAI: with include_usage every chunk has "usage": null but the last.
  if (req_.include_usage) c["usage"] = nullptr;
  return c;
}

std::string ChunkWriter::start() {
  std::string out;
  for (int i = 0; i < int(choices_.size()); ++i) {
    if (req_.api == Api::chat) {
      out += sse_event(chunk({{"index", i},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}}));
    } else if (!req_.echo_text.empty()) {
      choices_[size_t(i)].text_offset = char_count(req_.echo_text);
      out += sse_event(
          chunk({{"index", i}, {"text", req_.echo_text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    }
  }
  return out;
}

std::string ChunkWriter::delta(const Delta& d, int index) {
  Choice& c = choices_[size_t(index)];
  if (c.parser) {
    json lp = req_.logprobs && !d.tokens.empty() ? chat_logprobs(d.tokens, tok_) : json();
    const parsers::Events events = c.parser->push(d.text);
    // Text the parser holds back still sends its tokens' logprobs, as below.
    if (events.empty()) return lp.is_null() ? "" : event_chunks(index, {parsers::Event{}}, std::move(lp));
    return event_chunks(index, events, std::move(lp));
  }
  // Tokens whose text is still held back (a possible stop string) are sent with their
  // logprobs and empty text; without logprobs there is nothing to send yet.
  if (d.text.empty() && (d.tokens.empty() || !req_.logprobs)) return "";
  if (req_.api == Api::chat)
    return sse_event(chunk({{"index", index},
                            {"delta", {{"content", d.text}}},
                            {"logprobs", req_.logprobs ? chat_logprobs(d.tokens, tok_) : json()},
                            {"finish_reason", nullptr}}));
  json lp = req_.logprobs ? completion_logprobs(d.tokens, tok_, &c.text_offset) : json();
  return sse_event(chunk({{"index", index}, {"text", d.text}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}}));
}

std::string ChunkWriter::finish(Finish f, int index) {
  Choice& c = choices_[size_t(index)];
  std::string out;
  const char* reason = finish_reason(f);
  if (c.parser) {
    // What the parser held back (a cut tag, trailing whitespace, an open block) ends here.
    out = event_chunks(index, c.parser->finish(), json());
    reason = parsed_finish_reason(f, c.parser->tool_calls() > 0);
  }
  if (req_.api == Api::chat)
    return out + sse_event(chunk(
                     {{"index", index}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", reason}}));
  return sse_event(chunk({{"index", index}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish_reason(f)}}));
}

std::string ChunkWriter::done(int64_t completion_tokens, int64_t cached_tokens) {
  std::string out;
  if (req_.include_usage) {
    json u = chunk(json());
    u["choices"] = json::array();
    u["usage"] = usage_json(req_.prompt_tokens, completion_tokens, cached_tokens);
    out += sse_event(u);
  }
  return out + "data: [DONE]\n\n";
}

std::string ChunkWriter::end(Finish f, int64_t completion_tokens, int64_t cached_tokens) {
  return finish(f, 0) + done(completion_tokens, cached_tokens);
}

std::string ChunkWriter::error(const ServeError& e) { return sse_event(error_json(e)) + "data: [DONE]\n\n"; }

}  // namespace moe::serve
