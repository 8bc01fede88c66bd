#!/usr/bin/env bash
# test_predict_scale.sh [BUILD]: scripts/predict_scale.py, the table of predictions at scale
# (docs/results/2026-11-28-predictions.md), for CodeLlama-7b on 8 and 64 GPUs at seq 512 and 4096:
#   - one row per plan (8 GPUs: FSDP and --auto; 64: FSDP, HSDP 8 x 8 and --auto), each with a
#     step, tokens/s/GPU, an MFU and a binding resource;
#   - the --auto row is never slower than a plan of the same shape that fits (its search ranks
#     by the same timeline), and tokens/s = tokens per GPU per step / step, to the printed digits;
#   - a binary that does not run: exit non-zero, one line naming the job.
# ~10 s (12 dry runs).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_predict_scale
cd "$(dirname "$0")/.." || exit 2
[ -x "$build/finetune" ] || { bad "$build/finetune missing (make)"; finish; }
out=$(python3 scripts/predict_scale.py --bin "$build/finetune" --models codellama-7b --gpus 8,64 2>&1); rc=$?
rows=$(grep -c '^| codellama-7b |' <<<"$out")
[ $rc = 0 ] && [ "$rows" = 10 ] && ok "10 rows (2 + 3 plans x 2 seqs), exit 0" || bad "rc $rc, $rows rows: $out"
# every row: numbers where numbers belong, a lane name as the binding
badrows=$(grep '^| codellama-7b |' <<<"$out" | grep -vcE '^\| codellama-7b \| (8|64) \| (512|4096) \| [^|]+ \| (yes|no) \| [0-9]+ \| [0-9]+ \| [0-9.]+% \| (compute|all-gather|reduce-scatter|all-reduce|offload|host) \|$')
[ "$badrows" = 0 ] && ok "every row well formed" || bad "$badrows malformed rows: $out"
# tokens/s/GPU = 4096 tokens per GPU per step / step (printed to 1 ms and 1 token/s)
awk -F'|' '/^\| codellama-7b/ { ms = $7 + 0; t = $8 + 0; want = 4096 / (ms / 1000)
  if ((t - want) ^ 2 > (want * 0.5 / ms + 1) ^ 2) { print "row " NR ": " t " vs " want; bad = 1 } } END { exit bad }' <<<"$out" \
  && ok "tokens/s/GPU = 4096 / step in every row" || bad "tokens/s does not follow the step: $out"
# --auto >= every fitting plan of its shape
awk -F'|' '/^\| codellama-7b/ { k = $3 "," $4; t = $8 + 0
  if ($5 ~ /--auto/) auto[k] = t; else if ($6 ~ /yes/ && t > best[k]) best[k] = t }
  END { for (k in best) if (!(k in auto) || auto[k] < best[k]) { print k; bad = 1 }; exit bad }' <<<"$out" \
  && ok "--auto never slower than a fitting FSDP or HSDP plan of its shape" || bad "--auto slower: $out"
out=$(python3 scripts/predict_scale.py --bin /bin/false --models codellama-7b --gpus 8 --seqs 512 2>&1); rc=$?
[ $rc != 0 ] && [ "$(grep -c '^predict_scale: ' <<<"$out")" = 1 ] && grep -q "codellama-7b" <<<"$out" \
  && ok "a failing binary: exit $rc, one line naming the job" || bad "rc $rc: $out"
finish
