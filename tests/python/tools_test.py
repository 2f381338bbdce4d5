#!/usr/bin/env python3
"""Tool calls of `burn-gguf serve` (issue 39), driven by the official `openai` client, with a
Qwen3-style template (templates/qwen3-tools.jinja, `serve --chat-template`: Hermes JSON calls)
on the tiny fixture and on Gemma 3 270M, and with a Qwen3.5-style one
(templates/qwen35-tools.jinja: `<function=...>` calls whose string values are raw text) on the
tiny fixture; arguments checked by PyPI `jsonschema`.

    python3 tests/python/tools_test.py --bin target/debug/burn-gguf \
        --tiny ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf [--gemma PATH] [--requests 24]

1. `tool_choice` `required` and a named function always give `tool_calls` (finish_reason
   "tool_calls") whose arguments parse and validate against the function's parameters, at
   temperature 1.
2. `auto` replies are either text or valid calls.
3. Streamed deltas joined (content, and each call's name and arguments by index) equal the
   non-streamed reply of the same seed.
4. A round trip: the assistant's calls and a `tool` message in the history continue the
   conversation.
5. Bad input: an unknown function in tool_choice, tools that are not functions, a bad name,
   a tool message with no call before it, logprobs with tools: 400s naming the field.
"""
import argparse
import concurrent.futures
import json
import os
import sys

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Server, check, fail  # noqa: E402

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
TEMPLATE = os.path.join(TEMPLATES, "qwen3-tools.jinja")
XML_TEMPLATE = os.path.join(TEMPLATES, "qwen35-tools.jinja")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search", "description": "Searches the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 16},
            "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Oslo, and what is 2 + 3?"}]


def valid_calls(calls, where, names=None):
    check(calls, f"{where}: no tool_calls")
    for c in calls:
        check(c.type == "function", f"{where}: type {c.type}")
        name = c.function.name
        check(name in PARAMS and (names is None or name in names), f"{where}: name {name}")
        try:
            args = json.loads(c.function.arguments)
        except json.JSONDecodeError as e:
            fail(f"{where}: arguments do not parse ({e}): {c.function.arguments!r}")
        try:
            jsonschema.validate(args, PARAMS[name], cls=jsonschema.Draft202012Validator)
        except jsonschema.ValidationError as e:
            fail(f"{where}: arguments invalid ({e.message}): {c.function.arguments!r}")


def chat(srv, model, **kw):
    kw.setdefault("messages", MSGS)
    kw.setdefault("temperature", 1)
    kw.setdefault("max_tokens", 200)
    return srv.client.chat.completions.create(model=model, tools=TOOLS, **kw)


def forced(srv, model, requests):
    def one(k):
        named = k % 3 == 2
        choice = {"type": "function", "function": {"name": "add"}} if named else "required"
        r = chat(srv, model, tool_choice=choice, seed=100 + k)
        c = r.choices[0]
        where = f"{model} {'named' if named else 'required'} seed {100 + k}"
        check(c.finish_reason == "tool_calls", f"{where}: finish {c.finish_reason}: {c.message}")
        valid_calls(c.message.tool_calls, where, {"add"} if named else None)
        check(len(c.message.tool_calls) == 1, f"{where}: {len(c.message.tool_calls)} calls")
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(requests)))
    print(f"tools_test: {model}: {requests} required / named replies are valid calls")


def auto(srv, model, requests):
    calls = 0
    for k in range(requests):
        r = chat(srv, model, seed=300 + k, max_tokens=48)
        c = r.choices[0]
        if c.message.tool_calls:
            valid_calls(c.message.tool_calls, f"{model} auto seed {300 + k}")
            check(c.finish_reason == "tool_calls", f"auto: finish {c.finish_reason}")
            calls += 1
        else:
            check(isinstance(c.message.content, str), f"auto: no content and no calls: {c}")
            check(c.finish_reason in ("stop", "length"), f"auto: finish {c.finish_reason}")
    print(f"tools_test: {model}: {requests} auto replies are text or valid calls "
          f"({calls} with calls)")


def streamed(srv, model, choices=("required", "auto")):
    for choice in choices:
        kw = dict(tool_choice=choice, seed=7, max_tokens=60)
        full = chat(srv, model, **kw).choices[0]
        content, calls, finish = "", {}, None
        for chunk in chat(srv, model, stream=True, **kw):
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                e = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                e["name"] += tc.function.name or ""
                e["arguments"] += tc.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        want = [{"name": c.function.name, "arguments": c.function.arguments}
                for c in full.message.tool_calls or []]
        got = [calls[i] for i in sorted(calls)]
        check(got == want, f"{choice}: streamed calls {got} != {want}")
        check(content == (full.message.content or ""),
              f"{choice}: streamed content {content!r} != {full.message.content!r}")
        check(finish == full.finish_reason, f"{choice}: finish {finish} != {full.finish_reason}")
    print(f"tools_test: {model}: streamed deltas join to the whole replies")


def round_trip(srv, model):
    r = chat(srv, model, tool_choice={"type": "function", "function": {"name": "get_weather"}},
             seed=5)
    call = r.choices[0].message.tool_calls[0]
    history = MSGS + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    r2 = chat(srv, model, messages=history, seed=6, max_tokens=24, tool_choice="none")
    c = r2.choices[0]
    check(c.finish_reason in ("stop", "length") and isinstance(c.message.content, str)
          and not c.message.tool_calls, f"round trip: {c}")
    check(r2.usage.prompt_tokens > r.usage.prompt_tokens,
          "round trip: the history with the call and its result is in the prompt")
    print(f"tools_test: {model}: a tool message continues the conversation")


def bad_input(srv, model):
    def post(body):
        body = {"model": model, "messages": MSGS, **body}
        status, data = srv.raw("POST", "/v1/chat/completions", json.dumps(body),
                               {"Content-Type": "application/json"})
        return status, json.loads(data)

    def refused(body, param, what):
        status, data = post(body)
        check(status == 400 and data.get("error", {}).get("param") == param,
              f"{what}: want 400 naming {param}, got {status} {data}")

    refused({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice", "an unknown function")
    refused({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "a bad tool_choice")
    refused({"tools": [{"type": "retrieval"}]}, "tools", "a tool that is not a function")
    refused({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "a bad name")
    refused({"tools": TOOLS + TOOLS[:1]}, "tools", "a name twice")
    refused({"tools": TOOLS, "logprobs": True}, "logprobs", "logprobs with tools")
    refused({"messages": MSGS + [{"role": "tool", "tool_call_id": "x", "content": "1"}]},
            "messages", "a tool message with no call before it")
    check(srv.health().get("status") == "ok", "server unhealthy after bad input")
    print("tools_test: bad tool requests get 400s naming the field")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--gemma")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--gemma-requests", type=int, default=4)
    a = ap.parse_args()
    tiny = os.path.basename(a.tiny)
    models = [a.tiny] + ([a.gemma] if a.gemma else [])
    srv = Server(a.bin, models, ["--max-concurrent", "8", "--chat-template", TEMPLATE])
    try:
        bad_input(srv, tiny)
        forced(srv, tiny, a.requests)
        auto(srv, tiny, 8)
        streamed(srv, tiny)
        round_trip(srv, tiny)
        if a.gemma:
            gemma = os.path.basename(a.gemma)
            forced(srv, gemma, a.gemma_requests)
            auto(srv, gemma, 1)
            streamed(srv, gemma, ("required",))
            round_trip(srv, gemma)
    finally:
        srv.stop()
    # The <function=...> syntax: forced calls keep to each parameter's schema as raw text.
    srv = Server(a.bin, [a.tiny], ["--max-concurrent", "8", "--chat-template", XML_TEMPLATE])
    try:
        print("tools_test: with the Qwen3.5-style <function=...> template:")
        # A string under a pattern cannot be kept to as raw text: a 400, not an invalid call.
        pattern = [{"type": "function", "function": {"name": "code", "parameters": {
            "type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["id"]}}}]
        body = {"model": tiny, "messages": MSGS, "tools": pattern, "tool_choice": "required"}
        status, data = srv.raw("POST", "/v1/chat/completions", json.dumps(body),
                               {"Content-Type": "application/json"})
        err = json.loads(data).get("error", {})
        check(status == 400 and err.get("param") == "tool_choice" and "pattern" in
              err.get("message", ""), f"a pattern under <function=...>: {status} {data}")
        forced(srv, tiny, a.requests)
        auto(srv, tiny, 8)
        streamed(srv, tiny)
        round_trip(srv, tiny)
    finally:
        srv.stop()
    print("tools_test: all checks passed")


if __name__ == "__main__":
    main()
