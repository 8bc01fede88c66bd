#!/usr/bin/env python3
"""Tokenize a chess corpus into binary token shards for the C trainer (and verify them).

Inputs (--games, one or more; see scripts/chess_corpus.py):
  * parquet files in the laion/strategic_game_chess layout (columns Moves = list of UCI
    strings, Termination, Result), or a directory of them (needs pyarrow);
  * our JSON lines (data/chess/games.jsonl.xz; plain, .gz or .xz), or the tutorial's
    {"text": "e2e4 ... 1-0"} lines;
  * PGN files (needs python-chess).
Every game becomes the same text whatever its input: the UCI moves joined by spaces, then
a space and the result ("e2e4 e7e5 ... 1-0"), as the tutorial's jsonl has it.
Every move must have UCI's shape (e2e4, e7e8q): text that is not chess moves stops the run.
Games whose result is "*" (PGN's "unknown or unfinished": a game cut off, an engine match
stopped) are skipped and counted per reason in the summary and shards.json, as PGN tools
filtering training data do; --keep_unfinished keeps them (their document ends in " *").
--check_moves also replays every game with python-chess. The first malformed or illegal move
stops the run with one line naming the file and the row (parquet, 0-based), line (JSON
lines) or game (PGN).

Tokenizer: any Hugging Face tokenizer.json (needs `tokenizers`). Text is encoded without
the tokenizer's own special tokens; each document is [bos] + encode(text) + [eos]. BOS/EOS
come from --bos_token/--eos_token, else from tokenizer_config.json or special_tokens_map.json
beside tokenizer.json, else "<s>"/"</s>" when the vocabulary has them ("" = none).
Vocabularies over 65,536 entries give u32 tokens in the shard, smaller ones u16.

Shard layout: scripts/token_shard.py (FTTOKSHD v1; the C reader is src/token_shard.c).

Outputs (in --out_dir): train_000.bin, train_001.bin, ... (at most --docs_per_shard docs
each), val_000.bin, and shards.json (files, docs, tokens, sha256s, sources, tokenizer
sha256). Everything is written to a temporary folder inside --out_dir first and moved in
at the end: on any error the earlier shards stay as they were and nothing new is left
behind (an --out_dir this run created is removed again). Split: sha1(moves) % 100 <
--val_percent (default 2) -> validation, else train; no games, or a split without a game
(finetune needs both: a corpus of a few dozen games may have no validation game at 2%: raise
--val_percent for a smoke test) is an error.

Examples:
  python scripts/tokenize_shards.py --games data/chess/games.jsonl.xz \
      --tokenizer data/model/tokenizer.json --out_dir data/chess
  python scripts/tokenize_shards.py --games strategic_game_chess/data --check_moves \
      --tokenizer codellama/tokenizer.json --out_dir data/laion
  python scripts/tokenize_shards.py --verify --games data/chess/games.jsonl.xz --out_dir data/chess
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chess_corpus import CorpusError, expand_sources, game_text, iter_games, split_of  # noqa: E402
from token_shard import ShardError, read_shard, sha256_file, token_bytes_for, write_shard  # noqa: E402

SPLITS = (("train", "train"), ("validation", "val"))  # (corpus split, file prefix / manifest key)


class TokenizeError(Exception):
    """Bad input or a failed check; the message is one line."""


# ---------------------------------------------------------------- tokenizer

def config_specials(tokenizer_path):
    """{"bos_token": str, "eos_token": str} from the HF files beside tokenizer.json."""
    out = {}
    d = os.path.dirname(os.path.abspath(tokenizer_path))
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            with open(os.path.join(d, name)) as f:
                cfg = json.load(f)
        except (OSError, ValueError):
            continue
        for key in ("bos_token", "eos_token"):
            v = cfg.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            if isinstance(v, str):
                out[key] = v
    return out


def load_tokenizer(path, bos_token=None, eos_token=None):
    """(tokenizer, vocab_size, bos_id, eos_id); ids are None when there is no such token."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizeError("tokenizing needs the `tokenizers` package (pip install tokenizers)")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a plain Exception for a bad file
        raise TokenizeError("%s: cannot load tokenizer (%s)" % (path, str(e).splitlines()[0]))
    cfg = config_specials(path)
    ids = []
    for flag, given, key, default in (("--bos_token", bos_token, "bos_token", "<s>"),
                                      ("--eos_token", eos_token, "eos_token", "</s>")):
        name = given if given is not None else cfg.get(key)
        if name is None:
            ids.append(tok.token_to_id(default))   # None when absent
        elif name == "":
            ids.append(None)
        elif tok.token_to_id(name) is None:
            raise TokenizeError("%s: no token %r for %s" % (path, name, flag if given is not None else key))
        else:
            ids.append(tok.token_to_id(name))
    return tok, tok.get_vocab_size(), ids[0], ids[1]


def encode_docs(tok, texts, bos, eos):
    head, tail = ([bos] if bos is not None else []), ([eos] if eos is not None else [])
    return [head + e.ids + tail for e in tok.encode_batch(texts, add_special_tokens=False)]


# ---------------------------------------------------------------- writing

def write_shards(args, tok, vocab, bos, eos, stage, skipped):
    """Stream the corpus into shards in stage; returns {"train": [...], "val": [...]}. Games
    left out are counted in skipped (reason -> games)."""
    out = {"train": [], "val": []}
    pending = {"train": [], "val": []}

    def flush(key):
        path = os.path.join(stage, "%s_%03d.bin" % (key, len(out[key])))
        out[key].append(write_shard(path, encode_docs(tok, pending[key], bos, eos), vocab, bos, eos))
        pending[key] = []

    games = {"train": 0, "val": 0}
    for _, _, g in iter_games(args.games, check_moves=args.check_moves, keep_unfinished=args.keep_unfinished,
                              skipped=skipped):
        key = "val" if split_of(g["Moves"], args.val_percent) == "validation" else "train"
        pending[key].append(game_text(g))
        games[key] += 1
        if key == "train" and len(pending[key]) == args.docs_per_shard:
            flush(key)
    # finetune refuses a shard without documents: say so now, not at its first run
    inputs = " ".join(args.games)
    if not games["train"] and not games["val"]:
        raise TokenizeError("%s: no games" % inputs)
    for key, split in (("val", "validation"), ("train", "training")):
        if not games[key]:
            raise TokenizeError("%s: no game of the %d fell into the %s split (content hash: about %d in 100 "
                                "games validate, --val_percent); finetune needs one in each: give more games%s"
                                % (inputs, games["train"] + games["val"], split, args.val_percent,
                                   " or a larger --val_percent" if key == "val" else " or a smaller --val_percent"))
    if pending["train"]:
        flush("train")
    flush("val")   # one validation shard
    return out


def build_manifest(args, sources, shards, vocab, bos, eos, skipped):
    man = {"format": "FTTOKSHD v1 (see scripts/token_shard.py)",
           "sources": [{"file": os.path.relpath(p, args.out_dir), "sha256": sha256_file(p)} for p in sources],
           "tokenizer": os.path.relpath(args.tokenizer, args.out_dir),
           "tokenizer_sha256": sha256_file(args.tokenizer),
           "vocab_size": vocab, "token_bytes": token_bytes_for(vocab), "bos_id": bos, "eos_id": eos,
           "document": "[bos] + encode(' '.join(Moves) + ' ' + Result) + [eos]",
           "split_rule": "int(sha1(' '.join(Moves)).hexdigest(), 16) %% 100 < %d -> val" % args.val_percent,
           "val_percent": args.val_percent,
           "keep_unfinished": args.keep_unfinished, "skipped_games": skipped,
           "train": shards["train"], "val": shards["val"]}
    for key in ("train", "val"):
        man[key + "_docs"] = sum(x["docs"] for x in man[key])
        man[key + "_tokens"] = sum(x["tokens"] for x in man[key])
    man["avg_tokens_per_doc"] = round(man["train_tokens"] / max(man["train_docs"], 1), 2)
    return man


def first_missing_dir(path):
    """The outermost ancestor of path (or path) that does not exist yet, or None."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


def write_all(args):
    tok, vocab, bos, eos = load_tokenizer(args.tokenizer, args.bos_token, args.eos_token)
    sources = expand_sources(args.games)   # every input opens (parquet: has Moves) before any output
    created = first_missing_dir(args.out_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".tokenize_shards.", dir=args.out_dir)
    try:
        skipped = {}
        shards = write_shards(args, tok, vocab, bos, eos, stage, skipped)
        man = build_manifest(args, sources, shards, vocab, bos, eos, skipped)
        with open(os.path.join(stage, "shards.json"), "w") as f:
            json.dump(man, f, indent=2)
            f.write("\n")
    except BaseException:
        shutil.rmtree(created or stage, ignore_errors=True)
        raise
    for name in os.listdir(args.out_dir):  # drop stale shards from an earlier run
        if name.startswith(("train_", "val_")) and name.endswith(".bin"):
            os.remove(os.path.join(args.out_dir, name))
    for name in os.listdir(stage):
        os.replace(os.path.join(stage, name), os.path.join(args.out_dir, name))
    os.rmdir(stage)
    for key in ("train", "val"):
        for x in man[key]:
            print("%-14s docs %6d tokens %8d bytes %9d" % (x["file"], x["docs"], x["tokens"], x["bytes"]))
    print("train: %d docs %d tokens; val: %d docs %d tokens; avg %.1f tokens/doc; vocab %d (u%d tokens)"
          % (man["train_docs"], man["train_tokens"], man["val_docs"], man["val_tokens"],
             man["avg_tokens_per_doc"], vocab, 8 * token_bytes_for(vocab)))
    for reason, n in sorted(skipped.items()):
        print("skipped %d game%s: %s%s" % (n, "" if n == 1 else "s", reason,
                                          "; --keep_unfinished keeps them" if reason.startswith("result *") else ""))


# ---------------------------------------------------------------- verifying

def verify_shard(path, entry, man):
    """Layout, manifest counts and [bos] ... [eos] documents; returns (offsets, tokens)."""
    hdr, offs, toks = read_shard(path)
    if sha256_file(path) != entry["sha256"]:
        raise TokenizeError("%s: sha256 differs from shards.json" % path)
    if (hdr["n_docs"], hdr["n_tokens"]) != (entry["docs"], entry["tokens"]):
        raise TokenizeError("%s: docs/tokens differ from shards.json" % path)
    if (hdr["vocab_size"], hdr["bos_id"], hdr["eos_id"]) != (man["vocab_size"], man["bos_id"], man["eos_id"]):
        raise TokenizeError("%s: vocab/bos/eos differ from shards.json" % path)
    bos, eos = hdr["bos_id"], hdr["eos_id"]
    shortest = 1 + (bos is not None) + (eos is not None)
    for d in range(hdr["n_docs"]):
        a, b = offs[d], offs[d + 1]
        if b - a < shortest or (bos is not None and toks[a] != bos) or (eos is not None and toks[b - 1] != eos):
            raise TokenizeError("%s: document %d is not [bos] tokens [eos]" % (path, d))
    return offs, toks


def verify(args):
    """Re-read every shard; with `tokenizers`, re-encode 3 games a shard from --games and
    compare, and check the shards hold exactly the corpus's games per split."""
    try:
        with open(os.path.join(args.out_dir, "shards.json")) as f:
            man = json.load(f)
    except (OSError, ValueError) as e:
        raise TokenizeError("%s: cannot read shards.json (%s)" % (args.out_dir, e))
    tok = None
    try:
        tok = load_tokenizer(os.path.join(args.out_dir, man["tokenizer"]))[0]
    except TokenizeError as e:
        print("note: %s; skipping the re-encode checks" % e)
    picks, counts = {}, {}
    for split, key in SPLITS:
        base = 0
        for x in man[key]:
            path = os.path.join(args.out_dir, x["file"])
            offs, toks = verify_shard(path, x, man)
            n = len(offs) - 1
            strip_b, strip_e = man["bos_id"] is not None, man["eos_id"] is not None
            for d in sorted({0, n // 2, n - 1}) if n else []:
                picks[(split, base + d)] = (path, d, list(toks[offs[d] + strip_b:offs[d + 1] - strip_e]))
            print("ok %-14s docs %6d tokens %8d" % (x["file"], n, len(toks)))
            base += n
        counts[split] = base
    if tok is None:
        return
    seen = {"train": 0, "validation": 0}
    exact = True
    for _, _, g in iter_games(args.games, keep_unfinished=man.get("keep_unfinished", False)):
        split = split_of(g["Moves"], man.get("val_percent", 2))   # (older manifests: 2)
        pick = picks.get((split, seen[split]))
        seen[split] += 1
        if pick:
            text = game_text(g)
            ids = tok.encode(text, add_special_tokens=False).ids
            if ids != pick[2]:
                raise TokenizeError("%s: document %d does not re-encode from the corpus" % pick[:2])
            exact = exact and tok.decode(ids) == text
    if seen != counts:
        raise TokenizeError("%s: shards hold %s games, the corpus %s" % (args.out_dir, counts, seen))
    if sha256_file(os.path.join(args.out_dir, man["tokenizer"])) != man["tokenizer_sha256"]:
        raise TokenizeError("%s: tokenizer changed since the shards were written" % man["tokenizer"])
    if not exact:
        print("note: this tokenizer's decode() does not give the text back exactly (its ids do match)")
    print("verify: all shards OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--games", nargs="+", default=["data/chess/games.jsonl.xz"],
                    help="input files or directories (.parquet, .jsonl[.gz|.xz], .pgn)")
    ap.add_argument("--tokenizer", default="data/model/tokenizer.json")
    ap.add_argument("--bos_token", default=None, help="BOS token text ('' = none; default: see above)")
    ap.add_argument("--eos_token", default=None, help="EOS token text ('' = none; default: see above)")
    ap.add_argument("--out_dir", default="data/chess")
    ap.add_argument("--docs_per_shard", type=int, default=4096)
    ap.add_argument("--val_percent", type=int, default=2,
                    help="games whose content hash %% 100 is below this go to validation (1-99; default 2)")
    ap.add_argument("--check_moves", action="store_true", help="replay every game with python-chess")
    ap.add_argument("--verify", action="store_true", help="re-read and check the shards instead of writing")
    ap.add_argument("--keep_unfinished", action="store_true",
                    help="keep games whose result is * (unfinished; the document ends in ' *'); by default they "
                         "are skipped and counted")
    args = ap.parse_args()
    if args.docs_per_shard < 1:
        ap.error("--docs_per_shard must be at least 1")
    if not 1 <= args.val_percent <= 99:
        ap.error("--val_percent must be in [1, 99]")
    try:
        if not args.verify:
            write_all(args)
        verify(args)
    except (CorpusError, ShardError, TokenizeError) as e:
        print("tokenize_shards: %s" % e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
