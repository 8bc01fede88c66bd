#!/usr/bin/env bash
# test_make_run.sh BUILD_DIR: README's first command, `make run`, end to end as a user runs it
# (the Makefile target: finetune with the default flags, then scripts/legal_moves.py and the
# plot step), shortened to 20 optimizer steps (RUN_STEPS) into a temporary directory (RUN_OUT);
# every other flag is the default job's. Checks: exit 0; the resolved config line carries the
# default flags; 20 train records and a final evaluation in metrics.jsonl; final/ holds the
# Hugging Face export; samples.jsonl holds the 64 sampled games; Stockfish judged them (when
# it is installed: scripts/deps.sh installs it for the tests, so a failure under CI=true); the
# plot step wrote a fresh metrics.png (python3-matplotlib: scripts/deps.sh installs it for the tests), and
# those two are the run's last lines. About 6 s on 2 cores.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_make_run
[ -x "$bin" ] || { bad "$bin not built"; finish; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# -o: the binary the suite tests is used as it is (never rebuilt under the other suites)
out=$(make -s --no-print-directory -o "$build/finetune" run BUILD="$build" RUN_STEPS=20 RUN_OUT="$tmp/default" 2>&1); rc=$?
check "make run RUN_STEPS=20: exit 0 (rc $rc)" test "$rc" = 0
[ "$rc" = 0 ] || printf '%s\n' "$out" | tail -5
check "the default job's flags (pack, seq 256, batch 8 of 16, lr 5e-3, 40 tokens x 64 games)" \
  grep -q "batch_size_per_device=8 total_batch_size=16 seq_len=256 pack=true .*learning_rate=0.005 .*max_steps=20 .*sample_tokens=40 sample_games=64" <<<"$out"
n=$(grep -c '"type":"train"' "$tmp/default/metrics.jsonl" 2>/dev/null)
check "20 train records in metrics.jsonl (found ${n:-0})" test "${n:-0}" = 20
check "a final evaluation in metrics.jsonl" grep -q '"type":"eval","step":20,' "$tmp/default/metrics.jsonl"
check "final/ holds the Hugging Face export" test -s "$tmp/default/final/model.safetensors" -a -s "$tmp/default/final/config.json"
n=$(grep -c '"continuation"' "$tmp/default/samples.jsonl" 2>/dev/null)
check "samples.jsonl: 64 sampled games (found ${n:-0})" test "${n:-0}" = 64
if command -v stockfish >/dev/null || [ -x /usr/games/stockfish ]; then
  check "Stockfish judged the samples: $(grep -m1 '^legal moves:' <<<"$out")" grep -qE "^legal moves: [0-9]+ of [0-9]+ attempted \([0-9.]+%\) over 64 samples" <<<"$out"
else
  skip_or_fail "stockfish not installed (scripts/deps.sh installs it for the tests)"
fi
if grep -q 'apt-get install python3-matplotlib' <<<"$out"; then
  skip_or_fail "no Python with matplotlib (scripts/deps.sh installs python3-matplotlib for the tests)"
else
  check "the plot step wrote a fresh metrics.png: $(grep -m1 'metrics.png' <<<"$out")" \
    bash -c '[ -s "$1/metrics.png" ] && [ "$1/metrics.png" -nt "$1/metrics.jsonl" ] && grep -q "^wrote $1/metrics.png" <<<"$2"' _ "$tmp/default" "$out"
  check "metrics.png is a PNG image" bash -c 'head -c 8 "$1" | od -An -c | grep -q "P   N   G"' _ "$tmp/default/metrics.png"
fi
# the run's last lines are the demo's punch lines: the legal-move rate, then the plot
last=$(printf '%s\n' "$out" | tail -n 2)
check "make run ends with the legal-move rate and the plot" grep -qzE "legal moves: .*wrote .*metrics.png" <<<"$last"
finish
