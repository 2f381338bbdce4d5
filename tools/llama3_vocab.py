#!/usr/bin/env python3
"""Writes a vocabulary-only GGUF with the real Llama 3 tokenizer, as llama.cpp's converter does.

Source: Meta's tiktoken `tokenizer.model` (base64 token, rank per line; 128,000 tokens) as
PyPI `llama-models` ships it (`llama_models/llama3/tokenizer.model`), plus the 256 special
tokens of `llama_models/llama3/tokenizer.py`. The GGUF vocabulary is what
`convert_hf_to_gguf.py` writes for a Llama 3 model: `tokenizer.ggml.model` `gpt2`,
`tokenizer.ggml.pre` `llama-bpe`, the tokens as GPT-2 byte-to-unicode strings, token types
(1 normal, 3 control), and the merges recovered from the ranks the way transformers'
`TikTokenConverter` does (for each token, every split into two tokens, ordered by the parts'
ranks; all merges ordered by the merged token's rank).

tests/src/lib.rs `llama3_vocab_gguf` builds the same vocabulary in Rust for the tests; this
script is how the reference ids in tests/tests/tokenizer.rs were made:

    cargo xtask fetch-model llama3-tokenizer            # prints TOKENIZER_MODEL's path
    python3 tools/llama3_vocab.py TOKENIZER_MODEL /tmp/llama3-vocab.gguf
    scripts/build-llama-bench.sh                        # llama-tokenize beside llama-bench
    llama-tokenize -m /tmp/llama3-vocab.gguf -f TEXT --no-escape --ids [--no-bos]

Needs gguf-py (`pip install gguf`).

Usage: llama3_vocab.py TOKENIZER_MODEL OUT.gguf
"""
import base64
import sys

import gguf


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    model, out = sys.argv[1], sys.argv[2]
    ranks = {}
    with open(model, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    enc = bytes_to_unicode()
    to_str = lambda b: "".join(enc[x] for x in b)
    merges = []
    for tok, rank in ranks.items():
        if len(tok) == 1:
            continue
        local = []
        for i in range(1, len(tok)):
            l, r = tok[:i], tok[i:]
            if l in ranks and r in ranks:
                local.append((l, r, rank))
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    merges = [f"{to_str(l)} {to_str(r)}" for l, r, _ in merges]

    n_base = len(ranks)
    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|step_id|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    specials += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(specials))]
    tokens = [None] * n_base
    for tok, rank in ranks.items():
        tokens[rank] = to_str(tok)
    tokens += specials
    types = [1] * n_base + [3] * len(specials)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("llama3-vocab")
    w.add_context_length(8192)
    w.add_embedding_length(4096)
    w.add_block_count(1)
    w.add_feed_forward_length(14336)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(n_base)  # <|begin_of_text|>
    w.add_eos_token_id(n_base + 9)  # <|eot_id|>, as in the instruct models' GGUFs
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out}: {len(tokens)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
