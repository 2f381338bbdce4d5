#!/usr/bin/env python3
"""Round trip of a LoRA adapter between burn-gguf and llama.cpp (issue 37).

1. `burn-gguf finetune` trains an adapter on TEXT over MODEL and writes it (llama.cpp's format).
2. `burn-gguf run --lora` continues the text's first eight words greedily; the share of the
   text's next 32 tokens it reproduces is printed.
3. llama.cpp (the `llama-cpp-python` binding, built from its sdist: vendor/llama.cpp) loads the
   same model and adapter: its logits over the prompt are compared with burn-gguf's
   (`run --dump-logits`), and its greedy continuation is scored the same way.

    python3 tools/lora_llama_cpp.py --bin BURN_GGUF --model MODEL.gguf --text TEXT.txt \
        [--steps 400] [--lr 3e-3] [--out DIR]

Prints one JSON object with the figures; exits 1 when a check fails (logits past 1e-3 on an
F32 model, or a continuation under 90%).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def run(cmd):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def share(got, want):
    """Share of `want`'s tokens that `got` reproduces, position by position."""
    n = len(want)
    return sum(1 for a, b in zip(got, want) if a == b) / n if n else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", default="3e-3")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()

    from llama_cpp import Llama

    out = args.out or tempfile.mkdtemp()
    adapter = os.path.join(out, "a.gguf")
    t = run([args.bin, "finetune", "-m", args.model, "--data", args.text, "--out", adapter,
             "--steps", str(args.steps), "--lr", args.lr])
    text = open(args.text, encoding="utf-8").read()
    prompt = " ".join(text.split()[:8])

    # The text's tokens after the prompt, as the model's tokenizer gives them.
    llm = Llama(model_path=args.model, lora_path=adapter, n_ctx=512, logits_all=True,
                verbose=False, seed=0)
    base = Llama(model_path=args.model, n_ctx=512, logits_all=True, verbose=False, seed=0)
    full = llm.tokenize(text.encode(), add_bos=True)
    head = llm.tokenize(prompt.encode(), add_bos=True)
    if full[: len(head)] != head:
        raise SystemExit("the prompt's tokens are not a prefix of the text's")
    want = full[len(head): len(head) + 32]

    # burn-gguf: greedy continuation and the prompt's logits with the adapter.
    logits_path = os.path.join(out, "logits.f32")
    ours = json.loads(run([args.bin, "run", "-m", args.model, "--lora", adapter, "-p", prompt,
                           "-n", "32", "--temp", "0", "--json", "--dump-logits", logits_path]))
    if ours["prompt_ids"] != head:
        raise SystemExit(f"prompt ids differ: {ours['prompt_ids']} vs llama.cpp {head}")
    vocab = llm.n_vocab()
    our_logits = np.fromfile(logits_path, dtype="<f4").reshape(len(head), vocab)

    # llama.cpp with the adapter: logits over the prompt, then greedy continuation.
    llm.reset()
    llm.eval(head)
    ref_logits = np.array(llm.scores[: len(head)], dtype=np.float32)
    diff = float(np.abs(ref_logits - our_logits).max())
    # Without the adapter, for scale: how far the adapter moves llama.cpp's logits.
    base.eval(head)
    moved = float(np.abs(np.array(base.scores[: len(head)]) - ref_logits).max())
    gen = []
    for tok in llm.generate(head, temp=0.0, top_k=1, top_p=1.0, reset=True):
        gen.append(tok)
        if len(gen) == 32:
            break
    result = {
        "prompt": prompt,
        "prompt_tokens": len(head),
        "finetune_tail": t.strip().splitlines()[-1:] if t else [],
        "ours_reproduces": share(ours["generated_ids"], want),
        "llama_cpp_reproduces": share(gen, want),
        "ours_equals_llama_cpp_tokens": share(ours["generated_ids"], gen),
        "max_logit_diff": diff,
        "adapter_moves_logits_by": moved,
    }
    print(json.dumps(result, indent=2))
    ok = result["ours_reproduces"] >= 0.9 and result["llama_cpp_reproduces"] >= 0.9
    if "F32" in os.path.basename(args.model):
        ok = ok and diff <= args.tol
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
