// Text verbs: `tokenize` (text or a rendered chat -> ids, or the rendered prompt),
// `detokenize` (ids -> text). They read only the tokenizer files of --model
// (tokenizer.json or tokenizer.model, tokenizer_config.json, chat_template.jinja):
// no config.json, no weights.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/text_opts.h"
#include "cli/verbs.h"
#include "core/check.h"
#include "runtime/runner.h"

namespace moe {

namespace {

struct TokenizeOpts {
  std::string model_dir, text, file, chat_file;
  bool json = false, no_special = false, no_add_special = false, add_generation_prompt = false, render_only = false;
  ChatFlags chat;
};

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "--file: cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_tokenize(const TokenizeOpts& o) {
  const int sources = !o.text.empty() + !o.file.empty() + !o.chat_file.empty();
  MOE_CHECK(sources == 1, "give exactly one of --text, --file or --chat-file (got {})", sources);
  MOE_CHECK(!o.render_only || !o.chat_file.empty(), "--render-only needs --chat-file");
  TextModel tm = load_text_model(o.model_dir, o.chat);
  std::vector<int32_t> ids;
  if (!o.chat_file.empty()) {
    const std::string rendered =
        render_chat(tm, o.chat, read_json_file(o.chat_file, "--chat-file"), o.add_generation_prompt);
    if (o.render_only) {
      std::fwrite(rendered.data(), 1, rendered.size(), stdout);  // byte for byte, nothing else
      return 0;
    }
    ids = encode_rendered_chat(*tm.tok, rendered);
  } else {
    text::EncodeOptions eo;
    eo.parse_special = !o.no_special;
    eo.add_special_tokens = !o.no_add_special;
    ids = tm.tok->encode(o.text.empty() ? read_file_bytes(o.file) : o.text, eo);
  }
  if (o.json) {
    nlohmann::json j;
    j["ids"] = ids;
    std::vector<std::string> toks;
    for (int32_t id : ids) toks.push_back(tm.tok->id_to_token(id));
    j["tokens"] = toks;
    // error_handler replace: a byte-level token string is valid UTF-8, but a SentencePiece
    // piece need not be.
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("{}\n", fmt::join(ids, ","));
  }
  return 0;
}

struct DetokenizeOpts {
  std::string model_dir, ids;
  bool skip_special = false;
};

int run_detokenize(const DetokenizeOpts& o) {
  const auto tok = load_tokenizer(o.model_dir);
  const std::vector<std::vector<int32_t>> lists = parse_prompt_ids(o.ids);
  MOE_CHECK(lists.size() == 1, "--ids takes one list of ids separated by ',' (no ';')");
  for (int32_t id : lists[0])
    MOE_CHECK(id >= 0 && id < tok->vocab_size(), "--ids: id {} is out of range: the tokenizer has ids 0..{}", id,
              tok->vocab_size() - 1);
  text::DecodeOptions d;
  d.skip_special_tokens = o.skip_special;
  const std::string s = tok->decode(lists[0], d);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace

std::vector<Verb> add_text_verbs(CLI::App& app) {
  std::vector<Verb> verbs;
  {
    auto o = std::make_shared<TokenizeOpts>();
    CLI::App* t = app.add_subcommand(
        "tokenize",
        "Text to token ids with the model's tokenizer (tokenizer.json, or tokenizer.model), as Hugging Face "
        "tokenizers / transformers compute them; or a chat rendered with the model's chat template");
    t->add_option("--model", o->model_dir, "Model directory holding the tokenizer files, or a GGUF file (its tokenizer.ggml.* metadata)")
        ->required()
        ->check(CLI::ExistingPath);
    t->add_option("--text", o->text, "Text to tokenize (UTF-8; invalid UTF-8 is an error naming the byte offset)");
    t->add_option("--file", o->file, "Tokenize the bytes of this file")->check(CLI::ExistingFile);
    t->add_option("--chat-file", o->chat_file,
                  "JSON list of OpenAI-style messages ({\"role\", \"content\", ...}): render it with the chat "
                  "template and tokenize the result (special tokens the template writes are control tokens, nothing "
                  "is added: apply_chat_template(tokenize=True))")
        ->check(CLI::ExistingFile);
    t->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "With --chat-file: end with the template's assistant header (add_generation_prompt=True)");
    t->add_flag("--render-only", o->render_only,
                "With --chat-file: print exactly the rendered prompt text, byte for byte, and nothing else");
    t->add_flag("--json", o->json, "Print {\"ids\": [...], \"tokens\": [...]} instead of comma-separated ids");
    t->add_flag("--no-special", o->no_special,
                "Read special-token strings in the text (e.g. <|im_start|>) as plain text, not as control tokens. "
                "Default: they are control tokens, as tokenizer(text) does; use this for text from someone else, so "
                "it cannot inject control tokens");
    t->add_flag("--no-add-special", o->no_add_special,
                "Do not add the BOS/EOS the tokenizer's post-processor adds (add_special_tokens=False)");
    add_chat_flags(t, o->chat);
    verbs.push_back({t, [o] { return run_tokenize(*o); }});
  }
  {
    auto o = std::make_shared<DetokenizeOpts>();
    CLI::App* d = app.add_subcommand("detokenize", "Token ids to text with the model's tokenizer");
    d->add_option("--model", o->model_dir, "Model directory holding the tokenizer files, or a GGUF file (its tokenizer.ggml.* metadata)")
        ->required()
        ->check(CLI::ExistingPath);
    d->add_option("--ids", o->ids, "Token ids separated by ',' (e.g. 9707,11,1879)")->required();
    d->add_flag("--skip-special", o->skip_special, "Leave out special tokens (skip_special_tokens=True)");
    verbs.push_back({d, [o] { return run_detokenize(*o); }});
  }
  return verbs;
}

}  // namespace moe
