#!/usr/bin/env python3
"""Structured outputs of `burn-gguf serve` (issue 39), driven by the official `openai` client
and checked by an independent validator (PyPI `jsonschema`, Draft 2020-12).

    python3 tests/python/structured_test.py --bin target/debug/burn-gguf \
        --tiny ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf [--gemma PATH] \
        [--requests 200] [--gemma-requests 20]

1. `response_format` `json_schema` (strict) over 20 schemas (nested objects, arrays, enums,
   required fields, numbers with bounds, strings with patterns), sampled at temperature 1,
   8 at a time, on chat and completions: every reply parses and validates, finish_reason
   "stop". The tiny fixture is a random model, the hardest case: it writes whatever the mask
   allows. Gemma 3 270M is a real one.
2. `json_object` replies are JSON objects; llama-server's top-level `json_schema` works too.
3. Streamed deltas, joined, equal the non-streamed reply of the same seed.
4. A constrained reply cut by max_tokens ends with finish_reason "length".
5. Bad input gets a 400 naming the field: a schema that is not an object, one that does not
   compile, an unknown response_format type, a json_schema without an object, both
   response_format and json_schema; fields the server does not honour (tools, logit_bias,
   penalties) are refused rather than ignored, and their neutral values are accepted.
"""
import argparse
import concurrent.futures
import json
import os
import sys

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Server, check, fail  # noqa: E402

STR = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]}},
     "required": ["answer"], "additionalProperties": False},
    {"type": "object", "properties": {"name": STR, "age": {"type": "integer", "minimum": 0,
                                                            "maximum": 130}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{2,10}$"},
                                      "population": {"type": "integer", "minimum": 1,
                                                     "maximum": 40000000}},
     "required": ["city", "population"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": STR, "minItems": 1,
                                               "maxItems": 4}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
            "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"}},
            "required": ["id", "email"], "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["score"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "code": {"type": "integer",
                                                                          "enum": [200, 404, 500]}},
     "required": ["ok", "code"], "additionalProperties": False},
    {"type": "object", "properties": {"date": {"type": "string",
                                               "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
     "required": ["date"], "additionalProperties": False},
    {"type": "object", "properties": {"points": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                         "y": {"type": "integer", "minimum": -9, "maximum": 9}},
        "required": ["x", "y"], "additionalProperties": False}}},
     "required": ["points"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "shade": {"type": "integer", "minimum": 0, "maximum": 255}},
     "required": ["color"], "additionalProperties": False},
    {"type": "object", "properties": {"title": STR, "year": {"type": "integer", "minimum": 1900,
                                                              "maximum": 2030},
                                      "genres": {"type": "array", "maxItems": 2, "items": {
                                          "enum": ["drama", "comedy", "horror"]}}},
     "required": ["title", "year", "genres"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "done"},
                                      "count": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["status", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0,
                                                           "maximum": 9},
                                                          {"type": "boolean"}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0,
                                                  "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-F0-9]{8}$"},
                                      "active": {"type": "boolean"}},
     "required": ["id", "active"], "additionalProperties": False},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50,
                                                      "maximum": 60},
                                      "unit": {"enum": ["C", "F"]}},
     "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "object", "$defs": {"item": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 10}},
        "required": ["sku", "qty"], "additionalProperties": False}},
     "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"},
                              "minItems": 1, "maxItems": 3}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"first": STR, "last": STR, "middle": STR},
     "required": ["first", "last"], "additionalProperties": False},
    {"type": "object", "properties": {"level": {"type": "integer", "minimum": 1, "maximum": 5},
                                      "note": {"type": "string", "minLength": 1,
                                               "maxLength": 8}},
     "required": ["level", "note"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"type": "object", "properties": {
        "kind": {"enum": ["a", "b"]}, "weight": {"type": "number", "minimum": 0,
                                                 "maximum": 100}},
        "required": ["kind", "weight"], "additionalProperties": False},
        "confidence": {"enum": ["low", "high"]}},
     "required": ["answer", "confidence"], "additionalProperties": False},
]
assert len(SCHEMAS) == 20
for s in SCHEMAS:
    jsonschema.Draft202012Validator.check_schema(s)

PROMPT = "Reply with JSON describing something."


def fmt(i):
    return {"type": "json_schema",
            "json_schema": {"name": f"schema_{i}", "schema": SCHEMAS[i], "strict": True}}


def one(srv, model, i, seed, chat, max_tokens):
    if chat:
        r = srv.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], temperature=1,
            seed=seed, max_tokens=max_tokens, response_format=fmt(i))
        return r.choices[0].message.content, r.choices[0].finish_reason
    r = srv.client.completions.create(model=model, prompt=PROMPT, temperature=1, seed=seed,
                                      max_tokens=max_tokens, extra_body={"response_format": fmt(i)})
    return r.choices[0].text, r.choices[0].finish_reason


def validate(text, schema, where):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"{where}: does not parse ({e}): {text!r}")
    try:
        jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as e:
        fail(f"{where}: invalid ({e.message}): {text!r}")
    return value


def schemas_hold(srv, model, requests, max_tokens):
    jobs = [(k % len(SCHEMAS), 1000 + k, k % 2 == 0) for k in range(requests)]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = {ex.submit(one, srv, model, i, seed, chat, max_tokens): (i, seed, chat)
                for i, seed, chat in jobs}
        for f in concurrent.futures.as_completed(futs):
            i, seed, chat = futs[f]
            text, finish = f.result()
            where = f"{model} schema {i} seed {seed} {'chat' if chat else 'completion'}"
            check(finish == "stop", f"{where}: finish_reason {finish}: {text!r}")
            validate(text, SCHEMAS[i], where)
    print(f"structured_test: {model}: {requests} json_schema replies over {len(SCHEMAS)} "
          f"schemas at temperature 1 all parse and validate")


def modes(srv, model):
    msgs = [{"role": "user", "content": PROMPT}]
    for seed in range(4):
        r = srv.client.chat.completions.create(model=model, messages=msgs, temperature=1,
                                               seed=seed, max_tokens=400,
                                               response_format={"type": "json_object"})
        c = r.choices[0]
        if c.finish_reason == "stop":
            check(isinstance(json.loads(c.message.content), dict),
                  f"json_object: {c.message.content!r}")
        else:
            check(c.finish_reason == "length", f"json_object: finish {c.finish_reason}")
    # llama-server's top-level json_schema.
    r = srv.client.chat.completions.create(model=model, messages=msgs, temperature=1, seed=7,
                                           max_tokens=300, extra_body={"json_schema": SCHEMAS[1]})
    validate(r.choices[0].message.content, SCHEMAS[1], "top-level json_schema")
    # Streamed deltas join to the non-streamed reply of the same seed.
    kw = dict(model=model, messages=msgs, temperature=1, seed=11, max_tokens=300,
              response_format=fmt(4))
    full = srv.client.chat.completions.create(**kw).choices[0].message.content
    deltas = [c.choices[0].delta.content or "" for c in
              srv.client.chat.completions.create(stream=True, **kw) if c.choices]
    check("".join(deltas) == full, f"stream {''.join(deltas)!r} != {full!r}")
    validate(full, SCHEMAS[4], "streamed schema")
    # Cut short: finish_reason "length".
    r = srv.client.chat.completions.create(model=model, messages=msgs, temperature=1, seed=3,
                                           max_tokens=2, response_format=fmt(17))
    check(r.choices[0].finish_reason == "length", f"max_tokens 2: {r.choices[0].finish_reason}")
    print(f"structured_test: {model}: json_object, top-level json_schema, streaming and "
          f"length checks pass")


def bad_input(srv, model):
    def post(body):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **body}
        status, data = srv.raw("POST", "/v1/chat/completions", json.dumps(body),
                               {"Content-Type": "application/json"})
        return status, json.loads(data)

    def refused(body, param, what):
        status, data = post(body)
        err = data.get("error", {})
        check(status == 400 and err.get("param") == param,
              f"{what}: want 400 naming {param}, got {status} {data}")

    schema = lambda s: {"response_format": {"type": "json_schema",  # noqa: E731
                                            "json_schema": {"name": "x", "schema": s}}}
    refused(schema(True), "response_format", "a boolean schema")
    refused(schema([1, 2]), "response_format", "an array schema")
    refused(schema({"type": "string", "pattern": "(unclosed"}), "response_format",
            "a bad pattern")
    refused(schema({"type": "frobnicate"}), "response_format", "an unknown type")
    refused(schema({"$ref": "#/$defs/missing"}), "response_format", "a missing $ref")
    refused({"response_format": {"type": "xml"}}, "response_format", "an unknown format")
    refused({"response_format": {"type": "json_schema"}}, "response_format", "no json_schema")
    refused({"response_format": "json"}, "response_format", "a string format")
    refused({"response_format": {"type": "json_schema", "json_schema": {"name": "a b",
                                                                        "schema": {}}}},
            "response_format", "a bad name")
    refused({"response_format": {"type": "json_object"}, "json_schema": {"type": "object"}},
            "json_schema", "both fields")
    refused({"json_schema": 5}, "json_schema", "a number as json_schema")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    refused({"tools": tools}, "tools", "tools (not honoured)")
    refused({"tool_choice": "required"}, "tool_choice", "tool_choice (not honoured)")
    refused({"logit_bias": {"1": 5}}, "logit_bias", "logit_bias")
    refused({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty")
    refused({"grammar": "root ::= \"a\""}, "grammar", "a GBNF grammar")
    for neutral in ({"tools": []}, {"tool_choice": "none"}, {"logit_bias": {}},
                    {"presence_penalty": 0}, {"frequency_penalty": 0.0},
                    {"response_format": {"type": "text"}}):
        status, data = post({**neutral, "max_tokens": 2, "temperature": 0})
        check(status == 200, f"neutral {neutral}: {status} {data}")
    check(srv.health().get("status") == "ok", "server unhealthy after bad input")
    print("structured_test: malformed formats and unhonoured fields get 400s naming the field")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--gemma")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--gemma-requests", type=int, default=20)
    a = ap.parse_args()
    tiny = os.path.basename(a.tiny)
    models = [a.tiny] + ([a.gemma] if a.gemma else [])
    srv = Server(a.bin, models, ["--max-concurrent", "8"])
    try:
        bad_input(srv, tiny)
        modes(srv, tiny)
        schemas_hold(srv, tiny, a.requests, 400)
        if a.gemma:
            gemma = os.path.basename(a.gemma)
            schemas_hold(srv, gemma, a.gemma_requests, 200)
    finally:
        srv.stop()
    print("structured_test: all checks passed")


if __name__ == "__main__":
    main()
