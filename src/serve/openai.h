// The OpenAI protocol: request bodies of POST /v1/chat/completions and /v1/completions
// checked and turned into RequestParams, and the response bodies (whole, or the SSE
// chunks of a stream) built from what the engine returned. No HTTP here.
//
// Prompts: a chat's messages are rendered with the model's chat template and tokenized
// with parse_special=true and add_special_tokens=false (the template writes BOS itself),
// as transformers' apply_chat_template(tokenize=True) and vLLM do; a completion's string
// prompt is tokenized with add_special_tokens=true and parse_special=true (vLLM). So the
// string of a special token inside user text (e.g. "<|im_end|>") becomes that control
// token, exactly as in vLLM and transformers: a client can write any prompt it likes
// through /v1/completions anyway, and the model's answer is all it gets back. A deployment
// that renders chats for untrusted third parties on a trusted system prompt should keep
// that in mind.
//
// n (1..8) choices per request: the engine runs n requests with the same prompt
// (serve/choices.h); with a seed, choice i samples with seed + i (as vLLM's child
// requests), so greedy choices are all the same. best_of may only repeat n.
//
// Deliberate limits, each answered with 400 naming the field: best_of other than n,
// batched prompts (a list of several strings or lists), non-text
// content parts (images, audio), logit_bias, response_format types other than text,
// json_object and json_schema, suffix, echo together with logprobs (the engine does not
// compute prompt logprobs), more than grammar::kMaxTools tools, schemas over
// grammar::kMaxSchemaBytes. tools, documents and chat_template_kwargs go to the
// template; tool_choice "none" leaves the tools out. Unknown fields are ignored, as
// OpenAI-compatible servers do.
//
// Chat replies are taken apart by the server's parsers (serve/parsers/, chosen by
// --reasoning-parser and --tool-call-parser): the thinking becomes
// message.reasoning_content (delta.reasoning_content when streamed), tool-call markup
// becomes message.tool_calls with finish_reason "tool_calls", the rest is content.
// Tool calls are parsed when the request has tools and tool_choice is not "none".
//
// Structured outputs (serve/grammar/): response_format json_object / json_schema (on
// chat and completions), and tool_choice "required" or a named function ({"type":
// "function", "function": {"name": N}}) compile to a grammar the sampler enforces token
// by token: the reply parses (and validates against the schema; a forced tool call is a
// call of a listed tool, in the server's tool-call format, with arguments that validate
// against its parameters). A chat's reasoning block stays free text; the grammar starts
// after it. Both response_format and a forced tool_choice: 400. A schema the grammar
// engine cannot compile: 400 with its reason. strict is accepted and every schema is
// enforced as if strict.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/engine.h"
#include "serve/parsers/detect.h"
#include "serve/parsers/output_parser.h"

namespace moe::serve {

namespace grammar {
class Compiler;
}

// Requests and responses keep their keys in order: a tool schema reaches the chat
// template as the client wrote it (templates print it with tojson, as Python dicts
// keep insertion order), and responses read in OpenAI's field order.
using Json = nlohmann::ordered_json;

enum class Api { chat, completions };

// Values for the sampling fields a request leaves out. OpenAI's defaults; the serve verb
// may fill them from the model's generation_config.json as vLLM does.
struct SamplingDefaults {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;  // 0: off
};

// What checking a request needs of the served model.
struct ModelContext {
  std::string name;  // the served model name: a request's "model" must equal it (or be absent)
  int64_t max_model_len = 0;
  const text::Tokenizer* tokenizer = nullptr;
  const text::ChatTemplate* chat_template = nullptr;  // nullptr: chat requests get 400
  SamplingDefaults defaults;
  parsers::ParserChoice parsers;  // the server's reasoning and tool-call parsers (none by default)
  // Compiles response_format / forced tool_choice grammars; null: such requests get 400.
  const grammar::Compiler* grammar = nullptr;
};

// A checked request: what the engine runs, plus what the response needs.
// The most choices (n) one request may ask for (vLLM's parallel sampling has no fixed
// limit; 8 keeps one client from filling the batch alone).
inline constexpr int kMaxChoices = 8;

struct ApiRequest {
  Api api = Api::chat;
  int n = 1;                   // choices, 1..kMaxChoices
  RequestParams params;
  int64_t prompt_tokens = 0;   // params.prompt_ids.size() (params moves into the engine)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool logprobs = false;       // the response carries logprobs (params.top_logprobs >= 0)
  std::string echo_text;       // completions with echo: the prompt, returned before the text
  bool echo = false;
  parsers::ParseOptions parse;  // chat: how the reply is taken apart (inactive: all of it is content)
};

// Throws ServeError: 400 naming the field (`param`) and what was expected, 404 for a
// model that is not served. Tokenizer or template failures are 400 too: they come from
// the request's content.
ApiRequest parse_request(Api api, std::string_view body, const ModelContext& m);

// vLLM's POST /tokenize ({"prompt"} or {"messages"}: {"count", "max_model_len",
// "tokens", "token_strs": null}) and POST /detokenize ({"tokens"}: {"prompt"}). Throw
// ServeError (400 / 404) like parse_request.
Json tokenize_response(std::string_view body, const ModelContext& m);
Json detokenize_response(std::string_view body, const ModelContext& m);

// The deepest JSON nesting a body may have. Deeper bodies would make the recursive JSON
// copies and the template's walks run out of stack; no real request comes near it.
inline constexpr int kMaxJsonDepth = 64;

// "chatcmpl-<32 hex>" / "cmpl-<32 hex>".
std::string new_response_id(Api api);

struct ResponseMeta {
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// A finished request's output.
struct Output {
  std::string text;
  std::vector<TokenLogprob> tokens;
  Finish finish = Finish::none;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the prefix cache served
};

// chat.completion / text_completion with one choice per Output (index = its place),
// usage over all of them. ids: where tool-call ids come from (default: random; tests
// pass a fixed sequence).
Json response_json(const ApiRequest& req, const ResponseMeta& meta, const std::vector<Output>& outs,
                   const text::Tokenizer& tok, parsers::IdSource ids = {});
Json response_json(const ApiRequest& req, const ResponseMeta& meta, const Output& out, const text::Tokenizer& tok,
                   parsers::IdSource ids = {});

// The SSE events of one streamed response, in order: start(), delta() per piece of a
// choice's output, finish() once per choice, then done() (end() = finish + done for a
// single choice; error() when the engine failed). Each returns whole "data: ...\n\n"
// events (possibly none: an empty string). With parsers active, a piece becomes chunks
// of delta.reasoning_content, delta.content and, per tool call, one chunk with its
// index, id, type, name and empty arguments, then one appending the arguments (the
// shape OpenAI streams and its client reassembles). Chunks of different choices carry
// their index and may interleave, as OpenAI's do with n > 1.
class ChunkWriter {
 public:
  ChunkWriter(const ApiRequest& req, ResponseMeta meta, const text::Tokenizer& tok, parsers::IdSource ids = {});
  ~ChunkWriter();
  // chat: the delta {"role":"assistant"} chunk of each choice; completions: the echo, if any
  std::string start();
  std::string delta(const Delta& d, int choice = 0);
  std::string finish(Finish f, int choice = 0);  // the choice's finish_reason chunk
  // The usage chunk (stream_options.include_usage), [DONE].
  std::string done(int64_t completion_tokens, int64_t cached_tokens = 0);
  std::string end(Finish f, int64_t completion_tokens, int64_t cached_tokens = 0);
  std::string error(const ServeError& e);  // an error event, then [DONE]

 private:
  struct Choice {
    std::unique_ptr<parsers::OutputParser> parser;  // chat with parsers active, else null
    int calls_sent = 0;                             // tool calls streamed so far (their index)
    int64_t text_offset = 0;                        // completions logprobs: characters of text sent so far
  };
  Json chunk(Json choice) const;
  // Chunks for parsed events of a choice; the first carries `logprobs` (null when not asked for).
  std::string event_chunks(int choice, const parsers::Events& events, Json logprobs);
  const ApiRequest& req_;
  ResponseMeta meta_;
  const text::Tokenizer& tok_;
  std::vector<Choice> choices_;  // [req.n]
};

// {"error": {"message", "type", "param", "code"}}: empty param/code become null.
Json error_json(const ServeError& e);
// JSON text that never throws: invalid UTF-8 (a token cut in a character) becomes U+FFFD.
std::string dump_json(const Json& j);
// One SSE event.
std::string sse_event(const Json& j);

}  // namespace moe::serve
