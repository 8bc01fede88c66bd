#!/usr/bin/env python3
"""Tokenize the chess corpus into binary token shards for the C trainer (and verify them).

Run with a Python that has `tokenizers` (e.g. /opt/oracle-venv/bin/python); --verify needs
only the standard library plus `tokenizers` for decoding.

Shard layout (all integers little-endian; the C reader mmaps the file):
  offset  0  char[8] magic "FTTOKSHD"
          8  u32 version = 1
         12  u32 token_bytes (2 if vocab_size <= 65536 else 4)
         16  u32 vocab_size
         20  u32 bos_id (0xFFFFFFFF if none)
         24  u32 eos_id (0xFFFFFFFF if none)
         28  u32 reserved = 0
         32  u64 n_docs
         40  u64 n_tokens
         48  16 zero bytes
         64  u64 doc_offsets[n_docs + 1]   token index where doc i starts;
                                           offsets[0] = 0, offsets[n_docs] = n_tokens
          .  tokens[n_tokens], token_bytes each (u16 or u32)
  file size = 64 + 8 * (n_docs + 1) + token_bytes * n_tokens
Each document is [bos] + encode(text) + [eos], text = "move move ... result".

Outputs (in --out_dir): train_000.bin, train_001.bin, ... (at most --docs_per_shard docs
each), val_000.bin, and shards.json (files, docs, tokens, sha256, tokenizer sha256).

Examples:
  /opt/oracle-venv/bin/python scripts/tokenize_shards.py --games data/chess/games.jsonl.xz \
      --tokenizer data/model/tokenizer.json --out_dir data/chess
  /opt/oracle-venv/bin/python scripts/tokenize_shards.py --verify --out_dir data/chess
"""
import argparse
import array
import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chess_corpus import split_texts  # noqa: E402

MAGIC = b"FTTOKSHD"
VERSION = 1
HEADER = struct.Struct("<8sIIIIIIQQ16x")  # 64 bytes
NONE_ID = 0xFFFFFFFF
assert HEADER.size == 64
assert sys.byteorder == "little", "array-based writer assumes a little-endian host"


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_shard(path, docs, vocab_size, bos_id, eos_id):
    """docs: list of token-id lists (already including BOS/EOS)."""
    token_bytes = 2 if vocab_size <= 65536 else 4
    offsets = array.array("Q", [0])
    toks = array.array("H" if token_bytes == 2 else "I")
    for d in docs:
        toks.extend(d)
        offsets.append(len(toks))
    assert toks.itemsize == token_bytes and offsets.itemsize == 8
    hdr = HEADER.pack(MAGIC, VERSION, token_bytes, vocab_size,
                      NONE_ID if bos_id is None else bos_id,
                      NONE_ID if eos_id is None else eos_id,
                      0, len(docs), len(toks))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(hdr)
        f.write(offsets.tobytes())
        f.write(toks.tobytes())
    os.replace(tmp, path)
    size = os.path.getsize(path)
    assert size == 64 + 8 * (len(docs) + 1) + token_bytes * len(toks)
    return {"file": os.path.basename(path), "docs": len(docs), "tokens": len(toks),
            "bytes": size, "sha256": sha256_file(path)}


def read_shard(path):
    """Minimal reader: checks the layout and returns (header dict, offsets, tokens)."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 64:
        raise ValueError("%s: shorter than the 64-byte header" % path)
    magic, ver, tb, vocab, bos, eos, res, n_docs, n_tokens = HEADER.unpack_from(buf, 0)
    if magic != MAGIC or ver != VERSION or res != 0 or buf[48:64] != bytes(16):
        raise ValueError("%s: bad magic/version/reserved" % path)
    if tb not in (2, 4) or (tb == 2) != (vocab <= 65536):
        raise ValueError("%s: token_bytes %d inconsistent with vocab %d" % (path, tb, vocab))
    want = 64 + 8 * (n_docs + 1) + tb * n_tokens
    if len(buf) != want:
        raise ValueError("%s: size %d, header implies %d" % (path, len(buf), want))
    offsets = array.array("Q")
    offsets.frombytes(buf[64:64 + 8 * (n_docs + 1)])
    toks = array.array("H" if tb == 2 else "I")
    toks.frombytes(buf[64 + 8 * (n_docs + 1):])
    if offsets[0] != 0 or offsets[-1] != n_tokens:
        raise ValueError("%s: offsets do not span the tokens" % path)
    if any(offsets[i] > offsets[i + 1] for i in range(n_docs)):
        raise ValueError("%s: offsets decrease" % path)
    if n_tokens and max(toks) >= vocab:
        raise ValueError("%s: token id >= vocab_size" % path)
    hdr = {"token_bytes": tb, "vocab_size": vocab, "bos_id": bos, "eos_id": eos,
           "n_docs": n_docs, "n_tokens": n_tokens}
    return hdr, offsets, toks


def write_all(args):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    sp = split_texts(args.games)
    os.makedirs(args.out_dir, exist_ok=True)

    def encode(texts):
        return [[bos] + e.ids + [eos] for e in tok.encode_batch(texts)]

    for name in os.listdir(args.out_dir):  # drop stale shards from an earlier run
        if (name.startswith("train_") or name.startswith("val_")) and name.endswith(".bin"):
            os.remove(os.path.join(args.out_dir, name))
    manifest = {"format": "FTTOKSHD v1 (see scripts/tokenize_shards.py)",
                "source": os.path.basename(args.games), "source_sha256": sha256_file(args.games),
                "tokenizer": os.path.relpath(args.tokenizer, args.out_dir),
                "tokenizer_sha256": sha256_file(args.tokenizer),
                "vocab_size": vocab, "bos_id": bos, "eos_id": eos,
                "document": "[bos] + encode(' '.join(Moves) + ' ' + Result) + [eos]",
                "split_rule": "int(sha1(' '.join(Moves)).hexdigest(), 16) % 100 < 2 -> val",
                "train": [], "val": []}
    for split, prefix, key in (("train", "train", "train"), ("validation", "val", "val")):
        docs = encode(sp[split])
        per = args.docs_per_shard if key == "train" else max(len(docs), 1)
        for s, i in enumerate(range(0, max(len(docs), 1), per)):
            path = os.path.join(args.out_dir, "%s_%03d.bin" % (prefix, s))
            manifest[key].append(write_shard(path, docs[i:i + per], vocab, bos, eos))
    for key in ("train", "val"):
        manifest[key + "_docs"] = sum(x["docs"] for x in manifest[key])
        manifest[key + "_tokens"] = sum(x["tokens"] for x in manifest[key])
    lens = [x["tokens"] for x in manifest["train"]]
    manifest["avg_tokens_per_doc"] = round(sum(lens) / max(manifest["train_docs"], 1), 2)
    with open(os.path.join(args.out_dir, "shards.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    for key in ("train", "val"):
        for x in manifest[key]:
            print("%-14s docs %6d tokens %8d bytes %9d" % (x["file"], x["docs"], x["tokens"], x["bytes"]))
    print("train: %d docs %d tokens; val: %d docs %d tokens; avg %.1f tokens/doc"
          % (manifest["train_docs"], manifest["train_tokens"], manifest["val_docs"],
             manifest["val_tokens"], manifest["avg_tokens_per_doc"]))


def verify(args):
    with open(os.path.join(args.out_dir, "shards.json")) as f:
        man = json.load(f)
    tok = None
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(args.out_dir, man["tokenizer"]))
    except ImportError:
        print("note: tokenizers not available, skipping decode checks")
    sp = split_texts(args.games) if tok else None
    for key, split in (("train", "train"), ("val", "validation")):
        doc_base = 0
        for x in man[key]:
            path = os.path.join(args.out_dir, x["file"])
            hdr, offs, toks = read_shard(path)
            assert sha256_file(path) == x["sha256"], path + ": sha256 mismatch"
            assert (hdr["n_docs"], hdr["n_tokens"]) == (x["docs"], x["tokens"])
            assert (hdr["vocab_size"], hdr["bos_id"], hdr["eos_id"]) == (man["vocab_size"], man["bos_id"], man["eos_id"])
            for d in range(hdr["n_docs"]):
                a, b = offs[d], offs[d + 1]
                assert b - a >= 3 and toks[a] == hdr["bos_id"] and toks[b - 1] == hdr["eos_id"]
            if tok:
                picks = sorted({0, hdr["n_docs"] // 2, hdr["n_docs"] - 1}) if hdr["n_docs"] else []
                for d in picks:
                    ids = list(toks[offs[d] + 1:offs[d + 1] - 1])
                    text = tok.decode(ids)
                    assert text == sp[split][doc_base + d], "%s doc %d decodes differently" % (path, d)
            print("ok %-14s docs %6d tokens %8d" % (x["file"], hdr["n_docs"], hdr["n_tokens"]))
            doc_base += hdr["n_docs"]
        if tok:
            assert doc_base == len(sp[split]), "%s: %d docs in shards, corpus has %d" % (key, doc_base, len(sp[split]))
    if tok:
        with open(os.path.join(args.out_dir, man["tokenizer"]), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == man["tokenizer_sha256"], "tokenizer changed"
    print("verify: all shards OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--games", default="data/chess/games.jsonl.xz")
    ap.add_argument("--tokenizer", default="data/model/tokenizer.json")
    ap.add_argument("--out_dir", default="data/chess")
    ap.add_argument("--docs_per_shard", type=int, default=4096)
    ap.add_argument("--verify", action="store_true", help="re-read and check the shards instead of writing")
    args = ap.parse_args()
    if args.verify:
        verify(args)
    else:
        write_all(args)
        verify(args)


if __name__ == "__main__":
    main()
