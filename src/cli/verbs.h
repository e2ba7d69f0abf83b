// The verbs of the moe-ep command. Each add_*_verb adds its subcommand (with
// --help text for every flag) to the app and returns the function that runs it
// once parsing chose it. Options live in objects owned by that function.
#pragma once

#include <functional>
#include <vector>

namespace CLI {
class App;
}

namespace moe {

struct Verb {
  CLI::App* cmd = nullptr;
  std::function<int()> run;  // returns the process exit code; throws moe::Error
};

Verb add_layer_verb(CLI::App& app);      // cli/layer_cmd.cpp
Verb add_bench_verb(CLI::App& app);      // cli/bench_cmd.cpp
Verb add_compare_verb(CLI::App& app);    // cli/compare_cmd.cpp
std::vector<Verb> add_inspect_verbs(CLI::App& app);  // cli/inspect_cmd.cpp (checkpoint inspection)
std::vector<Verb> add_model_verbs(CLI::App& app);    // cli/model_cmds.cpp (forward, generate, ...)
std::vector<Verb> add_text_verbs(CLI::App& app);     // cli/text_cmds.cpp (tokenize, detokenize)
Verb add_chat_verb(CLI::App& app);                   // cli/chat_cmd.cpp (interactive chat)
Verb add_serve_verb(CLI::App& app);                  // cli/serve_cmd.cpp (OpenAI-compatible server)
Verb add_bench_serve_verb(CLI::App& app);            // cli/bench_serve_cmd.cpp (load generator)
Verb add_eplb_verb(CLI::App& app);                   // cli/eplb_cmd.cpp (expert placement from a load file)
Verb add_plan_verb(CLI::App& app);                   // cli/plan_cmd.cpp (cluster sizing on paper)
Verb add_launch_verb(CLI::App& app);                 // cli/launch_cmd.cpp (mpirun supervised: lost hosts end the job)

}  // namespace moe
