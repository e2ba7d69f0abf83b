// Whole-model verbs: `forward` (prefill logits of a batch of prompts) and `generate`
// (prefill + decode with greedy or sampled tokens). Both run on one rank or under
// mpirun with the parallel flags (cli/parallel_opts.h; layouts in model/model.h).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include "core/atomic_file.h"
#include "cli/model_opts.h"
#include "cli/parallel_opts.h"
#include "cli/text_opts.h"
#include "cli/verbs.h"
#include "comm/consistency.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/threads.h"
#include "loader/safetensors.h"
#include "model/model.h"
#include "moe/placement_file.h"
#include "runtime/generate.h"
#include "runtime/runner.h"
#include "text/text_stream.h"

namespace moe {

namespace {

// "1.00-1.35 (mean 1.12)": the max/mean expert load of each MoE layer, summarised.
std::string load_spread(const std::vector<std::vector<int64_t>>& load, std::vector<double>* per_layer) {
  double lo = 1e30, hi = 0, sum = 0;
  int n = 0;
  for (const auto& row : load) {
    if (row.empty()) continue;
    int64_t mx = 0, tot = 0;
    for (int64_t x : row) {
      mx = std::max(mx, x);
      tot += x;
    }
    const double spread = tot > 0 ? static_cast<double>(mx) * row.size() / tot : 0.0;
    per_layer->push_back(spread);
    lo = std::min(lo, spread);
    hi = std::max(hi, spread);
    sum += spread;
    ++n;
  }
  if (n == 0) return "no MoE layers";
  return fmt::format("max/mean {:.2f}-{:.2f} over {} MoE layers (mean {:.2f})", lo, hi, n, sum / n);
}

int run_forward(const CommonOpts& o, const std::string& out_path, bool quiet) {
  Loaded L = load(o, 0, false, "forward " + out_path, {}, [&](ModelOptions& mo) { mo.show_progress = !quiet; });
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor logits = prefill_logits(*L.model, L.prompts);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (L.world->rank() == 0) {
    Tensor lengths = Tensor::empty({static_cast<int64_t>(L.prompts.size())}, DType::I64);
    for (size_t i = 0; i < L.prompts.size(); ++i) lengths.data<int64_t>()[i] = static_cast<int64_t>(L.prompts[i].size());
    write_safetensors(out_path, {{"logits", logits}, {"lengths", lengths}}, {{"producer", "moe-ep forward"}});
    if (!quiet)
      fmt::print("moe-ep forward: {} ({}), {} prompts, dtype {}, {} rank(s) ({}): loaded in {:.3f} s, ran in {:.3f} ms; "
                 "wrote {} logits {}\n",
                 L.model->config().model_type, L.model->config().summary(), L.prompts.size(), weights_desc(o),
                 L.world->size(), to_string(o.parallel.par), L.load_s, run_s * 1e3, out_path,
                 shape_str(logits.shape()));
  }
  return 0;
}

struct GenOpts {
  int64_t max_new_tokens = 16;
  int64_t prefill_chunk = kDefaultPrefillChunk;
  double temperature = 0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false, quiet = false, no_special = false, show_special = false;
  bool warmup = false;  // --warmup: one untimed generation first (as llama-bench's warmup run)
  bool profile = false;  // --profile: time per stage of the steps (core/stage_profile.h)
  std::string output_json;
  std::string expert_load_out;  // --expert-load-out: moe/placement_file.h's load file
  // Text prompts (any of them needs the tokenizer of --model).
  std::vector<std::string> prompts, chats, stops;
  std::string chat_file;
  ChatFlags chat;
  bool text_mode() const { return !prompts.empty() || !chats.empty() || !chat_file.empty(); }
};

// --profile: the stages' seconds plus "other" (the span's wall time they leave) and "total".
nlohmann::json profile_json(const prof::Totals& t, double total_s) {
  nlohmann::json j = nlohmann::json::object();
  double sum = 0;
  for (int i = 0; i < prof::kStages; ++i) {
    j[std::string(prof::kStageNames[i])] = t.s[i];
    sum += t.s[i];
  }
  j["other"] = std::max(0.0, total_s - sum);
  j["total"] = total_s;
  return j;
}

// One line per span on stderr: ms per step (per = steps, or 1 for the whole prefill) and
// the share of the span, largest first; stages that took no time are left out.
void print_profile(const char* what, const prof::Totals& t, double total_s, int64_t tokens, int64_t per) {
  if (total_s <= 0 || per <= 0) return;
  const nlohmann::json j = profile_json(t, total_s);
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [k, v] : j.items())
    if (k != "total" && v.get<double>() > 0) rows.emplace_back(v.get<double>(), k);
  std::sort(rows.begin(), rows.end(), std::greater<>());
  std::string line;
  for (const auto& [v, k] : rows) line += fmt::format(", {} {:.3f} ({:.1f} %)", k, 1e3 * v / per, 100 * v / total_s);
  fmt::print(stderr, "moe-ep generate: profile of the {} ({} tokens{}), ms{}: total {:.3f}{}\n", what, tokens,
             per > 1 ? fmt::format(", {} steps", per) : "", per > 1 ? " per step" : "", 1e3 * total_s / per, line);
}

// The batch of a text-mode `generate`: --prompt texts, then --chat messages, then the
// --chat-file conversation, in that order.
std::vector<std::vector<int32_t>> text_prompts(const GenOpts& g, const TextModel& tm) {
  std::vector<std::vector<int32_t>> out;
  text::EncodeOptions eo;
  eo.parse_special = !g.no_special;
  for (const auto& p : g.prompts) out.push_back(tm.tok->encode(p, eo));
  for (const auto& c : g.chats) {
    const nlohmann::ordered_json msgs = nlohmann::ordered_json::array({{{"role", "user"}, {"content", c}}});
    out.push_back(encode_rendered_chat(*tm.tok, render_chat(tm, g.chat, msgs, true)));
  }
  if (!g.chat_file.empty())
    out.push_back(encode_rendered_chat(*tm.tok, render_chat(tm, g.chat, read_json_file(g.chat_file, "--chat-file"), true)));
  for (size_t i = 0; i < out.size(); ++i)
    MOE_CHECK(!out[i].empty(), "prompt {} has no tokens after tokenization", i);
  return out;
}

int run_generate(const CommonOpts& o, const GenOpts& g) {
  GenerateOptions go;
  go.max_new_tokens = g.max_new_tokens;
  go.sampling.temperature = g.temperature;
  go.sampling.top_k = g.top_k;
  go.sampling.top_p = g.top_p;
  go.sampling.seed = g.seed;
  go.ignore_eos = g.ignore_eos;
  go.prefill_chunk = g.prefill_chunk;
  MOE_CHECK(g.prefill_chunk >= 0, "--prefill-chunk must be 0 (whole prompts) or a positive token count, got {}",
            g.prefill_chunk);
  MOE_CHECK(g.max_new_tokens >= 1, "--max-new-tokens must be at least 1, got {}", g.max_new_tokens);
  MOE_CHECK(g.top_p > 0 && g.top_p <= 1, "--top-p must be in (0, 1], got {}", g.top_p);
  MOE_CHECK(g.text_mode() != !o.prompt_ids.empty(),
            "give the prompts either as ids (--prompt-ids) or as text (--prompt, --chat, --chat-file), one of the two");
  MOE_CHECK(g.text_mode() || g.stops.empty(), "--stop needs text prompts (--prompt, --chat or --chat-file)");
  TextModel tm;
  std::vector<std::vector<int32_t>> prompts;
  if (g.text_mode()) {
    tm = load_text_model(o.model_dir, g.chat);
    prompts = text_prompts(g, tm);
    go.extra_eos = tokenizer_stop_ids(*tm.tok);
    go.sample_vocab = tm.tok->vocab_size();
  }
  Loaded L = load(o, g.max_new_tokens, true,
                  fmt::format("generate {} {} {} {} {} {} {} {}", g.max_new_tokens, g.temperature, g.top_k, g.top_p,
                              g.seed, g.ignore_eos, g.warmup, fmt::join(g.stops, "\x1f")),
                  std::move(prompts), [&](ModelOptions& mo) { mo.show_progress = !g.quiet; });
  // Text: each request's TextStream decides its stop strings; rank 0 prints its
  // replica's text as it comes (a single prompt streams; several print labelled when done).
  text::DecodeOptions dopt;
  dopt.skip_special_tokens = !g.show_special;
  std::vector<std::unique_ptr<text::TextStream>> streams;
  const bool printing = !g.quiet && L.world->rank() == 0;
  const bool single = L.prompts.size() == 1;
  if (g.text_mode()) {
    for (size_t i = 0; i < L.prompts.size(); ++i)
      streams.push_back(std::make_unique<text::TextStream>(*tm.tok, g.stops, dopt));
    go.on_token = [&](int64_t req, int32_t tok) {
      const text::TextStream::Piece piece = streams[req]->push(tok);
      if (printing && single) {
        std::fwrite(piece.text.data(), 1, piece.text.size(), stdout);
        std::fflush(stdout);
      }
      return piece.stopped;
    };
  }
  prof::set_enabled(g.profile);
  if (g.warmup) {
    // The same generation once, untimed and unprinted: fresh buffers are faulted in and
    // caches warm, as llama-bench's warmup run does before it times. The timed run below
    // starts again from position 0 of the same KV slots.
    GenerateOptions warm = go;
    warm.on_token = nullptr;
    generate(*L.model, L.prompts, warm);
  }
  const GenerateResult r = generate(*L.model, L.prompts, go);
  if (L.world->rank() != 0) return 0;
  // The text of every request, replayed from its ids on rank 0 (the requests of other DP
  // replicas were streamed on their own ranks): the same TextStream, so the same cut.
  std::vector<std::string> texts;
  if (g.text_mode()) {
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      text::TextStream replay(*tm.tok, g.stops, dopt);
      for (int32_t t : r.tokens[i]) {
        const bool eos = !g.ignore_eos && (std::find(go.extra_eos.begin(), go.extra_eos.end(), t) != go.extra_eos.end() ||
                                           std::find(L.model->config().eos_token_ids.begin(),
                                                     L.model->config().eos_token_ids.end(), t) !=
                                               L.model->config().eos_token_ids.end());
        if (eos || replay.push(t).stopped) break;
      }
      replay.finish();
      texts.push_back(replay.text());
    }
    if (printing && single) {
      // What the live stream held back at the end (text after the last id).
      const std::string tail = texts[0].substr(std::min(texts[0].size(), streams[0]->text().size()));
      std::fwrite(tail.data(), 1, tail.size(), stdout);
      std::fputc('\n', stdout);
    } else if (printing) {
      for (size_t i = 0; i < texts.size(); ++i) fmt::print("=== prompt {} ===\n{}\n", i, texts[i]);
    }
  }
  std::vector<double> spread;
  const std::string spread_s = load_spread(r.expert_load, &spread);
  const double pre_tps = r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0;
  const double dec_tps = r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0;
  if (!g.quiet) {
    if (!g.text_mode())
      for (size_t i = 0; i < r.tokens.size(); ++i) fmt::print("prompt {}: {}\n", i, fmt::join(r.tokens[i], ","));
    fmt::print(g.text_mode() ? stderr : stdout,
        "moe-ep generate: {} dtype {}, {} rank(s) ({}), {} prompts: prefill {} tokens in {:.2f} ms ({:.1f} tokens/s), "
        "decode {} tokens in {} steps, {:.2f} ms ({:.1f} tokens/s); expert load {}; loaded in {:.3f} s; threads {}\n",
        L.model->config().model_type, weights_desc(o), L.world->size(), to_string(o.parallel.par), L.prompts.size(),
        r.prefill_tokens, r.prefill_s * 1e3, pre_tps, r.decode_tokens, r.decode_steps, r.decode_s * 1e3, dec_tps,
        spread_s, L.load_s, num_threads());
  }
  if (g.profile) {  // asked for: printed under --quiet too
    print_profile("prefill", r.prefill_stages, r.prefill_s, r.prefill_tokens, 1);
    print_profile("decode", r.decode_stages, r.decode_s, r.decode_tokens, r.decode_steps);
  }
  if (!g.output_json.empty()) {
    nlohmann::json j;
    j["model_type"] = L.model->config().model_type;
    j["dtype"] = o.dtype;
    j["quantize"] = o.quantize;
    j["quantize_linears"] = o.quantize_linears;
    j["kv_cache"] = {{"dtype", o.kv_cache_dtype}, {"bytes", L.model->cache().shape().bytes()}};
    j["ranks"] = L.world->size();
    j["parallel"] = to_string(o.parallel.par);
    j["prompts"] = L.prompts;
    j["generated"] = r.tokens;
    if (g.text_mode()) j["text"] = texts;
    j["timings"] = {{"load_s", L.load_s},
                    {"prefill_s", r.prefill_s},
                    {"prefill_tokens", r.prefill_tokens},
                    {"prefill_tokens_per_s", pre_tps},
                    {"decode_s", r.decode_s},
                    {"decode_tokens", r.decode_tokens},
                    {"decode_steps", r.decode_steps},
                    {"decode_tokens_per_s", dec_tps}};
    if (g.profile) {
      j["profile_s"] = {{"prefill", profile_json(r.prefill_stages, r.prefill_s)},
                        {"decode", profile_json(r.decode_stages, r.decode_s)}};
      auto calls = [](const prof::Totals& t) {
        nlohmann::json c = nlohmann::json::object();
        for (int i = 0; i < prof::kStages; ++i) c[std::string(prof::kStageNames[i])] = t.calls[i];
        return c;
      };
      j["profile_calls"] = {{"prefill", calls(r.prefill_stages)}, {"decode", calls(r.decode_stages)}};
    }
    j["expert_load"] = r.expert_load;
    j["expert_load_max_over_mean"] = spread;
    if (r.eplb)
      j["eplb"] = {{"rebalances", r.eplb->rebalances},
                   {"slots_moved", r.eplb->slots_moved},
                   {"bytes_moved", r.eplb->bytes_moved},
                   {"rank0_stall_s", r.eplb->stall_s},
                   {"rank0_max_stall_s", r.eplb->max_stall_s},
                   {"imbalance_before", r.eplb->imbalance_before},
                   {"imbalance_after", r.eplb->imbalance_after}};
    write_file_atomic(g.output_json, j.dump(1) + "\n", "--output-json");
  }
  if (!g.expert_load_out.empty()) {
    // The whole run's load (every replica once): the input of `moe-ep eplb`.
    ExpertLoadFile f;
    f.n_experts = L.model->config().moe.n_experts;
    f.window = f.steps = r.steps;
    for (size_t l = 0; l < r.expert_load.size(); ++l) {
      if (r.expert_load[l].empty()) continue;
      f.layers.push_back(static_cast<int64_t>(l));
      f.load.emplace_back(r.expert_load[l].begin(), r.expert_load[l].end());
    }
    write_file_atomic(g.expert_load_out, to_json(f).dump(1) + "\n", "--expert-load-out");
  }
  return 0;
}

}  // namespace

Verb add_bench_model_verb(CLI::App& app);  // cli/bench_model.cpp

std::vector<Verb> add_model_verbs(CLI::App& app) {
  std::vector<Verb> verbs;
  {
    auto o = std::make_shared<CommonOpts>();
    auto out = std::make_shared<std::string>();
    auto quiet = std::make_shared<bool>(false);
    // forward writes logits to check against references: f32 weights and KV cache
    // unless asked (--dtype auto, --kv-cache-dtype bf16).
    o->dtype = "f32";
    o->kv_cache_dtype = "f32";
    CLI::App* f = app.add_subcommand(
        "forward",
        "Run a batch of prompts through a whole model once (prefill) and write the logits of every position: "
        "'logits' [B, S_max, V] f32 (rows past a prompt's length are zero) and 'lengths' [B] i64");
    add_common(f, *o);
    f->get_option("--prompt-ids")->required();
    f->add_option("--logits", *out, "safetensors file to write (rank 0 writes it)")->required();
    f->add_flag("--quiet", *quiet, "Print nothing on success");
    verbs.push_back({f, [o, out, quiet] {
      resolve_auto_dtype(*o);
      return run_forward(*o, *out, *quiet);
    }});
  }
  {
    auto o = std::make_shared<CommonOpts>();
    auto g = std::make_shared<GenOpts>();
    CLI::App* gc = app.add_subcommand(
        "generate",
        "Generate tokens for a batch of prompts: prefill, then decode with the KV cache until EOS or "
        "--max-new-tokens; prints the new ids of each prompt and a summary (prefill and decode tokens/s, expert "
        "load spread)");
    add_common(gc, *o);
    gc->add_option("--prefill-chunk", g->prefill_chunk,
                   "Most prompt tokens per forward step: a longer prompt is prefilled in chunks, so the activations "
                   "held are those of the chunk, not of the whole prompt; the same tokens and logits either way. 0: "
                   "every prompt in one step")
        ->capture_default_str();
    gc->add_option("--max-new-tokens", g->max_new_tokens, "Tokens to generate per prompt (fewer on EOS)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    gc->add_option("--temperature", g->temperature, "Sampling temperature; 0 = greedy (argmax)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    gc->add_option("--top-k", g->top_k, "Sample among the k most likely tokens (0: all)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    gc->add_option("--top-p", g->top_p, "Nucleus sampling: the smallest set of tokens with this much probability")
        ->capture_default_str();
    gc->add_option("--seed", g->seed,
                   "Sampling seed; the draw of request i at step s depends only on (seed, i, s), so the same seed "
                   "gives the same tokens on any parallel layout")
        ->capture_default_str();
    gc->add_flag("--warmup", g->warmup,
                 "Run the whole generation once, untimed and unprinted, before the one that is timed and printed "
                 "(as llama-bench's warmup run): the timings then leave out first-touch page faults of fresh "
                 "buffers and cold caches");
    gc->add_flag("--profile", g->profile,
                 "Time each stage of the steps (embedding, q/k/v projections, attention over the cache, o_proj, "
                 "routing, expert row gathering, the experts' two GEMMs and the quantisation between them, "
                 "combine, shared experts, lm_head, sampling; the rest as 'other') and print each one's time and "
                 "share, for the prefill and per decode step, on stderr (and under 'profile_s', with each stage's "
                 "number of calls under 'profile_calls', in --output-json). "
                 "Wall time on rank 0: a stage that does not get faster with --threads shows here");
    gc->add_flag("--ignore-eos", g->ignore_eos,
                 "Keep generating after an EOS token (eos_token_id of the config, and with text prompts the "
                 "tokenizer's eos token, e.g. the end-of-turn token of chat models)");
    gc->add_option("--prompt", g->prompts,
                   "A text prompt, tokenized with the model's tokenizer (with its BOS, as tokenizer(text) does); "
                   "repeat for a batch. The generated text streams to stdout (one prompt), or is printed labelled "
                   "per prompt (several)");
    gc->add_option("--chat", g->chats,
                   "A user message, rendered with the model's chat template (add_generation_prompt); repeat for a "
                   "batch of one-message chats");
    gc->add_option("--chat-file", g->chat_file, "A JSON list of OpenAI-style messages: one conversation to continue")
        ->check(CLI::ExistingFile);
    gc->add_option("--stop", g->stops,
                   "Stop a prompt's generation before this text (repeatable; the stop text is not printed)");
    gc->add_flag("--no-special", g->no_special,
                 "Read special-token strings in --prompt text as plain text, not as control tokens");
    gc->add_flag("--show-special", g->show_special, "Print special tokens in the generated text (default: skipped)");
    add_chat_flags(gc, g->chat);
    gc->add_option("--output-json", g->output_json, "Write the prompts, generated ids, timings and expert load here");
    gc->add_flag("--quiet", g->quiet, "Print nothing (with --output-json: only the file)");
    gc->add_option("--expert-load-out", g->expert_load_out,
                   "Write the tokens routed to each expert of each MoE layer over the run here (JSON; the input of "
                   "`moe-ep eplb --load`)");
    verbs.push_back({gc, [o, g] {
      resolve_auto_dtype(*o);
      return run_generate(*o, *g);
    }});
  }
  verbs.push_back(add_bench_model_verb(app));
  return verbs;
}

}  // namespace moe
