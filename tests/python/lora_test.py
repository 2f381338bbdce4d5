#!/usr/bin/env python3
"""LoRA adapters end to end (issue 37), driven by the official `openai` client.

    python3 tests/python/lora_test.py --bin target/debug/burn-gguf \
        --model ../shared/fixtures/arch/tiny-llama-Q8_0.gguf --text data/short-text.txt

1. `burn-gguf finetune` trains an adapter on the text (60 steps) and writes it.
2. `burn-gguf run --lora` continues the text's first eight words greedily: the adapter must
   change the continuation, and it must equal the text's own next tokens for the most part.
3. `burn-gguf serve --lora`: GET /lora-adapters lists the file; a greedy completion with the
   default adapters equals `run --lora`, with `"lora": []` equals `run` without it, and with
   `"lora": [{"id": 0, "scale": 0}]` too; an unknown id, a repeated id and a non-finite scale
   are 400s naming `lora`; an adapter for another architecture stops the server at start with
   a message naming the file.
Exits non-zero on the first failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from serve_test import Server, check, fail  # noqa: E402


def run_json(binary, model, prompt, n, lora=None):
    cmd = [binary, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--json"]
    if lora:
        cmd += ["--lora", lora]
    out = subprocess.run(cmd, capture_output=True, text=True)
    check(out.returncode == 0, f"{' '.join(cmd)} failed: {out.stderr}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--other-arch", default="../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    adapter = os.path.join(tmp, "a.gguf")

    out = subprocess.run([args.bin, "finetune", "-m", args.model, "--data", args.text,
                          "--out", adapter, "--steps", "60", "--lr", "3e-3"],
                         capture_output=True, text=True)
    check(out.returncode == 0, f"finetune failed: {out.stderr}")
    check("error:" not in out.stderr, f"finetune printed an error: {out.stderr}")
    print("lora_test: finetune:", out.stderr.strip().splitlines()[-1])

    text = open(args.text, encoding="utf-8").read()
    prompt = " ".join(text.split()[:8])
    n = 16
    base = run_json(args.bin, args.model, prompt, n)
    tuned = run_json(args.bin, args.model, prompt, n, adapter)
    check(base["generated_ids"] != tuned["generated_ids"], "the adapter changed nothing")
    rest = text[len(prompt):]
    check(rest.startswith(tuned["text"][:20]),
          f"the tuned model does not continue the text: {tuned['text']!r}")
    print(f"lora_test: run --lora continues the text: {tuned['text']!r}")

    srv = Server(args.bin, [args.model], ["--lora", adapter])
    try:
        status, body = srv.raw("GET", "/lora-adapters")
        listed = json.loads(body)
        check(status == 200 and len(listed) == 1 and listed[0]["id"] == 0
              and listed[0]["path"] == adapter, f"/lora-adapters: {status} {body!r}")
        model_id = srv.client.models.list().data[0].id

        def complete(lora):
            extra = {} if lora is None else {"lora": lora}
            r = srv.client.completions.create(model=model_id, prompt=prompt, max_tokens=n,
                                              temperature=0, extra_body=extra)
            return r.choices[0].text

        check(complete(None) == tuned["text"], "serve's default adapters differ from run --lora")
        check(complete([]) == base["text"], "serve with lora [] differs from run")
        check(complete([{"id": 0, "scale": 0}]) == base["text"], "scale 0 differs from run")
        check(complete([{"id": 0, "scale": 1}]) == tuned["text"], "scale 1 differs from run --lora")
        for bad in ([{"id": 3, "scale": 1}], [{"id": 0, "scale": 1}, {"id": 0, "scale": 2}]):
            body = json.dumps({"model": model_id, "prompt": prompt, "max_tokens": 2,
                               "lora": bad})
            status, data = srv.raw("POST", "/v1/completions", body,
                                   {"Content-Type": "application/json"})
            check(status == 400, f"lora {bad!r}: status {status}")
            err = json.loads(data)["error"]
            check("lora" in (err.get("param") or "") + err["message"],
                  f"lora {bad!r}: error does not name lora: {err}")
        status, body = srv.raw("POST", "/v1/completions",
                               '{"model": "%s", "prompt": "x", "max_tokens": 1, '
                               '"lora": [{"id": 0, "scale": 1e999}]}' % model_id,
                               {"Content-Type": "application/json"})
        check(status == 400, f"non-finite scale: {status} {body!r}")
    finally:
        srv.proc.terminate()
        srv.proc.wait(timeout=60)

    # An adapter for another architecture: the server refuses to start, naming the file.
    p = subprocess.run([args.bin, "serve", "--port", "0", "-m", args.other_arch, "--lora",
                        adapter], capture_output=True, text=True, timeout=300)
    check(p.returncode != 0 and adapter in p.stderr and "general.architecture" in p.stderr,
          f"serve with a llama adapter on qwen3: {p.returncode} {p.stderr[-400:]}")
    print("lora_test: 1 passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        fail(repr(e))
