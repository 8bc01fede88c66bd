#!/usr/bin/env python3
"""Train a small chess-move BPE tokenizer with Hugging Face `tokenizers`.

Run with a Python that has `tokenizers` and `transformers` (e.g. /opt/oracle-venv/bin/python).

Design:
  * No normalizer, no byte-level: the alphabet is just the characters of UCI moves and
    results (a-h 1-8 q r b n 0 - /).
  * Metaspace pre-tokenizer (SentencePiece/Llama style): the text is split at spaces and
    every word gets a leading "\u2581", so a token never spans two moves, a whole move is
    one token like "\u2581e2e4", and the Metaspace decoder gives decode(encode(text)) == text
    exactly. With the default vocabulary (2048) 99.99% of the moves in the corpus are single
    tokens (1878 of 1938 distinct moves); rare moves fall back to pieces ("\u2581e7", "e8n"),
    never to <unk>.
    (A "##" continuing-subword prefix was avoided on purpose: tokenizers' BpeTrainer assigns
    the "##x" ids in hash-map order, which makes training non-deterministic; with a plain
    alphabet the result is identical on every run.)
  * Special tokens (ids 0..3, Llama order): <unk>, <s> (BOS), </s> (EOS), <pad>.
    No post-processor: the shard writer adds BOS/EOS itself.
  * Trained on the TRAIN split only (validation games excluded).

Writes <out>/tokenizer.json, tokenizer_config.json, special_tokens_map.json, loadable with
transformers.AutoTokenizer.from_pretrained(<out>) (PreTrainedTokenizerFast).

Example:
  /opt/oracle-venv/bin/python scripts/train_tokenizer.py --games data/chess/games.jsonl.xz \
      --out data/model --vocab_size 2048
"""
import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chess_corpus import split_texts  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
META = "\u2581"
ALPHABET = list("abcdefgh12345678qrbn0-/") + [META]


def build(texts, vocab_size):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement=META, prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=SPECIALS, initial_alphabet=ALPHABET,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def stats(tok, texts):
    n_tok = n_moves = n_single = 0
    move_vocab = set()
    for t in texts:
        n_tok += len(tok.encode(t).ids)
        for w in t.split(" "):
            n_moves += 1
            move_vocab.add(w)
    single = {w for w in move_vocab if len(tok.encode(w).ids) == 1}
    for t in texts:
        n_single += sum(w in single for w in t.split(" "))
    return {"docs": len(texts),
            "avg_tokens_per_game": round(n_tok / len(texts), 2),   # without BOS/EOS
            "avg_words_per_game": round(n_moves / len(texts), 2),  # plies + 1 result word
            "frac_words_single_token": round(n_single / n_moves, 5),
            "distinct_words": len(move_vocab),
            "distinct_words_single_token": len(single)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--games", default="data/chess/games.jsonl.xz")
    ap.add_argument("--out", default="data/model")
    ap.add_argument("--vocab_size", type=int, default=2048)
    ap.add_argument("--model_max_length", type=int, default=512)
    args = ap.parse_args()

    sp = split_texts(args.games)
    tok = build(sp["train"], args.vocab_size)

    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>", pad_token="<pad>",
                                 model_max_length=args.model_max_length,
                                 clean_up_tokenization_spaces=False)
    os.makedirs(args.out, exist_ok=True)
    hf.save_pretrained(args.out)
    # transformers 5 records its internal class name "TokenizersBackend"; the generic
    # "PreTrainedTokenizerFast" loads the same tokenizer.json in transformers 4 and 5.
    cfg_path = os.path.join(args.out, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    # save_pretrained may not write the map in every transformers version; keep one for tools.
    smap = os.path.join(args.out, "special_tokens_map.json")
    if not os.path.exists(smap):
        with open(smap, "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                       "pad_token": "<pad>"}, f, indent=2)
            f.write("\n")

    # Check: the saved files load through AutoTokenizer and round-trip exactly.
    at = AutoTokenizer.from_pretrained(args.out)
    raw = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    assert type(at).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend"), type(at)
    assert (at.bos_token_id, at.eos_token_id, at.unk_token_id, at.pad_token_id) == (1, 2, 0, 3)
    assert len(at) == raw.get_vocab_size()
    for t in sp["train"][:50] + sp["validation"][:50]:
        ids = raw.encode(t).ids
        assert at(t, add_special_tokens=True)["input_ids"] == ids, "AutoTokenizer ids differ"
        assert raw.decode(ids) == t and at.decode(ids) == t, "round trip failed"
        assert 0 not in ids, "unexpected <unk>"

    with open(os.path.join(args.out, "tokenizer.json"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    report = {"vocab_size": raw.get_vocab_size(), "tokenizer_sha256": sha,
              "train": stats(raw, sp["train"])}
    if sp["validation"]:
        report["validation"] = stats(raw, sp["validation"])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
