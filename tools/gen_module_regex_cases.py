#!/usr/bin/env python3
"""Writes tests/fixtures/hf_int4/module_regex_cases.json: for each compressed-tensors
"ignore" entry "re:<pattern>" and each module name, whether Python's re.match accepts it.

compressed-tensors (and vLLM's compressed-tensors loader) decide that a module is left
unquantised with re.match(target.removeprefix("re:"), name): anchored at the start of the
name, not at its end. moe-ep runs the same patterns with RE2; this table is the reference
its test (tests/test_hf_int4.cpp, HfInt4Config.ModuleRegexAsPython) compares with.
Standard library only: python3 tools/gen_module_regex_cases.py
"""
import json
import pathlib
import re
import sys

PATTERNS = [
    # What real checkpoints write.
    r".*lm_head", r".*mlp\.gate$", r".*self_attn.*", r".*\.(q|k|v|o)_proj$",
    r".*mlp\.shared_expert(s)?\..*", r"model\.layers\.[0-9]+\.mlp\.gate",
    # Anchoring: re.match is anchored at the start only.
    r"lm_head", r"layers\.0", r"model\.layers\.0", r"model\.layers\.1$", r"^model\.embed_tokens",
    # Syntax Python and RE2 share: classes, counts, alternation, non-capturing and named
    # groups, inline flags, escapes.
    r"model\.layers\.\d{1,2}\.mlp\.experts\.\d+\.(gate|up)_proj", r"(?i)MODEL\.LAYERS\.0\..*",
    r"(?:model\.)?layers\.[02]\..*", r"(?P<prefix>model)\.layers\.\d+\.self_attn\.kv_a_proj_with_mqa",
    r"[a-z_]+\.layers\.3\.mlp\.experts\.[13579]\.down_proj",
    # Patterns a backtracking matcher spends exponential time on (Python too: the names
    # below stay short enough for it; the C++ test adds long ones); RE2 is linear.
    r"(a*)*b", r"(a|aa)*b$", r"(model|model\.)*layers",
]

NAMES = [
    "lm_head", "model.lm_head", "model.embed_tokens", "model.layers.0.mlp.gate", "model.layers.0.mlp.gate_proj",
    "model.layers.1", "model.layers.10", "model.layers.1.self_attn.q_proj", "model.layers.3.self_attn.o_proj",
    "model.layers.3.self_attn.kv_a_proj_with_mqa", "model.layers.12.mlp.experts.7.gate_proj",
    "model.layers.3.mlp.experts.7.down_proj", "model.layers.3.mlp.experts.8.down_proj",
    "model.layers.2.mlp.shared_expert.up_proj", "model.layers.2.mlp.shared_experts.up_proj", "layers.0.mlp.gate",
    "model.layers.0.mlp.experts.0.up_proj", "a" * 16, "a" * 15 + "b", "x" * 40,
]

# Lookahead and backreferences are Python-only: moe-ep refuses such a pattern with an error
# (tests/test_hf_int4.cpp checks that), so they have no row here.


def main() -> int:
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/hf_int4/module_regex_cases.json"
    cases = []
    for p in PATTERNS:
        rx = re.compile(p)
        for n in NAMES:
            cases.append({"entry": "re:" + p, "module": n, "match": rx.match(n) is not None})
    doc = {"generator": "tools/gen_module_regex_cases.py", "python": sys.version.split()[0],
           "rule": "re.match(entry.removeprefix('re:'), module) is not None", "cases": cases}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
