#!/usr/bin/env python3
"""The official `openai` Python client as the judge of moe-ep serve's parsed replies
(reasoning_content, tool_calls; src/serve/parsers/).

Set up once (any current openai 1.x/2.x works; this was run with 2.8.1):
    python3 -m venv /tmp/openai-venv && /tmp/openai-venv/bin/pip install openai==2.8.1

Modes:
  goldens [DIR]   Validate the golden responses tests/test_serve_parsers_wire.cpp compares
                  the server's builder against (default tests/fixtures/serve_parsers): each
                  body through ChatCompletion.model_validate, each chunk through
                  ChatCompletionChunk.model_validate, the chunks reassembled by the client's
                  own ChatCompletionStreamState into the same message (tool-call ids, names,
                  arguments, content, reasoning_content, finish_reason).
  live --base-url URL --reasoning R --tools T
                  Against a server whose model replies with the user's message (the echo
                  engine of tests/test_serve_parsers_http.cpp; run by hand while developing,
                  the test suite itself never needs Python): scripted replies of format T come back through
                  client.chat.completions.create, streamed and not, as the expected calls
                  and reasoning; the reply is then sent back as history in a second turn.
  smoke --base-url URL [--model M] [--api-key K]
                  Against any running `moe-ep serve` (e.g. a fixture model, whose random
                  text rarely holds a call): requests with tools, streamed and not, must
                  parse, and any tool call must carry JSON-object arguments as a string.
  choices --base-url URL [--model M] [--api-key K]
                  Against any running `moe-ep serve`: n choices whole and streamed (the
                  stream reassembled by the client per index), greedy choices equal to the
                  one-choice answer, usage counting the prompt once, seeded n repeating.
  agent --base-url URL [--model M] [--api-key K]
                  Against any running `moe-ep serve` with a tool-call parser (a fixture model
                  with random weights is enough: the grammar, not the model, makes the
                  replies well-formed): an agent loop of several turns. tool_choice
                  "required" returns calls whose arguments validate against the tool's JSON
                  schema (Python jsonschema; pip install jsonschema), streamed calls
                  reassemble to the whole ones (same seed), a named tool_choice calls that
                  tool, tool results go back as history, a json_schema reply validates, and
                  every turn after the first reports cached_tokens > 0.
Exit status 0 when every check passed; each failure is printed.
"""
import argparse
import glob
import json
import os
import sys

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def reasoning_of(message):
    # Not an OpenAI field: pydantic keeps unknown fields as extras (as vLLM's clients read it).
    return getattr(message, "reasoning_content", None)


def calls_of(message):
    return [(c.id, c.function.name, c.function.arguments) for c in (message.tool_calls or [])]


def reassemble(chunks):
    """The client's own accumulation of a stream, plus our extra reasoning_content deltas."""
    state = ChatCompletionStreamState()
    reasoning = None
    for chunk in chunks:
        list(state.handle_chunk(chunk))
        for choice in chunk.choices:
            piece = getattr(choice.delta, "reasoning_content", None)
            if piece:
                reasoning = (reasoning or "") + piece
    try:
        return state.get_final_completion(), reasoning
    except openai.LengthFinishReasonError as e:  # its parse step refuses a cut reply; the reassembly is done
        return e.completion, reasoning


def check_arguments(calls, where):
    for _, name, args in calls:
        check(isinstance(args, str), f"{where}: arguments of {name} is a {type(args).__name__}, not a string")
        try:
            check(isinstance(json.loads(args), dict), f"{where}: arguments of {name} is not a JSON object")
        except ValueError:
            check(False, f"{where}: arguments of {name} is not JSON: {args!r}")


def goldens(directory):
    paths = sorted(glob.glob(os.path.join(directory, "*.json")))
    check(paths, f"no goldens in {directory}")
    for path in paths:
        case = json.load(open(path, encoding="utf-8"))
        name = case["case"]
        before = len(FAILURES)
        try:
            whole = ChatCompletion.model_validate(case["response"])
            chunks = [ChatCompletionChunk.model_validate(c) for c in case["stream"]]
        except Exception as e:  # pydantic's ValidationError names the field
            check(False, f"{name}: the client's models reject it: {e}")
            continue
        final, reasoning = reassemble(chunks)
        w, s = whole.choices[0], final.choices[0]
        check(w.finish_reason == s.finish_reason, f"{name}: finish_reason {w.finish_reason} vs streamed {s.finish_reason}")
        check((w.message.content or "") == (s.message.content or ""),
              f"{name}: content {w.message.content!r} vs streamed {s.message.content!r}")
        check(reasoning_of(w.message) == reasoning,
              f"{name}: reasoning_content {reasoning_of(w.message)!r} vs streamed {reasoning!r}")
        check(calls_of(w.message) == calls_of(s.message),
              f"{name}: tool_calls {calls_of(w.message)} vs streamed {calls_of(s.message)}")
        check_arguments(calls_of(w.message), name)
        if w.message.tool_calls:
            check(w.finish_reason == "tool_calls", f"{name}: a reply with calls ends with {w.finish_reason}")
        if len(FAILURES) == before:
            print(f"ok   {name}: {len(chunks)} chunks, {len(calls_of(w.message))} call(s)")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]

# Per format: (scripted reply, chat_template_kwargs, expected content, reasoning, calls [(name, args)]).
LIVE = {
    "hermes": [("<think>\nTwo cities.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
                "\"arguments\": {\"city\": \"東京\"}}\n</tool_call>", None, "Checking.", "Two cities.",
                [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "東京"})]),
               ("Plain answer, <tool_call>{broken}</tool_call>", None, "Plain answer, <tool_call>{broken}</tool_call>",
                None, [])],
    "qwen3_coder": [("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n"
                     "3\n</parameter>\n</function>\n</tool_call>", None, None, None,
                     [("get_weather", {"city": "New York", "days": 3})])],
    "deepseek_v3": [("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                     "{\"city\": \"Hangzhou\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", None, None, None,
                     [("get_weather", {"city": "Hangzhou"})])],
    "deepseek_v31": [("Need the weather.\n</think>Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                      "<｜tool▁sep｜>{\"city\": \"Beijing\", \"days\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                      {"think": True}, "Let me look.", "Need the weather.", [("get_weather", {"city": "Beijing", "days": 1})])],
    "mistral": [("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}]", None, None, None,
                 [("get_weather", {"city": "Lyon"})])],
}


def live(base_url, reasoning_parser, tool_parser):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    for reply, kwargs, content, reasoning, calls in LIVE[tool_parser]:
        where = f"{tool_parser}: {reply[:40]!r}"
        before = len(FAILURES)
        extra = {"chat_template_kwargs": kwargs} if kwargs else None
        msgs = [{"role": "user", "content": reply}]
        whole = client.chat.completions.create(model="echo", messages=msgs, tools=TOOLS, extra_body=extra)
        m = whole.choices[0].message
        got = [(c.function.name, json.loads(c.function.arguments)) for c in (m.tool_calls or [])]
        check(got == calls, f"{where}: calls {got} != {calls}")
        check_arguments(calls_of(m), where)
        check(all(c.type == "function" and c.id for c in (m.tool_calls or [])), f"{where}: call without id or type")
        check((m.content or None) == content, f"{where}: content {m.content!r} != {content!r}")
        if reasoning_parser != "none":
            check(reasoning_of(m) == reasoning, f"{where}: reasoning_content {reasoning_of(m)!r} != {reasoning!r}")
        check(whole.choices[0].finish_reason == ("tool_calls" if calls else "stop"),
              f"{where}: finish_reason {whole.choices[0].finish_reason}")
        stream = client.chat.completions.create(model="echo", messages=msgs, tools=TOOLS, extra_body=extra, stream=True)
        final, streamed_reasoning = reassemble(list(stream))
        s = final.choices[0]
        check([(n, a) for _, n, a in calls_of(s.message)] == [(n, a) for _, n, a in calls_of(m)],
              f"{where}: streamed calls {calls_of(s.message)} != {calls_of(m)}")
        check((s.message.content or None) == (m.content or None), f"{where}: streamed content {s.message.content!r}")
        check(s.finish_reason == whole.choices[0].finish_reason, f"{where}: streamed finish_reason {s.finish_reason}")
        if reasoning_parser != "none":
            check(streamed_reasoning == reasoning, f"{where}: streamed reasoning {streamed_reasoning!r}")
        # The reply as history: the client's own serialization of it must be accepted.
        history = msgs + [m.model_dump(exclude_none=True)]
        history += [{"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in (m.tool_calls or [])]
        history += [{"role": "user", "content": "thanks"}]
        again = client.chat.completions.create(model="echo", messages=history, tools=TOOLS)
        said = again.choices[0].message
        # (deepseek_r1 takes a reply without </think> as reasoning: the echo may land there.)
        check("thanks" in (said.content, reasoning_of(said)), f"{where}: second turn said {said.content!r}")
        if len(FAILURES) == before:
            print(f"ok   {where}")


def smoke(base_url, model, api_key):
    client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0, timeout=300)
    model = model or client.models.list().data[0].id
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ("auto", "required"):
        whole = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice=choice,
                                               max_tokens=24, temperature=0)
        m = whole.choices[0].message
        check(whole.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"smoke {choice}: finish_reason")
        check_arguments(calls_of(m), f"smoke {choice}")
        final, _ = reassemble(list(client.chat.completions.create(
            model=model, messages=msgs, tools=TOOLS, tool_choice=choice, max_tokens=24, temperature=0, stream=True)))
        check((final.choices[0].message.content or "") == (m.content or ""), f"smoke {choice}: streamed != whole content")
        check([c[1:] for c in calls_of(final.choices[0].message)] == [c[1:] for c in calls_of(m)],
              f"smoke {choice}: streamed calls != whole calls")
        print(f"ok   smoke tool_choice={choice}: {len(m.tool_calls or [])} call(s), content {m.content!r:.60}")


def choices(base_url, model, api_key):
    """n choices (OpenAI's `n`) read by the client: a whole reply with n choices in order,
    the stream reassembled per index by the client's own state, equal to the whole reply
    choice by choice (greedy: every choice the one-choice answer), usage once; seeded
    sampling repeats per choice; and the legacy completions endpoint the same way."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0, timeout=300)
    model = model or client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Count: 1 2 3 4 5 6 7 8 9"}]
    one = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
    whole = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0, n=3)
    check([c.index for c in whole.choices] == [0, 1, 2], f"n=3: indices {[c.index for c in whole.choices]}")
    check(all(c.message.content == one.choices[0].message.content for c in whole.choices), "n=3 greedy != n=1")
    check(whole.usage.prompt_tokens == one.usage.prompt_tokens, "n=3: the prompt counts once")
    check(whole.usage.completion_tokens == 3 * one.usage.completion_tokens, "n=3: completion tokens summed")
    final, _ = reassemble(list(client.chat.completions.create(
        model=model, messages=msgs, max_tokens=12, temperature=0, n=3, stream=True)))
    check(sorted(c.index for c in final.choices) == [0, 1, 2], "n=3 streamed: indices")
    for c in final.choices:
        check(c.message.content == whole.choices[c.index].message.content, f"n=3 streamed choice {c.index} != whole")
        check(c.finish_reason == whole.choices[c.index].finish_reason, f"n=3 streamed choice {c.index}: finish_reason")
    a = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=1.0, seed=5, n=2)
    b = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=1.0, seed=5, n=2)
    check([c.message.content for c in a.choices] == [c.message.content for c in b.choices], "seeded n=2 repeats")
    text = client.completions.create(model=model, prompt="1 2 3 4", max_tokens=8, temperature=0, n=2)
    check([c.index for c in text.choices] == [0, 1] and text.choices[0].text == text.choices[1].text,
          "completions n=2 greedy")
    print(f"ok   choices: n=3 whole and streamed agree ({one.usage.completion_tokens} tokens each), seeded n=2 "
          f"repeats, completions n=2")


AGENT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                    "required": ["city"], "additionalProperties": False}}},
]
ANSWER_SCHEMA = {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 40},
                                                  "temperature": {"type": "integer", "minimum": -50, "maximum": 60},
                                                  "sunny": {"type": "boolean"}},
                 "required": ["summary", "temperature", "sunny"], "additionalProperties": False}


def agent(base_url, model, api_key):
    import jsonschema
    client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0, timeout=300)
    model = model or client.models.list().data[0].id
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in AGENT_TOOLS}
    # No thinking: a random model's free reasoning would rarely end within max_tokens.
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    msgs = [{"role": "system", "content": "You are a weather agent. Call tools, then answer as JSON."},
            {"role": "user", "content": "What is the weather and the time in Paris?"}]
    turns = 0
    for turn, choice in enumerate(["required", {"type": "function", "function": {"name": "get_time"}}, "required"]):
        kw = dict(model=model, messages=msgs, tools=AGENT_TOOLS, tool_choice=choice, max_tokens=160,
                  temperature=1.0, seed=11 + turn, extra_body=extra)
        whole = client.chat.completions.create(**kw)
        c0 = whole.choices[0]
        where = f"agent turn {turn + 1} tool_choice={choice if isinstance(choice, str) else 'named'}"
        check(c0.finish_reason == "tool_calls", f"{where}: finish_reason {c0.finish_reason}, content {c0.message.content!r:.80}")
        calls = c0.message.tool_calls or []
        check(len(calls) >= 1, f"{where}: no tool call")
        for c in calls:
            check(c.function.name in schemas, f"{where}: unknown tool {c.function.name}")
            if not isinstance(choice, str):
                check(c.function.name == "get_time", f"{where}: called {c.function.name}, not the named tool")
            try:
                jsonschema.validate(json.loads(c.function.arguments), schemas.get(c.function.name, {}))
            except Exception as e:  # noqa: BLE001 - any failure is the check's
                check(False, f"{where}: arguments {c.function.arguments!r} do not validate: {e}")
        if turn > 0:
            cached = whole.usage.prompt_tokens_details.cached_tokens if whole.usage.prompt_tokens_details else 0
            check(cached > 0, f"{where}: cached_tokens {cached} on a resent conversation")
        final, _ = reassemble(list(client.chat.completions.create(stream=True, **kw)))
        check([c[1:] for c in calls_of(final.choices[0].message)] == [c[1:] for c in calls_of(c0.message)],
              f"{where}: streamed calls {calls_of(final.choices[0].message)} != whole {calls_of(c0.message)}")
        msgs = msgs + [c0.message.model_dump(exclude_none=True)]
        msgs += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": True, "value": "18C, sunny"})}
                 for c in calls]
        turns += 1
        print(f"ok   {where}: {[(c.function.name, c.function.arguments) for c in calls]}")
    # The answer, as JSON that validates; the history is resent whole and mostly cached.
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    for stream in (False, True):
        kw = dict(model=model, messages=msgs + [{"role": "user", "content": "Answer now."}], max_tokens=200,
                  temperature=1.0, seed=5, response_format=rf, extra_body=extra)
        if stream:
            final, _ = reassemble(list(client.chat.completions.create(stream=True, **kw)))
            text = final.choices[0].message.content
        else:
            r = client.chat.completions.create(**kw)
            text = r.choices[0].message.content
            check(r.choices[0].finish_reason == "stop", f"json answer: finish_reason {r.choices[0].finish_reason}")
            cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
            check(cached > 0, f"json answer: cached_tokens {cached}")
            whole_text = text
        try:
            jsonschema.validate(json.loads(text), ANSWER_SCHEMA)
        except Exception as e:  # noqa: BLE001
            check(False, f"json answer (stream={stream}): {text!r} does not validate: {e}")
    check(text == whole_text, "json answer: streamed != whole")
    # json_object on the legacy completions endpoint.
    t = client.completions.create(model=model, prompt="JSON:", max_tokens=200, temperature=1.0, seed=3,
                                  extra_body={"response_format": {"type": "json_object"}})
    if t.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(t.choices[0].text), dict), f"completions json_object: {t.choices[0].text!r}")
    print(f"ok   agent: {turns} tool turns, a json_schema answer that validates: {whole_text}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["goldens", "live", "smoke", "choices", "agent"])
    ap.add_argument("dir", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                           "serve_parsers"))
    ap.add_argument("--base-url")
    ap.add_argument("--reasoning", default="none")
    ap.add_argument("--tools", default="hermes")
    ap.add_argument("--model")
    ap.add_argument("--api-key")
    a = ap.parse_args()
    print(f"openai {openai.__version__}")
    if a.mode == "goldens":
        goldens(a.dir)
    elif a.mode == "live":
        live(a.base_url, a.reasoning, a.tools)
    elif a.mode == "choices":
        choices(a.base_url, a.model, a.api_key)
    elif a.mode == "agent":
        agent(a.base_url, a.model, a.api_key)
    else:
        smoke(a.base_url, a.model, a.api_key)
    print(f"{len(FAILURES)} failed" if FAILURES else "all checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
