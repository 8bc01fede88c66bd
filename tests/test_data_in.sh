#!/usr/bin/env bash
# Checks scripts/tokenize_shards.py's inputs and outputs (issue 14 item 3):
#   * 106 games written as our JSON lines (plain, .gz, .xz), the tutorial's {"text"} lines, a
#     directory of two parquet files (laion/strategic_game_chess layout) and PGN all give
#     byte-identical shards; --check_moves accepts them; a directory of games that is also
#     --out_dir (its shards.json, a tokenizer.json) gives the same shards, run twice;
#   * games whose result is "*" (unfinished) are skipped and counted (PGN and JSON lines: the
#     same shards as without them), kept with --keep_unfinished; a malformed move still stops;
#   * re-tokenizing data/chess/games.jsonl.xz reproduces the committed shards byte for byte;
#   * a tokenizer with 70,211 entries (every move id >= 66,000) gives u32 shards that
#     build/finetune --eval_only reads, with the loss transformers computes on the same
#     tokens (tests/oracle/check_export.py, a 1-layer random model);
#   * bad input (parquet without Moves, illegal moves with --check_moves, moves that are not
#     UCI (e2e9, Nf3, prose) with or without it, a
#     broken PGN, a missing file, no games, no validation game): one line naming the file and
#     row, exit 1, no output left (a new --out_dir is not created; an existing one keeps its
#     shards).
#   bash tests/test_data_in.sh [build_dir]
# Needs $FT_ORACLE_PYTHON with pyarrow, chess, tokenizers, torch, transformers
# (tests/oracle/requirements*.txt; .ci/run makes that venv): a skip without it, a failure
# under CI=true. Runtime: measured 29 s of CPU (user+sys), most of it the two torch imports
# (make_default_model.py, check_export.py); wall 2-4 min measured here only with the 2 cores
# at load average ~13 from other work, so an idle CI machine should take about 35 s.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$ROOT/$build" ;; esac
. "$ROOT/tests/lib.sh" test_data_in
cd "$ROOT"

py=${FT_ORACLE_PYTHON:-}
if [ -z "$py" ] || ! "$py" -c "import pyarrow, chess, tokenizers, torch, transformers" 2>/dev/null; then
  skip_or_fail "FT_ORACLE_PYTHON='$py' cannot import pyarrow, chess, tokenizers, torch and transformers (tests/oracle/requirements*.txt)"
  finish
fi
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_data_in.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
IN=$TMP/in
tok() { "$py" scripts/tokenize_shards.py "$@"; }   # tok ARGS... (writes, then verifies)
shards_sha() { cat "$1"/train_*.bin "$1"/val_*.bin 2>/dev/null | sha256sum | cut -c1-16; }

if out=$("$py" tests/oracle/make_data_inputs.py data/chess/games.jsonl.xz "$IN" 2>&1); then ok "$out"
else bad "make_data_inputs.py: $out"; finish; fi

# ---------------------------------------------------------------- 1. every input layout, same shards
small=(--tokenizer data/model/tokenizer.json --docs_per_shard 40)
if tok --games "$IN/games.jsonl" "${small[@]}" --out_dir "$TMP/ref" > "$TMP/ref.log" 2>&1 \
   && [ "$(ls "$TMP/ref"/train_*.bin | wc -l)" -eq 3 ] && [ -f "$TMP/ref/val_000.bin" ]; then
  ok "JSON lines -> 3 train shards + val_000, verified ($(tail -2 "$TMP/ref.log" | head -1))"
else bad "JSON lines: $(tail -3 "$TMP/ref.log")"; finish; fi
want=$(shards_sha "$TMP/ref")
n=0
for src in games.jsonl.gz games.jsonl.xz text.jsonl pq "pq/part-0.parquet pq/part-1.parquet" games.pgn; do
  n=$((n+1)); d="$TMP/o$n"; args=()
  for s in $src; do args+=("$IN/$s"); done
  if tok --games "${args[@]}" "${small[@]}" --out_dir "$d" > "$d.log" 2>&1; then
    got=$(shards_sha "$d")
    [ "$got" = "$want" ] && ok "$src: same shards as the JSON lines ($got)" || bad "$src: shards $got, JSON lines $want"
  else bad "$src: $(tail -1 "$d.log")"; fi
done
tok --games "$IN/pq" "${small[@]}" --out_dir "$TMP/chk" --check_moves > "$TMP/chk.log" 2>&1 \
  && [ "$(shards_sha "$TMP/chk")" = "$want" ] && ok "--check_moves accepts the 106 legal games" \
  || bad "--check_moves on legal games: $(tail -1 "$TMP/chk.log")"
ls -a "$TMP/ref" | grep -q tokenize_shards && bad "staging folder left in --out_dir" || ok "no staging folder left in --out_dir"
# a directory of games that is also --out_dir (or holds other JSON: shards.json, games.meta.json,
# tokenizer.json): only .parquet, .pgn and .jsonl files are games, so a second run works too
mkdir -p "$TMP/same" && cp "$IN/games.jsonl" data/model/tokenizer.json "$TMP/same/"
for run in first second; do
  if tok --games "$TMP/same" "${small[@]}" --out_dir "$TMP/same" > "$TMP/same.log" 2>&1; then
    got=$(shards_sha "$TMP/same")
    [ "$got" = "$want" ] && ok "--games DIR = --out_dir, $run run: same shards as the JSON lines" \
      || bad "--games DIR = --out_dir, $run run: shards $got, JSON lines $want"
  else bad "--games DIR = --out_dir, $run run: $(tail -1 "$TMP/same.log")"; fi
done

# ---------------------------------------------------------------- 1b. unfinished games (result "*")
# skipped and counted by default (the same shards as without them), kept with --keep_unfinished
# (3 more documents, verified against the corpus); a malformed move still stops the run
for src in unfinished.pgn unfinished.jsonl; do
  d="$TMP/u_${src%.*}"
  if tok --games "$IN/$src" "${small[@]}" --out_dir "$d" > "$d.log" 2>&1; then
    got=$(shards_sha "$d")
    [ "$got" = "$want" ] && grep -q '^skipped 3 games: result \* (unfinished); --keep_unfinished keeps them$' "$d.log" \
      && grep -q '"result \* (unfinished)": 3' "$d/shards.json" \
      && ok "$src: the 3 unfinished games skipped and counted (log, shards.json), the other 106 as before" \
      || bad "$src: shards $got (want $want), log: $(grep skipped "$d.log")"
  else bad "$src: $(tail -1 "$d.log")"; fi
done
d="$TMP/u_keep"
if tok --games "$IN/unfinished.pgn" "${small[@]}" --keep_unfinished --out_dir "$d" > "$d.log" 2>&1 \
   && grep -q "verify: all shards OK" "$d.log" && ! grep -q '^skipped' "$d.log" \
   && "$py" -c 'import json, sys; m = json.load(open(sys.argv[1])); sys.exit(not (m["train_docs"] + m["val_docs"] == 109 and m["keep_unfinished"]))' "$d/shards.json"; then
  ok "--keep_unfinished: 109 documents (106 + 3 unfinished), recorded in shards.json, verified"
else bad "--keep_unfinished: $(tail -2 "$d.log")"; fi
err=$(tok --games "$IN/unfinished_malformed.jsonl" "${small[@]}" --out_dir "$TMP/u_bad" 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && grep -qF "unfinished_malformed.jsonl: line 12: malformed move 'e2e9' at ply 5" <<<"$err" && [ ! -e "$TMP/u_bad" ] \
  && ok "a malformed move among unfinished games still stops the run: $err" || bad "malformed among unfinished: rc $rc: $err"

# ---------------------------------------------------------------- 2. the committed shards, again
if tok --games data/chess/games.jsonl.xz --tokenizer data/model/tokenizer.json --out_dir "$TMP/full" > "$TMP/full.log" 2>&1; then
  "$py" - "$TMP/full/shards.json" data/chess/shards.json > "$TMP/cmp.log" 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
strip = lambda m: [(x["file"], x["sha256"]) for x in m["train"] + m["val"]]
sys.exit(0 if strip(a) == strip(b) else 1)
PY
  [ $? -eq 0 ] && ok "data/chess/games.jsonl.xz re-tokenized: the committed shards byte for byte" \
    || bad "re-tokenized shards differ from data/chess/shards.json"
else bad "re-tokenizing data/chess: $(tail -1 "$TMP/full.log")"; fi

# ---------------------------------------------------------------- 3. a vocabulary over 65,536: u32 tokens end to end
BV=$TMP/bigdata; BM=$TMP/bigmodel
if tok --games "$IN/pq" --tokenizer "$IN/bigvocab/tokenizer.json" --docs_per_shard 40 --out_dir "$BV" > "$BV.log" 2>&1; then
  "$py" - "$BV" scripts > "$TMP/u32.log" 2>&1 <<'PY'
import os, sys
sys.path.insert(0, sys.argv[2])
from token_shard import read_shard
hdr, _, toks = read_shard(os.path.join(sys.argv[1], "val_000.bin"))
moves = [t for t in toks if t > 3]
assert hdr["token_bytes"] == 4 and hdr["vocab_size"] == 70211, hdr
assert moves and min(moves) >= 66000, min(moves)
print("u32 shard, vocab %d, move ids %d..%d" % (hdr["vocab_size"], min(moves), max(moves)))
PY
  [ $? -eq 0 ] && ok "big vocabulary: $(cat "$TMP/u32.log")" || bad "big vocabulary shard: $(tail -1 "$TMP/u32.log")"
else bad "big vocabulary tokenize: $(tail -1 "$BV.log")"; fi
mkdir -p "$BM" && cp "$IN/bigvocab/tokenizer.json" "$BM/"
if "$py" scripts/make_default_model.py --out "$BM" --hidden 32 --layers 1 --heads 2 --kv_heads 1 \
     --intermediate 64 --max_pos 64 --init_std 1 > "$BM.log" 2>&1; then
  ours=$("$bin" --eval_only --model_dir "$BM" --data_dir "$BV" --seq_len 32 --max_eval_docs 6 2>&1 \
         | sed -nE 's/.*val loss ([0-9.]+).*/\1/p')
  if [ -n "$ours" ] && out=$("$py" tests/oracle/check_export.py "$BM" "$BV/val_000.bin" 32 6 "$ours" 2>&1); then
    ok "finetune reads the u32 shard: $out"
  else bad "finetune on the u32 shard: loss '$ours', $out"; fi
else bad "tiny big-vocabulary model: $(tail -1 "$BM.log")"; fi

# ---------------------------------------------------------------- 4. bad input
# expect_tok_error WANT OUT_DIR ARGS...: rc 1, one stderr line holding WANT, OUT_DIR as before
expect_tok_error() {
  local want="$1" out="$2"; shift 2
  local before after err rc
  before=$(ls -lA --time-style=full-iso "$out" 2>&1 | sha256sum)
  err=$(tok "$@" --out_dir "$out" 2>&1 >/dev/null); rc=$?
  after=$(ls -lA --time-style=full-iso "$out" 2>&1 | sha256sum)
  if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$want" \
     && [ "$before" = "$after" ]; then ok "error: $err"
  else bad "tokenize_shards $* -> rc=$rc, out_dir changed: $([ "$before" = "$after" ] && echo no || echo yes), stderr: $err (wanted one line with '$want')"; fi
}
T=(--tokenizer data/model/tokenizer.json)
expect_tok_error "nomoves.parquet: no Moves column" "$TMP/new1/x" --games "$IN/nomoves.parquet" "${T[@]}"
[ -e "$TMP/new1" ] && bad "a failed run left $TMP/new1 behind" || ok "a failed run creates no --out_dir"
expect_tok_error "nomoves.parquet: no Moves column" "$TMP/ref" --games "$IN/pq" "$IN/nomoves.parquet" "${T[@]}"
expect_tok_error "illegal.parquet: row 3: illegal move 'g2g4' at ply 10" "$TMP/ref" --games "$IN/illegal.parquet" "${T[@]}" --check_moves
expect_tok_error "illegal.parquet: row 3: illegal move" "$TMP/new2" --games "$IN/pq" "$IN/illegal.parquet" "${T[@]}" --check_moves
expect_tok_error "malformed.parquet: row 5: malformed move 'e2e9' at ply 7" "$TMP/new3" --games "$IN/malformed.parquet" "${T[@]}" --check_moves
expect_tok_error "illegal.jsonl: line 4: illegal move 'g2g4' at ply 10" "$TMP/new4" --games "$IN/illegal.jsonl" "${T[@]}" --check_moves
# moves that are not UCI are refused without --check_moves too: text that is not chess
expect_tok_error "malformed.parquet: row 5: malformed move 'e2e9' at ply 7" "$TMP/new9" --games "$IN/malformed.parquet" "${T[@]}"
printf '{"text": "e2e4 e7e5 g1f3 1-0"}\n{"text": "the quick brown fox 1-0"}\n' > "$TMP/prose.jsonl"
expect_tok_error "prose.jsonl: line 2: malformed move 'the' at ply 1" "$TMP/new10" --games "$TMP/prose.jsonl" "${T[@]}"
printf '{"Moves": ["e2e4\\n", "e7e5"], "Result": "1-0"}\n' > "$TMP/newline.jsonl"   # (a regex's $ passes "e2e4\n")
expect_tok_error "newline.jsonl: line 1: malformed move 'e2e4\\n' at ply 1" "$TMP/new12" --games "$TMP/newline.jsonl" "${T[@]}"
printf '{"text": "e2e4 e7e5 Nf3 1-0"}\n' > "$TMP/san.jsonl"
expect_tok_error "san.jsonl: line 1: malformed move 'Nf3' at ply 3 (not UCI" "$TMP/new11" --games "$TMP/san.jsonl" "${T[@]}"
expect_tok_error "illegal.pgn: game 2: illegal san: 'Ke4'" "$TMP/new5" --games "$IN/illegal.pgn" "${T[@]}"
expect_tok_error "nothere.parquet: no such file or directory" "$TMP/new6" --games "$IN/nothere.parquet" "${T[@]}"
expect_tok_error "bigvocab: cannot load tokenizer" "$TMP/new7" --games "$IN/pq" --tokenizer "$IN/bigvocab"
# finetune refuses a split without documents ('val_000.bin: the shard holds no documents'), so
# such shards are refused here, before anything is written
expect_tok_error "trainonly.jsonl: no game of the 8 fell into the validation split (content hash: about 2 in 100 games \
validate, --val_percent); finetune needs one in each: give more games or a larger --val_percent" "$TMP/new8" \
  --games "$IN/trainonly.jsonl" "${T[@]}"
# --val_percent: those 8 games split at 50% (both splits hold some), recorded and verified
if tok --games "$IN/trainonly.jsonl" "${T[@]}" --val_percent 50 --out_dir "$TMP/vp" > "$TMP/vp.log" 2>&1 \
   && grep -q '"val_percent": 50' "$TMP/vp/shards.json" && grep -q "verify: all shards OK" "$TMP/vp.log" \
   && "$py" -c 'import json, sys; m = json.load(open(sys.argv[1])); sys.exit(not (m["train_docs"] > 0 and m["val_docs"] > 0 and m["train_docs"] + m["val_docs"] == 8))' "$TMP/vp/shards.json"; then
  ok "--val_percent 50 splits the 8 games into both splits, recorded in shards.json, verified"
else bad "--val_percent 50: $(tail -2 "$TMP/vp.log")"; fi
expect_tok_error "empty.jsonl: no games" "$TMP/ref" --games "$IN/empty.jsonl" "${T[@]}"
[ "$(shards_sha "$TMP/ref")" = "$want" ] && ok "the shards in an existing --out_dir survive failed runs" \
  || bad "a failed run changed the shards in $TMP/ref"
finish
