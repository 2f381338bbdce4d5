#!/usr/bin/env python3
"""OpenAI API conformance of `burn-gguf serve`, driven by the official `openai` client (raw
HTTP where the client hides the detail), and batched decoding seen from the API.

    python3 tests/python/conformance_test.py --bin target/debug/burn-gguf \
        --tiny ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf --gemma PATH

Each check names the fault class it guards (faults llama.cpp, ollama, llama-cpp-python and others
have shipped):
1. finish_reason: "length" when max_tokens / max_completion_tokens ends the answer (and
   max_completion_tokens is honoured), "stop" on an end-of-generation token or a stop string.
2. stream_options.include_usage: one last chunk with usage and no choices; none without it.
3. stop as a string or a list; a stop string split across tokens never leaks into the stream;
   held-back text that is not a stop string after all is flushed at the end.
4. Streamed deltas never split a UTF-8 character (no U+FFFD) and join to the non-streamed text.
5. Generation ends on every end-of-generation token of the vocabulary, not only
   eos_token_id (the tiny Qwen3 vocabulary's <|endoftext|> where eos is <|im_end|>), and the
   token never shows in the text.
6. logprobs / top_logprobs, chat and completion shapes, streamed and not.
7. A prompt longer than the context is a 400 naming the context; a context that fills during
   generation ends with "length".
8. Batched decoding: 16 concurrent greedy requests give the texts each gives alone.
9. /metrics: Prometheus text with the running and waiting sequences, tokens, time to first token.
"""
import argparse
import concurrent.futures
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Server, check, fail  # noqa: E402

PROMPT = "The capital of France is"


def complete(srv, model, prompt=PROMPT, **kw):
    kw.setdefault("temperature", 0)
    return srv.client.completions.create(model=model, prompt=prompt, **kw)


def stream_completion(srv, model, prompt=PROMPT, **kw):
    kw.setdefault("temperature", 0)
    deltas, finish, usage, chunks = [], None, None, []
    for chunk in srv.client.completions.create(model=model, prompt=prompt, stream=True, **kw):
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.text:
                deltas.append(c.text)
            finish = c.finish_reason or finish
    return deltas, finish, usage, chunks


def stream_chat(srv, model, content, **kw):
    kw.setdefault("temperature", 0)
    deltas, finish, usage, chunks = [], None, None, []
    msgs = [{"role": "user", "content": content}]
    for chunk in srv.client.chat.completions.create(model=model, messages=msgs, stream=True, **kw):
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                deltas.append(c.delta.content)
            finish = c.finish_reason or finish
    return deltas, finish, usage, chunks


def finish_reasons(srv, tiny):
    r = complete(srv, tiny, max_tokens=5)
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5,
          f"max_tokens 5: {r.choices[0].finish_reason}, {r.usage.completion_tokens} tokens")
    msgs = [{"role": "user", "content": "Write a story about a robot."}]
    c = srv.client.chat.completions.create(model=tiny, messages=msgs, temperature=0,
                                           max_completion_tokens=3)
    check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 3,
          f"max_completion_tokens 3: {c.choices[0].finish_reason}, {c.usage.completion_tokens}")
    # Both given: max_completion_tokens, the newer name, wins.
    c = srv.client.chat.completions.create(model=tiny, messages=msgs, temperature=0,
                                           max_tokens=9, max_completion_tokens=4)
    check(c.usage.completion_tokens == 4, f"max_completion_tokens over max_tokens: {c.usage}")
    # The tiny model ends "Once upon a time" with an end-of-generation token after 2 tokens.
    e = complete(srv, tiny, prompt="Once upon a time", max_tokens=50)
    check(e.choices[0].finish_reason == "stop" and e.usage.completion_tokens < 50,
          f"end-of-generation token: {e.choices[0].finish_reason} after {e.usage.completion_tokens}")
    print(f"finish_reason: length at max_tokens and max_completion_tokens; stop at the "
          f"end-of-generation token (after {e.usage.completion_tokens} tokens)")


def usage_chunk(srv, tiny):
    _, _, usage, chunks = stream_completion(srv, tiny, max_tokens=6,
                                            stream_options={"include_usage": True})
    last = chunks[-1]
    check(usage is not None and last.usage is not None and last.choices == [],
          f"include_usage: last chunk {last}")
    check(usage.completion_tokens == 6 and usage.total_tokens == usage.prompt_tokens + 6,
          f"usage {usage}")
    check(all(c.usage is None for c in chunks[:-1]), "usage before the last chunk")
    _, _, usage, chunks = stream_completion(srv, tiny, max_tokens=6)
    check(usage is None and all(c.usage is None for c in chunks), "usage without include_usage")
    print("stream_options.include_usage: one last usage chunk with no choices; none without it")


def stops(srv, tiny):
    full = complete(srv, tiny, max_tokens=12, logprobs=0)
    text = full.choices[0].text
    tokens = full.choices[0].logprobs.tokens
    check("".join(tokens) == text, f"logprob tokens {tokens!r} do not join to {text!r}")
    # A stop string across a token boundary: the last char of token i and the first of i+1.
    i = next(i for i in range(2, len(tokens) - 1) if tokens[i] and tokens[i + 1]
             and "\ufffd" not in tokens[i] + tokens[i + 1])
    stop = tokens[i][-1] + tokens[i + 1][0]
    cut = text[: text.index(stop)]
    for form in (stop, [stop], ["zzz-not-there", stop]):
        r = complete(srv, tiny, max_tokens=12, stop=form)
        check(r.choices[0].text == cut and r.choices[0].finish_reason == "stop",
              f"stop {form!r}: {r.choices[0].text!r} ({r.choices[0].finish_reason}), want {cut!r}")
        deltas, finish, _, _ = stream_completion(srv, tiny, max_tokens=12, stop=form)
        # Exactly the text before the stop string: no character of it was streamed.
        check("".join(deltas) == cut and finish == "stop",
              f"streamed stop {form!r}: {deltas!r} ({finish}), want {cut!r}")
    # A stop string whose start ends the text but which never completes: held back, then
    # flushed when max_tokens ends the answer.
    tail = text[-2:]
    never = tail + "\u2603never"
    deltas, finish, _, _ = stream_completion(srv, tiny, max_tokens=12, stop=[never])
    check("".join(deltas) == text and finish == "length",
          f"held-back tail not flushed: {deltas!r} ({finish}), want {text!r}")
    print(f"stop: {stop!r} across tokens {tokens[i]!r}|{tokens[i + 1]!r} cuts to {cut!r} "
          f"(string, list, streamed); a held-back tail {tail!r} is flushed at the end")


def utf8(srv, gemma):
    prompt = "Translate to Japanese and French: good morning, coffee, thank you."
    deltas, finish, _, _ = stream_chat(srv, gemma, prompt, max_tokens=48)
    joined = "".join(deltas)
    msgs = [{"role": "user", "content": prompt}]
    whole = srv.client.chat.completions.create(model=gemma, messages=msgs, temperature=0,
                                               max_tokens=48).choices[0].message.content
    check(joined == whole, f"streamed {joined!r} != non-streamed {whole!r}")
    check(not any("\ufffd" in d for d in deltas), f"U+FFFD in a delta: {deltas!r}")
    wide = sum(1 for ch in joined if ord(ch) > 0x7f)
    check(wide > 0, f"no multi-byte character to check in {joined!r}")
    print(f"UTF-8: {len(deltas)} deltas, {wide} multi-byte characters, none split; joined = "
          f"non-streamed")


def end_of_generation(srv, tiny):
    # The tiny Qwen3 vocabulary's eos_token_id is <|im_end|> (383); after "Once upon a time"
    # the model emits <|endoftext|> (381), which llama.cpp also counts as end of generation.
    r = complete(srv, tiny, prompt="Once upon a time", max_tokens=50, logprobs=0)
    c = r.choices[0]
    last = c.logprobs.tokens[-1]
    check(c.finish_reason == "stop" and last == "<|endoftext|>" and r.usage.completion_tokens < 50,
          f"end of generation: {c.finish_reason} after {r.usage.completion_tokens}, last {last!r}")
    check("<|endoftext|>" not in c.text, f"end marker in the text: {c.text!r}")
    print(f"end of generation: stopped at {last!r} (not the file's eos_token_id <|im_end|>), "
          f"not in the text {c.text!r}")


def logprobs(srv, tiny):
    msgs = [{"role": "user", "content": "Write a story about a robot."}]
    r = srv.client.chat.completions.create(model=tiny, messages=msgs, temperature=0, max_tokens=8,
                                           logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, f"{len(content)} entries for {r.usage}")
    for e in content:
        top = e.top_logprobs
        check(len(top) == 5, f"top_logprobs {len(top)}")
        lps = [t.logprob for t in top]
        check(lps == sorted(lps, reverse=True), f"top_logprobs not sorted: {lps}")
        check(all(lp <= 1e-6 for lp in lps) and sum(math.exp(lp) for lp in lps) <= 1 + 1e-4,
              f"not log-probabilities: {lps}")
        # Greedy: the chosen token is the most likely one.
        check(e.token == top[0].token and abs(e.logprob - top[0].logprob) < 1e-5,
              f"greedy chose {e.token!r} ({e.logprob}), top is {top[0].token!r} ({top[0].logprob})")
        check(bytes(e.bytes).decode("utf-8", "replace") == e.token, f"bytes of {e.token!r}")
    no = srv.client.chat.completions.create(model=tiny, messages=msgs, temperature=0, max_tokens=4)
    check(no.choices[0].logprobs is None, "logprobs without asking")
    # Streamed: the same entries, spread over the chunks.
    _, _, _, chunks = stream_chat(srv, tiny, msgs[0]["content"], max_tokens=8, logprobs=True,
                                  top_logprobs=5)
    streamed = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content]
    check([(e.token, round(e.logprob, 5)) for e in streamed] ==
          [(e.token, round(e.logprob, 5)) for e in content], "streamed logprobs differ")
    # Completions: the legacy shape.
    c = complete(srv, tiny, max_tokens=6, logprobs=3)
    lp = c.choices[0].logprobs
    check(len(lp.tokens) == 6 and len(lp.token_logprobs) == 6 and len(lp.top_logprobs) == 6,
          f"completion logprobs {lp}")
    check("".join(lp.tokens) == c.choices[0].text, "completion logprob tokens != text")
    check(lp.text_offset[0] == 0 and all(len(t) <= 3 for t in lp.top_logprobs), f"{lp}")
    # Out of range: a 400 naming the field.
    for body, field in [
        ({"messages": msgs, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": msgs, "top_logprobs": 3}, "top_logprobs"),
        ({"messages": msgs, "logprobs": "yes"}, "logprobs"),
    ]:
        status, data = srv.raw("POST", "/v1/chat/completions",
                               body=json.dumps({"model": tiny, **body}).encode(),
                               headers={"Content-Type": "application/json"})
        err = json.loads(data).get("error", {})
        check(status == 400 and err.get("param") == field, f"{body}: {status} {data[:200]!r}")
    print(f"logprobs: chat (5 alternatives, greedy = top 1, streamed = not), completion shape, "
          f"bad values 400; first token {content[0].token!r} {content[0].logprob:.4f}")


def context(binary, tiny):
    srv = Server(binary, [tiny], ["--ctx-size", "24"])
    try:
        model = os.path.basename(tiny)
        status, data = srv.raw("POST", "/v1/completions",
                               body=json.dumps({"model": model, "prompt": "word " * 40}).encode(),
                               headers={"Content-Type": "application/json"})
        err = json.loads(data).get("error", {})
        check(status == 400 and err.get("code") == "context_length_exceeded"
              and "24" in err.get("message", ""), f"long prompt: {status} {data[:300]!r}")
        r = complete(srv, model)
        total = r.usage.prompt_tokens + r.usage.completion_tokens
        check(r.choices[0].finish_reason == "length" and total == 24,
              f"full context: {r.choices[0].finish_reason}, {r.usage}")
        print(f"context: a 40-word prompt is a 400 ({err['message']!r}); without max_tokens the "
              f"answer ends with length at {total} = the 24-token context")
    finally:
        srv.stop()


def batched(srv, tiny):
    prompts = [f"{PROMPT} {i}" for i in range(16)]
    alone = [complete(srv, tiny, prompt=p, max_tokens=16).choices[0].text for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(
            lambda p: complete(srv, tiny, prompt=p, max_tokens=16).choices[0].text, prompts))
    same = sum(a == b for a, b in zip(alone, together))
    check(same == len(prompts), f"{len(prompts) - same} of {len(prompts)} batched texts differ")
    print(f"batched: 16 concurrent greedy completions equal each run alone")


def metrics(srv):
    status, data = srv.raw("GET", "/metrics")
    text = data.decode()
    check(status == 200, f"/metrics: {status}")
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    for name in ["burn_gguf_sequences_running", "burn_gguf_sequences_waiting",
                 "burn_gguf_generated_tokens_total", "burn_gguf_prompt_tokens_total",
                 "burn_gguf_decode_tokens_per_second", "burn_gguf_prompt_tokens_per_second",
                 "burn_gguf_time_to_first_token_seconds_count"]:
        check(name in values, f"/metrics lacks {name}:\n{text}")
    check(values["burn_gguf_generated_tokens_total"] > 0
          and values["burn_gguf_time_to_first_token_seconds_count"] > 0
          and values["burn_gguf_sequences_running"] == 0, f"/metrics values: {values}")
    print(f"metrics: {int(values['burn_gguf_generated_tokens_total'])} tokens generated, "
          f"decode {values['burn_gguf_decode_tokens_per_second']:.0f} tokens/s, "
          f"{int(values['burn_gguf_time_to_first_token_seconds_count'])} first tokens timed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--gemma", required=True)
    a = ap.parse_args()
    tiny, gemma = os.path.basename(a.tiny), os.path.basename(a.gemma)
    srv = Server(a.bin, [a.tiny, a.gemma], ["--max-concurrent", "16"])
    try:
        finish_reasons(srv, tiny)
        usage_chunk(srv, tiny)
        stops(srv, tiny)
        utf8(srv, gemma)
        end_of_generation(srv, tiny)
        logprobs(srv, tiny)
        batched(srv, tiny)
        metrics(srv)
    finally:
        srv.stop()
    context(a.bin, a.tiny)
    print("conformance_test: all checks passed")


if __name__ == "__main__":
    main()
