#!/usr/bin/env python3
"""Speculative decoding in `burn-gguf serve --spec ngram` (issue 40): greedy replies with drafts
equal those without (`speculative.n_max: 0` on the same server), alone, streamed, and 8 at once
in the continuous batch, on a model with attention layers only and on one with recurrent
(delta-net) layers, and on Gemma 3 270M with `--gemma`; /metrics counts drafted and accepted
tokens; a bad `speculative.n_max` is a 400 naming it. Then the CLI: `run --spec ngram`,
`run --draft-model` and `chat --spec ngram` print what they print without speculation.

    python3 tests/python/speculative_test.py --bin target/debug/burn-gguf \
        --model ../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf \
        --model ../shared/fixtures/arch/tiny-qwen35-Q8_0.gguf [--gemma PATH]
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_test import Server, check  # noqa: E402

# Prompts whose continuations repeat what came before, so that lookups find drafts.
PROMPTS = [
    "one two three four five six seven. one two three four five six seven. one two",
    "red green blue, red green blue, red green blue, red",
    "The cat sat on the mat. The dog sat on the log. The cat sat on",
    "a b c d e f g h i j k l m n o p a b c d e f",
    "Once upon a time",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,",
    "alpha beta gamma delta alpha beta gamma delta alpha",
    "The quick brown fox",
]


def metric(srv, name):
    status, data = srv.raw("GET", "/metrics")
    check(status == 200, f"/metrics: {status}")
    m = re.search(rf"^burn_gguf_{name}_total (\S+)$", data.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def complete(srv, model, prompt, max_tokens, n_max=None, temperature=0.0, seed=None):
    extra = {} if n_max is None else {"speculative.n_max": n_max}
    r = srv.client.completions.create(model=model, prompt=prompt, temperature=temperature,
                                      max_tokens=max_tokens, seed=seed, extra_body=extra)
    return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason


def streamed(srv, model, prompt, max_tokens):
    stream = srv.client.completions.create(model=model, prompt=prompt, temperature=0,
                                           max_tokens=max_tokens, stream=True)
    return "".join(c.choices[0].text for c in stream if c.choices)


def checks(srv, model):
    plain = {p: complete(srv, model, p, 24, n_max=0) for p in PROMPTS}
    before = metric(srv, "speculative_drafted_tokens")
    for p in PROMPTS:
        got = complete(srv, model, p, 24)
        check(got == plain[p], f"{model}: {p!r}: with drafts {got!r}, without {plain[p]!r}")
        check(streamed(srv, model, p, 24) == plain[p][0], f"{model}: {p!r}: streamed text differs")
    drafted = metric(srv, "speculative_drafted_tokens") - before
    check(drafted > 0, f"{model}: no token was drafted")
    # Budgets that end inside a draft, and a draft bound of 1.
    for max_tokens in (1, 2, 5):
        for n_max in (None, 1):
            got = complete(srv, model, PROMPTS[0], max_tokens, n_max=n_max)
            want = complete(srv, model, PROMPTS[0], max_tokens, n_max=0)
            check(got == want, f"{model}: max_tokens {max_tokens}, n_max {n_max}: {got} {want}")
    # 8 at once: each sequence's drafts join the batched pass.
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda p: complete(srv, model, p, 24), PROMPTS))
    for p, got in zip(PROMPTS, together):
        check(got == plain[p], f"{model}: {p!r} in a batch: {got!r} against {plain[p]!r}")
    # Sampling with drafts: replies of the asked length (the distribution is tested in
    # tests/tests/speculative.rs).
    for seed in range(4):
        text, tokens, finish = complete(srv, model, PROMPTS[0], 16, temperature=1.0, seed=seed)
        check(tokens <= 16 and (tokens == 16 or finish == "stop"),
              f"{model}: sampled reply of {tokens} tokens, finish {finish}")
    print(f"speculative_test: {model}: greedy replies equal with and without drafts "
          f"({drafted:.0f} tokens drafted)")


def bad_values(srv, model):
    for value in (-1, 64, "7", 1.5):
        body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 2,
                           "speculative.n_max": value})
        status, data = srv.raw("POST", "/v1/completions", body,
                               {"Content-Type": "application/json"})
        check(status == 400, f"speculative.n_max {value!r}: status {status}")
        err = json.loads(data)["error"]
        check(err.get("param") == "speculative.n_max", f"speculative.n_max {value!r}: {err}")
    check(srv.health()["status"] == "ok", "the server is not healthy after bad requests")


def gemma_checks(srv, model):
    for p in ("Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons.\n"
              "apples, pears, plums,", PROMPTS[2]):
        want = complete(srv, model, p, 24, n_max=0)
        got = complete(srv, model, p, 24)
        check(got == want, f"{model}: {p!r}: with drafts {got!r}, without {want!r}")
    print(f"speculative_test: {model}: greedy replies equal with and without drafts")


def cli(binary, *args, stdin=None):
    r = subprocess.run([binary, *args], input=stdin, capture_output=True, text=True,
                       timeout=900)
    check(r.returncode == 0, f"{args}: exit {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout, r.stderr


def cli_checks(binary, tiny, fixtures):
    run = ["run", "-m", tiny, "-p", PROMPTS[0], "-n", "24", "--temp", "0", "--json"]
    plain = json.loads(cli(binary, *run)[0])
    spec = json.loads(cli(binary, *run, "--spec", "ngram")[0])
    check(spec["generated_ids"] == plain["generated_ids"], f"run --spec ngram: {spec} {plain}")
    check(spec["speculation"]["verify_passes"] > 0, f"run --spec ngram drafted nothing: {spec}")
    target = os.path.join(fixtures, "tiny-qwen3-f16.gguf")
    draft = os.path.join(fixtures, "tiny-qwen3-Q4_0.gguf")
    run = ["run", "-m", target, "-p", PROMPTS[0], "-n", "24", "--temp", "0", "--json"]
    plain = json.loads(cli(binary, *run)[0])
    spec = json.loads(cli(binary, *run, "--draft-model", draft)[0])
    check(spec["generated_ids"] == plain["generated_ids"], f"run --draft-model: {spec} {plain}")
    check(spec["speculation"]["accepted"] > 0, f"run --draft-model: nothing accepted: {spec}")
    lines = f"{PROMPTS[0]}\n{PROMPTS[2]}\n"
    chat = ["chat", "-m", tiny, "-n", "24", "--temp", "0"]
    plain, _ = cli(binary, *chat, stdin=lines)
    spec, err = cli(binary, *chat, "--spec", "ngram", stdin=lines)
    check(spec == plain, f"chat --spec ngram: {spec!r} against {plain!r}")
    check("drafted" in err, f"chat --spec ngram printed no speculation counts: {err}")
    print("speculative_test: run --spec ngram, run --draft-model and chat --spec ngram print "
          "what they print without speculation")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--gemma")
    a = ap.parse_args()
    models = a.model + ([a.gemma] if a.gemma else [])
    srv = Server(a.bin, models, ["--spec", "ngram", "--max-concurrent", "8"])
    try:
        for path in a.model:
            checks(srv, os.path.basename(path))
        if a.gemma:
            gemma_checks(srv, os.path.basename(a.gemma))
        bad_values(srv, os.path.basename(a.model[0]))
        accepted = metric(srv, "speculative_accepted_tokens")
        check(accepted > 0, "no drafted token was accepted")
        print(f"speculative_test: {accepted:.0f} drafted tokens accepted in all")
    finally:
        srv.stop()
    cli_checks(a.bin, a.model[0], os.path.dirname(os.path.abspath(a.model[0])))
    print("speculative_test: all checks passed")


if __name__ == "__main__":
    main()
