#!/usr/bin/env bash
# scripts/legal_moves.py (the legal-move rate of sampled continuations) on hand-made samples
# whose answers are known: legal openings, castling, promotion, an illegal move, a malformed
# token, a move split across the prompt/continuation boundary, a result token; then on the
# samples of a real (tiny) training run, whose totals must be self-consistent.
set -u
build=${1:-build}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
sf=$(command -v stockfish || echo /usr/games/stockfish)
if [ ! -x "$sf" ]; then
  if [ "${CI:-}" = true ]; then bad "stockfish missing"; else echo "skip: stockfish not installed"; fi
  echo "test_legal_moves: $pass passed, $fail failed"; [ $fail -eq 0 ]; exit
fi
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
"$build/finetune" --model_dir data/model --data_dir data/chess --seq_len 64 --max_steps 1 --batch_size_per_device 1 \
  --total_batch_size 1 --sample_tokens 4 --sample_games 1000 --out_dir "$tmp/many" >/dev/null 2>"$tmp/many.err"
grep -q "flag --sample_games: 1000 exceeds the 231 games" "$tmp/many.err" && ok "too many --sample_games: $(cat "$tmp/many.err")" || bad "too many games: $(cat "$tmp/many.err")"
echo "test_legal_moves: $pass passed, $fail failed"
[ $fail -eq 0 ]
