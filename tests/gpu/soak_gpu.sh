#!/usr/bin/env bash
# tests/gpu/soak_gpu.sh BIN [DEVICE] [KEEP_DIR]: the bundled job un-truncated on one device,
# against the CPU run of the same job (tests/gpu/first_light.sh runs it on a real GPU; it is
# the device-side twin of the emulated soak of issue 11 item 3). Games at --seq_len 512 keep
# their own lengths (every micro-batch is trimmed to its longest game), so the GEMM and
# attention shapes vary from step to step as in a real run.
#
#   1. batch 4: 100 steps straight, with eval at 50 and 100 and checkpoints; the same job
#      stopped at step 50 (--stop_at_step) and resumed (--resume latest): step logs and the
#      step-100 checkpoint bitwise equal to the straight run. With --attention native: our
#      kernels are deterministic (no atomics), cuDNN's attention backward is not (it sums dQ
#      in an fp32 accumulator, FlashAttention-2 style; cudnn-frontend switches to another
#      decomposition only when asked for determinism on Hopper), so two runs with it differ
#      in the last bits. Parts 2 and 3 run the default (cuDNN).
#   2. batch 1: 100 steps with eval at 50 and 100, then sampling of 40 tokens for 4 games
#   3. both against BIN --device cpu on the same job: per-step losses, final val loss
#   300 optimizer steps on the device in all.
#
# Tolerances (provisional until a GPU run measures them): the device stores weights,
# activations and gradients in bf16 (u = 2^-8); tests/gpu/test_gpu.sh allows a per-step
# relative loss difference of 3e-2 (~8u) over 30 steps at lr 5e-3, and we keep that for the
# first 30 steps here. Later steps drift further apart as bf16 noise in the AdamW updates
# accumulates (test_train_golden.c: sign-like updates on small-gradient elements), so steps
# 31..100 get 1e-1, and the final validation loss (an average over 64 games, much less
# noisy than one batch) 3e-2. A wrong kernel or a shape-dependent bug breaks the first step
# already or stops the descent.
#
# Output: ok/FAIL lines and "soak_gpu: N passed, M failed". Exit 0 when all passed.
# Time on an H100 (tiny model): unmeasured; the CPU reference ~1 min on 16 cores.
set -u
. "$(dirname "$0")/../lib.sh" soak_gpu
bin=${1:?usage: soak_gpu.sh BIN [DEVICE] [KEEP_DIR]}
dev=${2:-cuda}
keep=${3:-}
tmp=$(mktemp -d /tmp/ft-soak.XXXXXX)
finish_hook() {
  [ -n "$keep" ] && mkdir -p "$keep" && cp "$tmp"/*.log "$keep"/ 2>/dev/null
  rm -rf "$tmp"
}
steps=${SOAK_STEPS:-100}                  # per run (a shorter soak checks this script)
half=$((steps / 2)) stop=$(printf '%08d' $((steps / 2))) end=$(printf '%08d' "$steps")
job=(--model_dir data/model --data_dir data/chess --seq_len 512 --learning_rate 5e-3
     --max_eval_docs "${SOAK_EVAL_DOCS:-64}" --eval_every "$half" --save_every "$half" --max_steps "$steps")
b4=(--batch_size_per_device 4 --total_batch_size 4 --attention native)   # bitwise: see 1. above
b1=(--batch_size_per_device 1 --total_batch_size 1 --sample_tokens 40 --sample_games 4)
loss() { metric "$1" loss; }
val() { grep '"type":"eval"' "$1/metrics.jsonl" | tail -1 | sed -E 's/.*"val_loss":([0-9.eE+-]+).*/\1/'; }
# run LOG DIR ARGS...: BIN ARGS --out_dir $tmp/DIR, output in $tmp/LOG.log; 0, or 1 with a FAIL line
run() {
  local log=$1 dir=$2; shift 2
  "$bin" "$@" --out_dir "$tmp/$dir" >"$tmp/$log.log" 2>&1 && return 0
  bad "$log: $bin $* failed: $(grep -m1 'error' "$tmp/$log.log" || tail -1 "$tmp/$log.log")"
  return 1
}
# compare A B: worst relative loss difference in steps 1..30 and 31..100, final val loss
compare() {
  local w
  w=$(paste <(loss "$1") <(loss "$2") | awk '
    { r = ($1 - $2) / $2; if (r < 0) r = -r; if (NR <= 30) { if (r > a) a = r } else if (r > b) b = r; n++ }
    END { printf "%d %.3e %.3e", n, a, b }')
  read -r n early late <<<"$w"
  [ "$n" = "$steps" ] && awk -v a="$early" -v b="$late" 'BEGIN { exit !(a <= 3e-2 && b <= 1e-1) }' \
    && ok "$3: $n step losses vs CPU: worst rel $early (steps 1-30, <= 3e-2), $late (31+, <= 1e-1)" \
    || bad "$3: losses vs CPU: $n steps, worst rel $early (steps 1-30, limit 3e-2), $late (31+, limit 1e-1)"
  local vd vc
  vd=$(val "$1"); vc=$(val "$2")
  awk -v a="$vd" -v b="$vc" 'BEGIN { r = (a - b) / b; if (r < 0) r = -r; exit !(a + 0 == a && r <= 3e-2) }' \
    && ok "$3: final val loss $vd vs CPU $vc" || bad "$3: final val loss $vd vs CPU $vc (limit rel 3e-2)"
}

# ---------------------------------------------------------------- 1. batch 4, stop and resume
if run b4 b4 --device "$dev" "${job[@]}" "${b4[@]}"; then
  first=$(loss "$tmp/b4" | head -1); last=$(loss "$tmp/b4" | tail -1)
  # 100 steps at lr 5e-3 take the loss down by more than 0.5 nats; a short soak (SOAK_STEPS,
  # tests/test_soak_script.sh) only needs it to fall
  drop=$([ "$steps" -ge 50 ] && echo 0.5 || echo 0)
  awk -v a="$first" -v b="$last" -v d="$drop" 'BEGIN { exit !(b < a - d) }' && ok "batch 4 on $dev: loss $first -> $last" \
    || bad "batch 4 on $dev: loss does not fall by $drop: $first -> $last"
  if run b4r b4r --device "$dev" "${job[@]}" "${b4[@]}" --stop_at_step "$half" &&
     run b4r2 b4r --device "$dev" "${job[@]}" "${b4[@]}" --resume latest; then
    grep -q "resumed from .*step_$stop at step $half" "$tmp/b4r2.log" && ok "resumed at step $half" || bad "no resume message at step $half"
    [ "$(step_logs "$tmp/b4")" = "$(step_logs "$tmp/b4r")" ] && ok "stop at $half + resume: the $steps step logs equal the straight run's" \
      || bad "stop + resume: step logs differ from the straight run"
    for f in model.safetensors optimizer.safetensors; do
      cmp -s "$tmp/b4/checkpoints/step_$end/$f" "$tmp/b4r/checkpoints/step_$end/$f" \
        && ok "stop + resume: $f at step $steps bitwise equal" || bad "stop + resume: $f at step $steps differs"
    done
  fi
fi

# ---------------------------------------------------------------- 2. batch 1 with sampling
if run b1 b1 --device "$dev" "${job[@]}" "${b1[@]}"; then
  n=$(grep -c '"continuation":"[^"]' "$tmp/b1/samples.jsonl" 2>/dev/null)
  [ "${n:-0}" = 4 ] && ok "batch 1 on $dev: 4 sampled continuations" || bad "batch 1: ${n:-0} of 4 sampled continuations"
fi

# ---------------------------------------------------------------- 3. against the CPU
if [ "$dev" != cpu ]; then
  [ -d "$tmp/b4" ] && run b4cpu b4cpu --device cpu "${job[@]}" "${b4[@]}" && compare "$tmp/b4" "$tmp/b4cpu" "batch 4"
  [ -d "$tmp/b1" ] && run b1cpu b1cpu --device cpu "${job[@]}" "${b1[@]}" && compare "$tmp/b1" "$tmp/b1cpu" "batch 1"
fi
finish
