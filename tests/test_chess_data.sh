#!/usr/bin/env bash
# Checks the committed chess data: corpus, meta, PGN legality (pgn-extract), token shards,
# tokenizer and default model files.
#   bash tests/test_chess_data.sh [build_dir]      (build_dir is ignored)
# Environment overrides: DATA_DIR (default <repo>/data), MIN_GAMES (10000),
# SAMPLE (games converted to PGN, default 300), PGN_EXTRACT (/usr/games/pgn-extract).
# Needs python3 (standard library only) and xz; pgn-extract is required (missing = failure).
# Last line: "test_chess_data: N passed, N failed"; exit status non-zero on any failure.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_chess_data
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA_DIR=${DATA_DIR:-$ROOT/data}
MIN_GAMES=${MIN_GAMES:-10000}
SAMPLE=${SAMPLE:-300}
if [ -n "${PGN_EXTRACT:-}" ]; then PGNX=$PGN_EXTRACT
elif [ -x /usr/games/pgn-extract ]; then PGNX=/usr/games/pgn-extract
else PGNX=$(command -v pgn-extract || echo /usr/games/pgn-extract); fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_chess_data.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# tally: reads "ok X" / "FAIL X: why" lines (printed by the python checks) and counts them.
tally() {
  local line
  while IFS= read -r line; do
    case "$line" in
      "ok "*)   ok "${line#ok }" ;;
      "FAIL "*) bad "${line#FAIL }" ;;
      *)        echo "     $line" ;;
    esac
  done
}
# run_py ARGS... <<'PY' ... PY : runs a python3 check script from stdin; a crash is a failure.
run_py() {
  python3 - "$@" > "$TMP/py.out" 2>&1
  local rc=$?
  tally < "$TMP/py.out"
  [ $rc -eq 0 ] || bad "python check script exited $rc"
}

CH="$DATA_DIR/chess"; MD="$DATA_DIR/model"
for f in "$CH/games.jsonl.xz" "$CH/games.meta.json"; do
  if [ -f "$f" ]; then ok "exists ${f#$DATA_DIR/}"; else bad "missing ${f#$DATA_DIR/}"; fi
done
if ! xz -dc "$CH/games.jsonl.xz" > "$TMP/games.jsonl" 2>"$TMP/xz.err"; then
  bad "xz decompress: $(cat "$TMP/xz.err")"
  finish
fi
ok "xz decompress"

# ---- corpus content, meta, and the PGN sample --------------------------------------------
run_py "$TMP" "$CH" "$MIN_GAMES" "$SAMPLE" <<'PY'
import hashlib, json, os, re, sys
tmp, ch, min_games, sample_n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def check(name, cond, why=""):
    print(("ok %s" % name) if cond else ("FAIL %s: %s" % (name, why)))
raw = open(os.path.join(tmp, "games.jsonl"), "rb").read()
games, bad_json = [], 0
for line in raw.decode().splitlines():
    try:
        games.append(json.loads(line))
    except ValueError:
        bad_json += 1
check("jsonl parses", bad_json == 0, "%d bad lines" % bad_json)
TERMS = {"CHECKMATE", "STALEMATE", "INSUFFICIENT_MATERIAL", "SEVENTYFIVE_MOVES",
         "FIVEFOLD_REPETITION", "MAX_PLIES"}
UCI = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")
cols = [g for g in games if not isinstance(g, dict) or list(g) != ["Moves", "Termination", "Result"]]
check("columns are exactly Moves, Termination, Result", not cols, "%d rows differ" % len(cols))
if cols:
    sys.exit(0)
badm = [i for i, g in enumerate(games) if not isinstance(g["Moves"], list) or not g["Moves"]
        or not all(isinstance(m, str) and UCI.match(m) for m in g["Moves"])]
check("Moves are non-empty lists of UCI strings", not badm, "rows %s" % badm[:5])
badt = sorted({g["Termination"] for g in games} - TERMS)
check("Termination values", not badt, badt)
badr = sorted({g["Result"] for g in games} - {"1-0", "0-1", "1/2-1/2"})
check("Result values", not badr, badr)
def want_result(g):
    if g["Termination"] != "CHECKMATE":
        return "1/2-1/2"
    return "1-0" if len(g["Moves"]) % 2 == 1 else "0-1"   # odd plies: white moved last
incons = [i for i, g in enumerate(games) if g["Result"] != want_result(g)]
check("Result consistent with Termination and side to move", not incons, "rows %s" % incons[:5])
check("at least %d games" % min_games, len(games) >= min_games, "only %d" % len(games))
keys = [" ".join(g["Moves"]) for g in games]
check("no duplicate games", len(set(keys)) == len(keys), "%d duplicates" % (len(keys) - len(set(keys))))
# meta
try:
    meta = json.load(open(os.path.join(ch, "games.meta.json")))
except Exception as e:
    meta = {}
    check("meta parses", False, e)
check("meta sha256 of jsonl", meta.get("sha256_jsonl") == hashlib.sha256(raw).hexdigest(), "mismatch")
xzsha = hashlib.sha256(open(os.path.join(ch, "games.jsonl.xz"), "rb").read()).hexdigest()
check("meta sha256 of .xz file", meta.get("sha256_file") == xzsha, "mismatch")
check("meta count", meta.get("count") == len(games), "%s vs %d" % (meta.get("count"), len(games)))
check("meta engine recorded", str(meta.get("engine", "")).startswith("Stockfish"), meta.get("engine"))
tc = {}
for g in games:
    tc[g["Termination"]] = tc.get(g["Termination"], 0) + 1
check("meta termination counts", meta.get("terminations") == tc, "%s vs %s" % (meta.get("terminations"), tc))
split = ["validation" if int(hashlib.sha1(k.encode()).hexdigest(), 16) % 100 < 2 else "train" for k in keys]
n_val = split.count("validation")
check("meta split counts (sha1 % 100 < 2 -> validation)",
      meta.get("split_counts") == {"train": len(games) - n_val, "validation": n_val}, meta.get("split_counts"))
check("validation split is 0.5-4%", 0.005 <= n_val / max(len(games), 1) <= 0.04, "%d of %d" % (n_val, len(games)))
json.dump({"train": len(games) - n_val, "validation": n_val}, open(os.path.join(tmp, "split.json"), "w"))
# PGN sample: every rare termination (up to 10 each), then half validation, half train.
pick = []
for t in sorted(TERMS - {"CHECKMATE"}):
    pick += [i for i, g in enumerate(games) if g["Termination"] == t][:10]
vi = [i for i in range(len(games)) if split[i] == "validation" and i not in pick]
ti = [i for i in range(len(games)) if split[i] == "train" and i not in pick]
rest = max(sample_n - len(pick), 0)
nv = min(len(vi), rest // 2)
pick += vi[:nv]
nt = rest - nv
pick += ti[::max(len(ti) // max(nt, 1), 1)][:nt]
pick = sorted(set(pick))
with open(os.path.join(tmp, "sample.pgn"), "w") as f:
    for i in pick:
        g = games[i]
        mv = " ".join(("%d. " % (j // 2 + 1) if j % 2 == 0 else "") + m for j, m in enumerate(g["Moves"]))
        f.write('[Event "g%d"]\n[Site "?"]\n[Date "????.??.??"]\n[Round "?"]\n[White "sf"]\n'
                '[Black "sf"]\n[Result "%s"]\n\n%s %s\n\n' % (i, g["Result"], mv, g["Result"]))
json.dump({str(i): games[i] for i in pick}, open(os.path.join(tmp, "sample.json"), "w"))
print("sample: %d games (%d validation), terminations %s" % (len(pick), sum(split[i] == "validation" for i in pick),
      {t: sum(games[i]["Termination"] == t for i in pick) for t in sorted(TERMS)}))
PY

# ---- pgn-extract ---------------------------------------------------------------------------
if [ ! -x "$PGNX" ]; then
  bad "pgn-extract not found at $PGNX (Debian/Ubuntu: apt-get install pgn-extract)"
elif [ ! -s "$TMP/sample.pgn" ]; then
  bad "no PGN sample was written"
else
  ok "pgn-extract found ($PGNX)"
  "$PGNX" -s --quiet -w 100000 -F -Wuci "$TMP/sample.pgn" -o "$TMP/uci.pgn" 2>"$TMP/diag.txt"
  "$PGNX" -s --quiet -w 100000 --checkmate "$TMP/sample.pgn" -o "$TMP/mate.pgn" 2>/dev/null
  "$PGNX" -s --quiet -w 100000 --stalemate "$TMP/sample.pgn" -o "$TMP/stale.pgn" 2>/dev/null
  "$PGNX" -s --quiet -w 100000 --fifty "$TMP/sample.pgn" -o "$TMP/fifty.pgn" 2>/dev/null
  "$PGNX" -s --quiet -w 100000 --repetition "$TMP/sample.pgn" -o "$TMP/rep.pgn" 2>/dev/null
  run_py "$TMP" <<'PY'
import json, os, re, sys
tmp = sys.argv[1]
def check(name, cond, why=""):
    print(("ok %s" % name) if cond else ("FAIL %s: %s" % (name, why)))
sample = json.load(open(os.path.join(tmp, "sample.json")))
diag = open(os.path.join(tmp, "diag.txt")).read().strip()
check("pgn-extract reports no illegal move / parse error / result warning", not diag, diag[:400])
def games_in(name):
    out, cur = {}, None
    for line in open(os.path.join(tmp, name)):
        m = re.match(r'^\[Event "g(\d+)"\]', line)
        if m:
            cur = m.group(1); out[cur] = ""
        elif cur is not None and line.strip() and not line.startswith("["):
            out[cur] += " " + line
    return out
uci, fen = {}, {}
for k, body in games_in("uci.pgn").items():
    m = re.search(r'\{\s*"([^"]*)"\s*\}', body)   # -F: final position as a FEN comment
    fen[k] = m.group(1) if m else None
    uci[k] = [t.lower() for t in re.sub(r"\{[^}]*\}", " ", body).split()[:-1]]
check("pgn-extract read every sample game", set(uci) == set(sample), "%d of %d" % (len(uci), len(sample)))
mism = [k for k, g in sample.items() if uci.get(k) != g["Moves"]]
check("pgn-extract UCI output equals the stored moves", not mism, "games %s" % mism[:5])
def insufficient(fen):
    """python-chess is_insufficient_material() on a FEN placement."""
    board = {}
    for r, row in enumerate(fen.split()[0].split("/")):
        f = 0
        for c in row:
            if c.isdigit():
                f += int(c)
            else:
                board[(f, 7 - r)] = c; f += 1
    def side(white):
        mine = [p.upper() for p in board.values() if p.isupper() == white and p.upper() != "K"]
        theirs = [p.upper() for p in board.values() if p.isupper() != white and p.upper() != "K"]
        if set(mine) & {"P", "R", "Q"}:
            return False
        if "N" in mine:
            return len(mine) <= 1 and all(p == "Q" for p in theirs)
        if "B" in mine:
            colours = {(f + r) % 2 for (f, r), p in board.items() if p.upper() == "B"}
            return len(colours) == 1 and not any(p.upper() in "PN" for p in board.values())
        return True
    return side(True) and side(False)
nofen = [k for k in sample if not fen.get(k)]
check("pgn-extract -F gives every final position", not nofen, nofen[:5])
if not nofen:
    im = {k for k, g in sample.items() if insufficient(fen[k])}
    want = {k for k, g in sample.items() if g["Termination"] == "INSUFFICIENT_MATERIAL"}
    check("INSUFFICIENT_MATERIAL games == final positions with insufficient material (%d)" % len(want),
          im == want, "only ours %s, only final-FEN %s" % (sorted(want - im)[:5], sorted(im - want)[:5]))
    bad75 = [k for k, g in sample.items() if g["Termination"] == "SEVENTYFIVE_MOVES" and int(fen[k].split()[4]) < 150]
    check("SEVENTYFIVE_MOVES games end with halfmove clock >= 150", not bad75, bad75[:5])
    early = [k for k, g in sample.items() if g["Termination"] not in ("CHECKMATE", "SEVENTYFIVE_MOVES")
             and int(fen[k].split()[4]) >= 150]
    check("no other game runs past the 75-move rule", not early, early[:5])
def of(term):
    return {k for k, g in sample.items() if g["Termination"] == term}
mate = set(games_in("mate.pgn"))
check("CHECKMATE games == pgn-extract --checkmate (%d)" % len(of("CHECKMATE")), mate == of("CHECKMATE"),
      "only ours %s, only pgn-extract %s" % (sorted(of("CHECKMATE") - mate)[:5], sorted(mate - of("CHECKMATE"))[:5]))
stale = set(games_in("stale.pgn"))
check("STALEMATE games == pgn-extract --stalemate (%d)" % len(of("STALEMATE")), stale == of("STALEMATE"),
      "only ours %s, only pgn-extract %s" % (sorted(of("STALEMATE") - stale)[:5], sorted(stale - of("STALEMATE"))[:5]))
fifty = set(games_in("fifty.pgn"))
check("SEVENTYFIVE_MOVES games pass pgn-extract --fifty (%d)" % len(of("SEVENTYFIVE_MOVES")),
      of("SEVENTYFIVE_MOVES") <= fifty, sorted(of("SEVENTYFIVE_MOVES") - fifty)[:5])
rep = set(games_in("rep.pgn"))
check("FIVEFOLD_REPETITION games pass pgn-extract --repetition (%d)" % len(of("FIVEFOLD_REPETITION")),
      of("FIVEFOLD_REPETITION") <= rep, sorted(of("FIVEFOLD_REPETITION") - rep)[:5])
PY
fi

# ---- shards, tokenizer, model ----------------------------------------------------------------
run_py "$TMP" "$DATA_DIR" "$ROOT/scripts" <<'PY'
import hashlib, json, os, struct, sys
tmp, data = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
from token_shard import ShardError, read_shard   # the one FTTOKSHD reader
ch, md = os.path.join(data, "chess"), os.path.join(data, "model")
def check(name, cond, why=""):
    print(("ok %s" % name) if cond else ("FAIL %s: %s" % (name, why)))
def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()
try:
    man = json.load(open(os.path.join(ch, "shards.json")))
except Exception as e:
    check("shards.json parses", False, e); sys.exit(0)
try:
    tokj = json.load(open(os.path.join(md, "tokenizer.json")))
    vocab = tokj["model"]["vocab"]
    added = {t["content"]: t["id"] for t in tokj.get("added_tokens", [])}
    n_vocab = max(list(vocab.values()) + list(added.values())) + 1
except Exception as e:
    check("tokenizer.json parses", False, e); sys.exit(0)
check("tokenizer.json parses", True)
ids = {**vocab, **added}
check("special tokens <unk> <s> </s> <pad>", all(t in ids for t in ("<unk>", "<s>", "</s>", "<pad>")), sorted(added))
check("shards.json tokenizer sha256", man.get("tokenizer_sha256") == sha(os.path.join(md, "tokenizer.json")), "stale shards?")
check("shards.json vocab/bos/eos match tokenizer",
      (man.get("vocab_size"), man.get("bos_id"), man.get("eos_id")) == (n_vocab, ids.get("<s>"), ids.get("</s>")),
      (man.get("vocab_size"), man.get("bos_id"), man.get("eos_id")))
split = json.load(open(os.path.join(tmp, "split.json"))) if os.path.exists(os.path.join(tmp, "split.json")) else None
files = sorted(f for f in os.listdir(ch) if f.endswith(".bin"))
listed = sorted(x["file"] for x in man["train"] + man["val"])
check("shard files on disk == shards.json", files == listed, "%s vs %s" % (files, listed))
check("train shard names train_000.. contiguous, val_000 present",
      [x["file"] for x in man["train"]] == ["train_%03d.bin" % i for i in range(len(man["train"]))]
      and "val_000.bin" in listed, listed)
docs = {"train": 0, "val": 0}
for key in ("train", "val"):
    for x in man[key]:
        p = os.path.join(ch, x["file"])
        name = "shard %s" % x["file"]
        try:
            hdr, off, tok = read_shard(p)   # layout, size, offsets, ids < vocab
        except (OSError, ShardError) as e:
            check(name, False, e); continue
        nd, nt, bos, eos = hdr["n_docs"], hdr["n_tokens"], hdr["bos_id"], hdr["eos_id"]
        errs = []
        if (hdr["vocab_size"], bos, eos) != (n_vocab, ids["<s>"], ids["</s>"]):
            errs.append("vocab/bos/eos %s" % ((hdr["vocab_size"], bos, eos),))
        if (nd, nt) != (x["docs"], x["tokens"]): errs.append("manifest counts")
        if sha(p) != x["sha256"]: errs.append("sha256")
        if any(tok[off[i]] != bos or tok[off[i + 1] - 1] != eos or off[i + 1] - off[i] < 3 for i in range(nd)):
            errs.append("document not [bos] ... [eos]")
        if nt and 0 in tok and ids.get("<unk>") == 0: errs.append("contains <unk>")
        check(name + " header/offsets/size (%d docs, %d tokens)" % (nd, nt), not errs, ", ".join(errs))
        docs[key] += nd
check("2-4 train shards", 2 <= len(man["train"]) <= 4, len(man["train"]))
if split:
    check("shard docs == corpus split (train %d, val %d)" % (split["train"], split["validation"]),
          docs == {"train": split["train"], "val": split["validation"]}, docs)
# model
try:
    cfg = json.load(open(os.path.join(md, "config.json")))
    check("config.json is a Llama with vocab == tokenizer",
          cfg.get("model_type") == "llama" and cfg.get("vocab_size") == n_vocab and
          cfg.get("bos_token_id") == ids["<s>"] and cfg.get("eos_token_id") == ids["</s>"] and
          cfg.get("tie_word_embeddings") is False, {k: cfg.get(k) for k in ("model_type", "vocab_size", "tie_word_embeddings")})
    st = open(os.path.join(md, "model.safetensors"), "rb").read()
    n = struct.unpack_from("<Q", st)[0]
    hdr = json.loads(st[8:8 + n])
    tens = {k: v for k, v in hdr.items() if k != "__metadata__"}
    end = max(v["data_offsets"][1] for v in tens.values())
    check("model.safetensors: fp32, untied lm_head, consistent size",
          all(v["dtype"] == "F32" for v in tens.values()) and "lm_head.weight" in tens and
          tens["model.embed_tokens.weight"]["shape"] == [n_vocab, cfg["hidden_size"]] and len(st) == 8 + n + end,
          sorted({v["dtype"] for v in tens.values()}))
    tc = json.load(open(os.path.join(md, "tokenizer_config.json")))
    check("tokenizer_config.json", tc.get("bos_token") == "<s>" and tc.get("eos_token") == "</s>", tc)
except Exception as e:
    check("model files", False, repr(e))
total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(data) for f in fs)
check("data/ under 30 MB (%.1f MB)" % (total / 1e6), total < 30e6, total)
PY

finish
