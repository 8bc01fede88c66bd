#!/usr/bin/env bash
# scripts/legal_moves.py (the legal-move rate of sampled continuations) on hand-made samples
# whose answers are known: legal openings, castling, promotion, an illegal move, a malformed
# token, a move split across the prompt/continuation boundary, a result token; then on the
# samples of a real (tiny) training run, whose totals must be self-consistent and whose
# prompts must be the openings of the validation games they name.
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_legal_moves
sf=$(command -v stockfish || echo /usr/games/stockfish)
if [ ! -x "$sf" ]; then skip_or_fail "stockfish not installed"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# case "prompt" "continuation" expected_legal expected_attempted reason-substring
cases=(
  "e2e4 e7e5|| g1f3 b8c6 f1c4|3|3|end of sample"
  "e2e4 e7e5|| g1f3 b8c6 e1e3 a2a3|2|3|illegal move e1e3"
  "e2e4 e7e5 g1f3 b8c6 f1c4 g8f6|| e1g1 f8c5|2|2|end of sample"
  "e2e4 e7e5|| g1f3 zz9 a2a3|1|2|malformed move 'zz9'"
  "e2e4 e7|e5 g1f3|2|2|end of sample"
  "e2e4 e7e5|| d1h5 1-0|1|1|result 1-0"
  "a2a4 h7h5 a4a5 h5h4 a5a6 h4h3 a6b7 h3g2|| b7a8q g2h1q|2|2|end of sample"
  "a2a4 h7h5 a4a5 h5h4 a5a6 h4h3 a6b7 h3g2|| b7a8k|0|1|malformed move 'b7a8k'"
)
i=0
for c in "${cases[@]}"; do
  IFS='|' read -r prompt cont want_l want_a why <<<"${c/||/|}"
  d=$tmp/c$i; mkdir -p "$d"
  python3 -c 'import json,sys; print(json.dumps({"game":0,"prompt":sys.argv[1],"continuation":sys.argv[2],"eos":False}))' \
    "$prompt" "$cont" >"$d/samples.jsonl"
  out=$(python3 scripts/legal_moves.py "$d" 2>&1)
  line=$(head -1 <<<"$out")
  if [[ "$line" == "game 0: $want_l legal of $want_a attempted ("*"$why"* ]]; then ok "'$prompt' + '$cont' -> $line"
  else bad "'$prompt' + '$cont' -> '$out' (wanted $want_l of $want_a, $why)"; fi
  i=$((i + 1))
done

# files that are not samples: one line naming the file (and line), exit 2; no traceback, and no
# "0 of 0 attempted (0.0%)" for an empty file
# case "file content (printf)" expected-message
bad_files=(
  "|samples.jsonl: no samples"
  '[1, 2]\n|samples.jsonl:1: not a sample'
  '{"game": 0, "prompt": "e2e4"}\n|samples.jsonl:1: not a sample'
  '{"game": 0, "prompt": "e2e4", "continuation": " e7e5"}\n{"game": 1, "prom|samples.jsonl:2: not JSON'
)
for c in "${bad_files[@]}"; do
  d=$tmp/bf$i; mkdir -p "$d"; i=$((i + 1))
  printf "${c%%|*}" > "$d/samples.jsonl"
  out=$(python3 scripts/legal_moves.py "$d" 2>&1); rc=$?
  [ $rc = 2 ] && [ "$(grep -c . <<<"$out")" = 1 ] && [[ "$out" == "legal_moves: $d/${c#*|}"* ]] \
    && ok "bad samples.jsonl -> $out" || bad "bad samples.jsonl '${c%%|*}' -> rc $rc: $out"
done

# a real run: 3 samples written to samples.jsonl, totals add up over the samples
"$build/finetune" --model_dir data/model --data_dir data/chess --batch_size_per_device 4 --total_batch_size 4 \
  --seq_len 64 --max_steps 2 --sample_tokens 12 --sample_games 3 --out_dir "$tmp/run" >"$tmp/run.log" 2>&1 \
  || bad "training run with --sample_games 3: $(tail -1 "$tmp/run.log")"
n=$(grep -c '"continuation"' "$tmp/run/samples.jsonl" 2>/dev/null)
[ "$n" = 3 ] && ok "--sample_games 3 wrote 3 samples" || bad "samples.jsonl has '$n' samples"
js=$(python3 scripts/legal_moves.py "$tmp/run" --json 2>&1)
python3 - "$js" <<'PY' && ok "real samples checked: $js" || bad "real samples: $js"
import json, sys
r = json.loads(sys.argv[1])
sys.exit(0 if r["samples"] == 3 and 0 <= r["legal"] <= r["attempted"] else 1)
PY
# known answers: the prompts are the first 12 tokens of validation games 0, 1, 2, decoded here
# independently of finetune (val_000.bin through scripts/tokenize_shards.py, tokenizer.json)
python3 - "$tmp/run/samples.jsonl" <<'PY' && ok "the 3 prompts are validation games 0-2's openings" || bad "prompts differ from validation games 0-2 (see above)"
import json, sys
sys.path.insert(0, "scripts")
from tokenize_shards import read_shard
_, off, toks = read_shard("data/chess/val_000.bin")
tok = json.load(open("data/model/tokenizer.json"))
piece = {i: p for p, i in tok["model"]["vocab"].items()}
for t in tok.get("added_tokens", []):
    piece.setdefault(t["id"], t["content"])
special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
samples = [json.loads(line) for line in open(sys.argv[1])]
good = [s["game"] for s in samples] == [0, 1, 2]
for s in samples:
    g = s["game"]
    text = "".join(piece.get(i, "") for i in toks[off[g]:off[g + 1]][:12] if i not in special).replace("\u2581", " ")
    text = text[1:] if text.startswith(" ") else text
    if text != s["prompt"]:
        print("game %d: decoded %r, sample %r" % (g, text, s["prompt"]))
        good = False
sys.exit(0 if good else 1)
PY
"$build/finetune" --model_dir data/model --data_dir data/chess --seq_len 64 --max_steps 1 --batch_size_per_device 1 \
  --total_batch_size 1 --sample_tokens 4 --sample_games 1000 --out_dir "$tmp/many" >/dev/null 2>"$tmp/many.err"
grep -q "flag --sample_games: 1000 exceeds the 231 games" "$tmp/many.err" && ok "too many --sample_games: $(cat "$tmp/many.err")" || bad "too many games: $(cat "$tmp/many.err")"
finish
