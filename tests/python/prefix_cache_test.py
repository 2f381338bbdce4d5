#!/usr/bin/env python3
"""The prefix cache of `burn-gguf serve` (issue 39): requests that share a long system prompt,
or continue a conversation, start after the prefix a slot's cache holds, and give the same
greedy text as a server with `--no-prefix-cache`; `/metrics` counts the hits.

    python3 tests/python/prefix_cache_test.py --bin target/debug/burn-gguf \
        --tiny ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf [--gemma PATH]

1. 6 requests one after another, each a shared system prompt (about 800 tokens on the tiny
   fixture, 120 on Gemma) and its own user turn: texts equal the cache-less server's; hits and
   reused tokens in /metrics (none on the cache-less server).
2. A conversation: the second turn's prompt holds the first turn and its reply; equal texts.
3. 8 concurrent requests sharing the prompt: equal texts.
4. The prefix store (`--cache-memory`): one slot, three conversations taken in turn; each
   second turn starts from its first turn's stored state (store hits; none with
   `--cache-memory 0`), a store with room for about two evicts the least recently used, and
   the texts equal the cache-less server's. Also on a recurrent model (`--recurrent`, tiny
   Qwen3.5), whose stored states resume at the end of a prompt.
5. The paged KV cache (`--kv-size`): 4 slots sharing 256 positions (4 blocks of 64), 6
   concurrent requests that may each reach 2 blocks (all at once would need 12): each waits
   until the cache can hold it, none fails, and the texts equal those of one request at a
   time on a server with the default cache; a request past the 256 positions is a 400.
"""
import argparse
import concurrent.futures
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Server, check  # noqa: E402

PARAGRAPH = ("The archive holds letters, maps and ledgers from the harbour's first century: "
             "shipping records, weather notes, the names of captains and what they carried. ")
QUESTIONS = ["What does the archive hold?", "Name one kind of record.", "Who is named in it?",
             "Summarise it in five words.", "Is weather mentioned?", "What century is it?",
             "What did captains carry?", "Give it a title."]


def metric(srv, name):
    status, data = srv.raw("GET", "/metrics")
    check(status == 200, f"/metrics: {status}")
    m = re.search(rf"^burn_gguf_{name}_total (\S+)$", data.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def gauge(srv, name):
    status, data = srv.raw("GET", "/metrics")
    check(status == 200, f"/metrics: {status}")
    m = re.search(rf"^burn_gguf_{name} (\S+)$", data.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def ask(srv, model, system, question, history=()):
    msgs = [{"role": "system", "content": system}, *history,
            {"role": "user", "content": question}]
    r = srv.client.chat.completions.create(model=model, messages=msgs, temperature=0,
                                           max_tokens=12)
    return r.choices[0].message.content, r.usage.prompt_tokens


def run(srv, model, system):
    texts = [ask(srv, model, system, q)[0] for q in QUESTIONS[:6]]
    first, _ = ask(srv, model, system, "Hello.")
    history = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": first}]
    second, _ = ask(srv, model, system, "And then?", history)
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda q: ask(srv, model, system, q)[0], QUESTIONS))
    return texts, second, together


def store_round(srv, model, systems):
    """Three conversations in turn on one slot: each system prompt and a first question, then
    each conversation's second turn (its history holds the first turn and its reply)."""
    first = [ask(srv, model, s, QUESTIONS[0])[0] for s in systems]
    second = [ask(srv, model, s, "And then?", [{"role": "user", "content": QUESTIONS[0]},
                                              {"role": "assistant", "content": reply}])[0]
              for s, reply in zip(systems, first)]
    return first + second


def check_store(a, path):
    """Part 4 on the model at `path`: one slot, three conversations in turn, with the store
    (default size), with a store that holds two of them, with none, and without any cache."""
    model = os.path.basename(path)
    systems = [f"Archive {name}. " + PARAGRAPH * 6 for name in ("North", "Quay", "Lighthouse")]
    runs = {}
    small = None
    for label in ("store", "small", "slots only", "off"):
        extra = {"store": [], "small": ["--cache-memory", str(small)],
                 "slots only": ["--cache-memory", "0"], "off": ["--no-prefix-cache"]}[label]
        srv = Server(a.bin, [path], ["--max-concurrent", "1"] + extra)
        try:
            runs[label] = store_round(srv, model, systems)
            hits = metric(srv, "prefix_store_hits")
            evictions = metric(srv, "prefix_store_evictions")
            entries, size = gauge(srv, "prefix_store_entries"), gauge(srv, "prefix_store_bytes")
            print(f"prefix_cache_test: {model}: {label}: {hits:.0f} store hits, {evictions:.0f} "
                  f"evictions, {entries:.0f} entries of {size / 1024:.0f} KiB")
            if label == "store":
                # Each second turn starts after its first turn, stored when the slot moved on.
                check(hits >= 3, f"{model}: the second turns missed the store: {hits} hits")
                check(entries >= 3 and size > 0, f"{model}: {entries} entries, {size} bytes")
                # Room for about two first turns (MiB, rounded up).
                small = max(1, -(-int(2.5 * size / entries) // (1 << 20)))
            elif label == "small":
                check(size <= small << 20, f"{model}: {size} bytes in a {small} MiB store")
                check(evictions >= 1, f"{model}: no eviction from a {small} MiB store")
            else:
                check(hits == 0 and entries == 0, f"{model}: {label}: {hits} hits, {entries} entries")
        finally:
            srv.stop()
    for label in ("store", "small", "slots only"):
        check(runs[label] == runs["off"],
              f"{model}: texts with {label} differ:\n{runs[label]}\n{runs['off']}")
    print(f"prefix_cache_test: {model}: prefix store: greedy texts equal to the cache-less run")


def check_paged(a, path):
    """Part 5 on the model at `path`."""
    model = os.path.basename(path)
    prompts = [f"Entry {i}: letters, maps and ledgers." for i in range(6)]

    def complete(srv, prompt, max_tokens):
        r = srv.client.completions.create(model=model, prompt=prompt, temperature=0,
                                          max_tokens=max_tokens)
        return r.choices[0].text, r.usage.prompt_tokens

    srv = Server(a.bin, [path], ["--max-concurrent", "1"])
    try:
        lens = [complete(srv, p, 1)[1] for p in prompts]
        check(max(lens) < 50, f"{model}: prompts of {lens} tokens")
        # Each request may reach position 100: a second block of 64.
        budgets = [100 - n for n in lens]
        alone = [complete(srv, p, m) for p, m in zip(prompts, budgets)]
    finally:
        srv.stop()
    srv = Server(a.bin, [path], ["--max-concurrent", "4", "--kv-size", "256"])
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            together = list(ex.map(lambda pm: complete(srv, *pm), zip(prompts, budgets)))
        try:
            srv.client.completions.create(model=model, prompt=prompts[0], max_tokens=250)
            check(False, f"{model}: a request past --kv-size 256 was accepted")
        except Exception as e:  # openai.BadRequestError
            check(getattr(e, "status_code", None) == 400, f"{model}: past the cache: {e!r}")
        srv.health()
    finally:
        srv.stop()
    check(together == alone, f"{model}: texts with a shared 256-position cache differ:\n"
          f"{together}\n{alone}")
    print(f"prefix_cache_test: {model}: paged KV cache of 256 positions: 6 concurrent "
          "requests waited for blocks, texts equal one at a time; past it, 400")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--gemma")
    ap.add_argument("--recurrent", help="a model with recurrent layers for part 4")
    a = ap.parse_args()
    for path in [a.tiny] + ([a.recurrent] if a.recurrent else []):
        check_store(a, path)
        check_paged(a, path)
    cases = [(a.tiny, PARAGRAPH * 8)] + ([(a.gemma, PARAGRAPH * 4)] if a.gemma else [])
    models = [c[0] for c in cases]
    results = {}
    for cache in (True, False):
        extra = ["--max-concurrent", "8"] + ([] if cache else ["--no-prefix-cache"])
        srv = Server(a.bin, models, extra)
        try:
            for path, system in cases:
                model = os.path.basename(path)
                results[(model, cache)] = run(srv, model, system)
                _, prompt_tokens = ask(srv, model, system, QUESTIONS[0])
                print(f"prefix_cache_test: {model}: shared prompt of about {prompt_tokens} "
                      f"tokens, cache {'on' if cache else 'off'}")
            hits, reused = metric(srv, "prefix_cache_hits"), metric(srv, "prefix_cache_reused_tokens")
            print(f"prefix_cache_test: cache {'on' if cache else 'off'}: {hits:.0f} hits, "
                  f"{reused:.0f} reused tokens")
            if cache:
                check(hits >= 5 * len(cases) and reused >= 5 * 100 * len(cases),
                      f"too few hits with the cache: {hits} hits, {reused} tokens")
            else:
                check(hits == 0 and reused == 0, f"hits with --no-prefix-cache: {hits}")
        finally:
            srv.stop()
    for path, _ in cases:
        model = os.path.basename(path)
        on, off = results[(model, True)], results[(model, False)]
        check(on[0] == off[0], f"{model}: sequential texts differ:\n{on[0]}\n{off[0]}")
        check(on[1] == off[1], f"{model}: the second turn differs: {on[1]!r} {off[1]!r}")
        check(on[2] == off[2], f"{model}: concurrent texts differ:\n{on[2]}\n{off[2]}")
        print(f"prefix_cache_test: {model}: greedy texts equal with and without the cache")
    print("prefix_cache_test: all checks passed")


if __name__ == "__main__":
    main()
