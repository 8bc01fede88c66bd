#!/usr/bin/env python3
"""Golden data for the sampler's decoder (src/sample.c sample_vocab_decode), from Hugging Face
`tokenizers`: what transformers' decode(ids, skip_special_tokens=True) prints.

Writes to <out> (default tests/golden/decode):
  bytes.json    a small Llama-style tokenizer.json: Metaspace pieces, specials, byte pieces
                "<0xHH>" (upper and lower case hex) and a decoder Replace(U+2581 -> ' ') +
                ByteFallback + Fuse, as CodeLlama's (without its Strip step)
  literal.json  the same vocabulary with a decoder lacking ByteFallback: "<0xHH>" stays text
  cases.json    [{"tokenizer", "ids", "text", "strips_leading_space"}]: hand-picked sequences
                (valid and invalid UTF-8 byte runs, a special token inside a run, unknown
                ids), 200 seeded random ones per tokenizer, and the first 40 tokens of 20
                games of data/chess/val_000.bin decoded with the bundled data/model/tokenizer.json (whose Metaspace decoder strips one
                leading space: the C side keeps it, the test strips it there)

Usage: python tests/oracle/gen_decode_golden.py [--out tests/golden/decode]
Seeded: a rerun with the same tokenizers version writes the same bytes. The byte 0x00 is left
out of the vocabulary (the C decoder returns a NUL-terminated string).
"""
import argparse
import json
import os
import random
import sys

import tokenizers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from token_shard import shard_docs  # noqa: E402  (the one FTTOKSHD reader)
SPECIAL = ["<unk>", "<s>", "</s>"]
PIECES = ["\u2581e4", "e5", "\u2581", "\u2581Nf3", "x", "\u2581\u2581", "caf", "<0x0"]   # last: not a byte piece
BYTES = ["<0xC3>", "<0xA9>", "<0xE2>", "<0x82>", "<0xAC>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>",
         "<0x0A>", "<0x41>", "<0xED>", "<0xA0>", "<0xC0>", "<0xF4>", "<0x90>", "<0xFF>", "<0xe9>", "<0xc3>"]


def tokenizer_json(byte_fallback_decoder):
    vocab = {p: i for i, p in enumerate(SPECIAL + PIECES + BYTES)}
    decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}]
    if byte_fallback_decoder:
        decoders.append({"type": "ByteFallback"})
    decoders.append({"type": "Fuse"})
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in enumerate(SPECIAL)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "decode"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ids_of = {p: i for i, p in enumerate(SPECIAL + PIECES + BYTES)}
    hand = [[1, ids_of["\u2581e4"], ids_of["e5"]],
            [ids_of[p] for p in ["\u2581e4", "<0xC3>", "<0xA9>", "e5"]],            # é
            [ids_of[p] for p in ["caf", "<0xc3>", "<0xA9>"]],                       # lower-case hex
            [ids_of[p] for p in ["<0xE2>", "<0x82>", "<0xAC>", "<0x0A>", "<0x41>"]],  # €, newline, A
            [ids_of[p] for p in ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]],          # a 4-byte character
            [ids_of[p] for p in ["\u2581e4", "<0xE2>", "e5"]],                      # a cut sequence
            [ids_of[p] for p in ["<0xC3>", "<0xA9>", "<0xC3>"]],                    # a run invalid as a whole
            [ids_of["<0xC3>"], 2, ids_of["<0xA9>"]],                                # a special inside a run
            [ids_of[p] for p in ["<0xED>", "<0xA0>", "<0x80>"]],                    # a surrogate
            [ids_of[p] for p in ["<0xC0>", "<0x80>"]],                              # overlong
            [ids_of[p] for p in ["<0xF4>", "<0x90>", "<0x80>", "<0x80>"]],          # above U+10FFFF
            [ids_of["<0xFF>"], ids_of["<0x0"]],
            [ids_of["\u2581e4"], 999, -1, ids_of["e5"]],                            # ids outside the vocab
            []]
    rng = random.Random(1234)
    n_vocab = len(ids_of)
    cases = []
    for name, bf in (("bytes.json", True), ("literal.json", False)):
        tj = tokenizer_json(bf)
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(tj, f, indent=1, ensure_ascii=False)
            f.write("\n")
        tok = tokenizers.Tokenizer.from_str(json.dumps(tj))
        seqs = hand + [[rng.randrange(n_vocab) for _ in range(rng.randrange(1, 13))] for _ in range(200)]
        for ids in seqs:
            ok = [i for i in ids if 0 <= i < n_vocab]   # tokenizers refuses unknown ids; decode drops them
            cases.append({"tokenizer": name, "ids": ids, "text": tok.decode(ok, skip_special_tokens=True),
                          "strips_leading_space": False})
    bundled = os.path.join(ROOT, "data", "model", "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(bundled)
    for doc in shard_docs(os.path.join(ROOT, "data", "chess", "val_000.bin"))[:20]:   # what --sample_games decodes
        ids = [int(i) for i in doc[:40]]
        cases.append({"tokenizer": "../../../data/model/tokenizer.json", "ids": ids,
                      "text": tok.decode(ids, skip_special_tokens=True), "strips_leading_space": True})
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump({"generator": "tests/oracle/gen_decode_golden.py", "tokenizers": tokenizers.__version__,
                   "cases": cases}, f, indent=0, ensure_ascii=True)
        f.write("\n")
    print(f"{args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
