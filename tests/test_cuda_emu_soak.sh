#!/usr/bin/env bash
# A realistic soak of the CUDA backend on the emulated device (issue 11 item 3): the bundled
# default job with un-truncated games (--seq_len 512, every game its own length, so the
# micro-batches have many lengths; the device buckets them to multiples of 64), run by
# build/tests/finetune_emu (src/ as built for CUDA, kernels under the CPU emulator, emulated
# cuBLASLt and NCCL, the asynchronous emulated runtime, which fails a run on any stream
# ordering hazard). Before the bucketed shapes and the LRU GEMM plan cache, both b1 runs below
# died with "cuda: more than 256 GEMM shapes" (checked with a build of main before this change).
#
# Jobs (default hyperparameters: AdamW lr 1e-5, linear schedule, 10% warmup; the first 4
# validation games for every evaluation):
#   b1  --batch_size_per_device 1: one emulated GPU (--total_batch_size 1, 136 steps) and FSDP
#       over 2 emulated GPUs (mpiexec -n 2, --total_batch_size 2, 50 steps)
#   b4  --batch_size_per_device 4: one emulated GPU (--total_batch_size 4, 8 steps) and FSDP
#       over 2 emulated GPUs (--total_batch_size 8, 6 steps)
#   fp8_b1  b1's one-GPU job with --fp8 (an emulated sm_90), straight through, against emu_b1
# 472 optimizer steps in all (with the bf16-moments run below). Every run but fp8_b1 is done in
# two legs: --stop_at_step (half way: an evaluation, a checkpoint save, stop) then --resume latest to the end (final evaluation, HF
# export, --sample_tokens 12 on --sample_games 2 validation games). Each is checked for: exit
# 0 and no error line, the stop, the checkpoint and the resume, every step logged once, three
# evaluations, two samples, and every step's training loss and every validation loss against
# the same job on the CPU (build/finetune --device cpu, fp32, straight through, run in the
# background on one thread beside the emulated runs).
#
# Tolerance: relative 1e-3 on every loss, derived from the bf16-vs-fp32 run of
# tests/test_cuda_emu_train.sh (its bound 5e-3): bf16 storage keeps 8 significant bits, and a
# loss is a mean over many rounded terms whose errors mostly cancel. There the runs differ by
# forward rounding (step 1, before any update: rel 6.6e-6) plus drift: AdamW's sign-like steps
# move elements whose gradient is within bf16 noise of 0 by up to lr a step, 8 x 5e-3 = 4e-2
# over its 8 steps, which gives its worst, 3.4e-4 (step 3; both measured 2026-11-26 with its
# flags). Here lr 1e-5 (warmed up, then decaying) bounds that drift by 136 x 1e-5 = 1.4e-3
# over the longest job, 30x less, so its effect stays below that run's; and a step holds 1 to
# 8 games of 137 tokens on average (the shards' mean) against 4 x 64 = 256 tokens there: the
# rounding noise averages over as few as half the tokens, sqrt(2) larger, ~1e-5. In all
# <= ~3.5e-4; we allow about 3x that. Measured 2026-11-26, steps | evaluations
# worst rel: emu_b1 6.6e-5 | 1.2e-5, emu_b4 2.5e-5 | 1.3e-5, fsdp2_b1 3.0e-5 | 4.3e-6,
# fsdp2_b4 1.3e-5 | 1.0e-5 (15x below the bound at worst). The bound was 5e-3, borrowed
# from the lr 5e-3 run as is. A bug on the device's padding is far outside: padded
# positions that keep a real target (a mutant of train_micro_batch_rows) give step losses
# rel 5.2 (b1) and 0.3 (b4).
#
# --optimizer_moments bf16 (docs/results/2026-11-28-bf16-moments.md): the emu_b1 job once more
# with bf16 moments, stopped half way (a BF16 checkpoint) and resumed, against emu_b1 (fp32
# moments; the same rows in the same order on the same deterministic device, so the moments are
# the only difference): the mean training loss of the last 34 steps and the final validation
# loss. Tolerance: stochastic rounding (src/bf16_sr.h) moves each stored moment by less than
# one bf16 ulp (2^-8 relative), unbiased; an update m / sqrt(v) by at most 2^-8 + 2^-9 = 0.6%
# were every error of one sign; to first order the loss then moves by at most 0.6% of what the
# updates moved it, measured as the fp32 run's validation-loss travel (first to last
# evaluation). We allow 1% of the travel (the first-order worst case with room for the
# compounding; unbiased errors stay far below it). Measured 2026-11-28 with round-to-nearest
# storage (before SR): 0.13% (last 34 steps) and 0.11% (final val) of a travel of 0.0326.
# A bf16 run whose moments were read as fp32, or not stored at all, moves by far more.
#
# Runtime, measured on the 2-core development machine with other jobs at load 1.5-5: 7.3 min
# wall, 8.6 min of CPU before the bf16-moments run (emulated steps ~1.3 s wall at batch 1, ~5 s
# at batch 4; each of the 8 legs adds ~10 s of start, evaluation and sampling). The bf16-moments
# run adds 136 emulated steps in two legs: 486 s wall at load 7 (two such runs side by side,
# 2026-11-28), ~3 min on a quiet machine. An idle machine should take ~9 min in all.
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_cuda_emu_soak
emu=$build/tests/finetune_emu
if [ ! -x "$emu" ]; then skip_or_fail "$emu not built (needs the CUDA toolkit's headers: make CUDA=1)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
vals() { grep '"type":"eval"' "$1/metrics.jsonl" | sed -E 's/.*"val_loss":([0-9.]+).*/\1/'; }
TOL=1e-3
TOL_MOMENTS=0.01   # a fraction of the fp32 run's validation-loss travel (the header)
common=(--model_dir data/model --data_dir data/chess --seq_len 512 --max_eval_docs 4 --peak_tflops 1)
sampling=(--sample_tokens 12 --sample_games 2)

# cpu_ref NAME BPD TOTAL STEPS: the job on the CPU, straight through, exit status in .rc.
# The references run in the background, one thread, beside the emulated runs.
cpu_ref() {
  OMP_NUM_THREADS=1 "$build/finetune" --device cpu "${common[@]}" --batch_size_per_device "$2" --total_batch_size "$3" \
    --max_steps "$4" --eval_every $(($4 / 2)) --out_dir "$tmp/cpu_$1" >"$tmp/cpu_$1.log" 2>&1
  echo $? >"$tmp/cpu_$1.rc"
}
# cpu_done NAME: wait for the references; 0 when cpu_NAME succeeded
cpu_done() {
  wait "$refs_pid" 2>/dev/null
  [ "$(cat "$tmp/cpu_$1.rc" 2>/dev/null)" = 0 ] && return 0
  bad "CPU reference $1: $(tail -1 "$tmp/cpu_$1.log" 2>/dev/null)"
  return 1
}

# soak NAME RANKS BPD TOTAL STEPS REF: the job on RANKS emulated GPUs, stopped half way and
# resumed, against the CPU run cpu_REF
soak() {
  local name=$1 n=$2 bpd=$3 total=$4 steps=$5 half=$(($5 / 2)) out=$tmp/$1 t0=$SECONDS
  local launch=(timeout 900) w v s
  # ranks: one emulator worker each (2 ranks x 2 workers would oversubscribe 2 cores)
  [ "$n" -gt 1 ] && launch=(timeout 900 env CUEMU_WORKERS=1 mpiexec -n "$n")
  local flags=(--device cuda "${common[@]}" --batch_size_per_device "$bpd" --total_batch_size "$total"
               --max_steps "$steps" --eval_every "$half" "${sampling[@]}" --out_dir "$out")
  if ! "${launch[@]}" "$emu" "${flags[@]}" --stop_at_step "$half" >"$tmp/$name.1.log" 2>&1; then
    bad "$name: first leg: $(grep -m1 -i error "$tmp/$name.1.log")"; return
  fi
  if ! "${launch[@]}" "$emu" "${flags[@]}" --resume latest >"$tmp/$name.2.log" 2>&1; then
    bad "$name: resumed leg: $(grep -m1 -i error "$tmp/$name.2.log")"; return
  fi
  local secs=$((SECONDS - t0))
  ! grep -qi error "$tmp/$name.1.log" "$tmp/$name.2.log" \
    && grep -q "stopping after step $half (--stop_at_step)" "$tmp/$name.1.log" \
    && [ -d "$out/checkpoints/step_$(printf %08d "$half")" ] \
    && grep -q "resumed from .*step_$(printf %08d "$half") at step $half" "$tmp/$name.2.log" \
    && [ -f "$out/final/model.safetensors" ] \
    && ok "$name: $steps steps on $n emulated GPU(s) in two legs (save at $half, --resume latest), $secs s" \
    || bad "$name: an error line, or no stop at $half / checkpoint / resume / export: $(grep -m1 -i error "$tmp/$name.1.log" "$tmp/$name.2.log")"
  [ "$(metric "$out" loss | wc -l)" = "$steps" ] && [ "$(vals "$out" | wc -l)" = 3 ] \
    || bad "$name: $(metric "$out" loss | wc -l) step records (want $steps), $(vals "$out" | wc -l) evaluations (want 3)"
  cpu_done "$6" || return
  w=$(worst_rel "$(metric "$tmp/cpu_$6" loss)" "$(metric "$out" loss)")
  v=$(worst_rel "$(vals "$tmp/cpu_$6")" "$(vals "$out")")
  le "$w" $TOL && le "$v" $TOL && ok "$name: losses vs the CPU (bf16 vs fp32): $steps steps worst rel $w, 3 evaluations worst rel $v" \
    || bad "$name: losses vs the CPU: steps worst rel $w, evaluations worst rel $v (max $TOL)"
  s=$(grep -c '"continuation"' "$out/samples.jsonl" 2>/dev/null)
  [ "$s" = 2 ] && grep -q "^  continuation:. *[a-h1-8]" "$tmp/$name.2.log" \
    && ok "$name: 2 sampled continuations: $(grep -m1 '^  continuation' "$tmp/$name.2.log")" || bad "$name: sampling: ${s:-0} samples"
}

# moments NAME REF STEPS N: the job of the emulated run REF (one GPU, batch 1) with
# --optimizer_moments bf16, in two legs (a BF16 checkpoint at the half, resumed), against REF's
# fp32 moments: the mean training loss of the last N steps and the final validation loss, each
# within TOL_MOMENTS relative (see the top). No sampling (REF checked it).
moments() {
  local name=$1 ref=$tmp/$2 steps=$3 nlast=$4 half=$(($3 / 2)) out=$tmp/$1 t0=$SECONDS
  local flags=(--device cuda "${common[@]}" --batch_size_per_device 1 --total_batch_size 1 --max_steps "$steps"
               --eval_every "$half" --optimizer_moments bf16 --out_dir "$out")
  timeout 900 "$emu" "${flags[@]}" --stop_at_step "$half" >"$tmp/$name.1.log" 2>&1 \
    && timeout 900 "$emu" "${flags[@]}" --resume latest >"$tmp/$name.2.log" 2>&1 \
    || { bad "$name: $(grep -m1 -i error "$tmp/$name.1.log" "$tmp/$name.2.log")"; return; }
  local ck; ck=$out/checkpoints/step_$(printf %08d "$half")/optimizer.safetensors
  grep -q "resumed from .*step_$(printf %08d "$half") at step $half" "$tmp/$name.2.log" \
    && [ "$(python3 -c 'import json,struct,sys
f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; h=json.loads(f.read(n))
print(" ".join(sorted({v["dtype"] for k,v in h.items() if k!="__metadata__"})))' "$ck")" = BF16 ] \
    && ok "$name: $steps steps with bf16 moments in two legs (a BF16 checkpoint at $half, resumed), $((SECONDS - t0)) s" \
    || bad "$name: no resume at $half, or its checkpoint's moments are not BF16"
  local m32 m16 v32 v16 travel dm dv
  m32=$(metric "$ref" loss | tail -n "$nlast" | awk '{ s += $1 } END { printf "%.6f", s / NR }')
  m16=$(metric "$out" loss | tail -n "$nlast" | awk '{ s += $1 } END { printf "%.6f", s / NR }')
  v32=$(vals "$ref" | tail -1) v16=$(vals "$out" | tail -1)
  travel=$(vals "$ref" | awk 'NR == 1 { a = $1 } { b = $1 } END { d = a - b; printf "%.6f", d < 0 ? -d : d }')
  dm=$(awk -v a="$m32" -v b="$m16" -v t="$travel" 'BEGIN { d = a - b; printf "%.2e", (d < 0 ? -d : d) / t }')
  dv=$(awk -v a="$v32" -v b="$v16" -v t="$travel" 'BEGIN { d = a - b; printf "%.2e", (d < 0 ? -d : d) / t }')
  local what="bf16 vs fp32 moments: mean loss of the last $nlast steps $m16 vs $m32 ($dm of the val loss's travel"
  what="$what $travel), final val loss $v16 vs $v32 ($dv); max $TOL_MOMENTS"
  le "$dm" $TOL_MOMENTS && le "$dv" $TOL_MOMENTS && ok "$name: $what" || bad "$name: $what"
}

{ cpu_ref b1_1 1 1 136; cpu_ref b1_2 1 2 50; cpu_ref b4_4 4 4 8; cpu_ref b4_8 4 8 6; } &
refs_pid=$!
soak emu_b1 1 1 1 136 b1_1
moments emu_b1_moments_bf16 emu_b1 136 34
soak emu_b4 1 4 4 8 b4_4
if command -v mpiexec >/dev/null; then
  soak fsdp2_b1 2 1 2 50 b1_2
  soak fsdp2_b4 2 4 8 6 b4_8
else
  skip_or_fail "FSDP over 2 emulated GPUs (needs mpiexec)"
fi
# --fp8 (issue 37 item 4): emu_b1's job again with the decoder linears' forward, dX and dW
# GEMMs in FP8 (an emulated sm_90, FT_EMU_COMPUTE_CAPABILITY=9.0), straight through, its losses
# against emu_b1's (bf16). The bound is the issue's 1%, on two readings: every step's loss
# (one game of ~137 tokens a step: FP8's per-operand error of 2^-4 relative averages over
# few terms, the noisiest reading), and the means over 8 windows of 17 steps (what a loss
# curve shows). Measured 2026-11-29 with dW in FP8 and the fused amax
# (docs/results/2026-11-29-fp8-soak.md): steps worst rel 7.7e-4, 17-step means 1.2e-4 (13x
# and 80x inside the bound; 6.5e-4 and 1.0e-4 with dW in bf16 the day before). Runtime: 1.5x the bf16 job's
# steps under the emulator (the FP8 conversions run in software): 674 s wall beside a bf16
# run of 454 s at load ~10 on 2 cores, so about 3 more minutes on an idle machine.
fp8_soak() {
  local out=$tmp/fp8_b1 t0=$SECONDS w m
  if ! timeout 1800 env FT_EMU_COMPUTE_CAPABILITY=9.0 "$emu" --device cuda "${common[@]}" --batch_size_per_device 1 \
      --total_batch_size 1 --max_steps 136 --eval_every 68 --fp8 --out_dir "$out" >"$tmp/fp8_b1.log" 2>&1; then
    bad "fp8_b1: $(grep -m1 -i error "$tmp/fp8_b1.log")"; return
  fi
  [ "$(metric "$out" loss | wc -l)" = 136 ] && [ "$(metric "$tmp/emu_b1" loss | wc -l)" = 136 ] \
    || { bad "fp8_b1: $(metric "$out" loss | wc -l) step records, emu_b1 $(metric "$tmp/emu_b1" loss | wc -l) (want 136)"; return; }
  w=$(worst_rel "$(metric "$tmp/emu_b1" loss)" "$(metric "$out" loss)")
  m=$(paste <(metric "$tmp/emu_b1" loss) <(metric "$out" loss) | awk '
    { a += $1; b += $2 } NR % 17 == 0 { r = (b - a) / a; if (r < 0) r = -r; if (r > w) w = r; a = b = 0 }
    END { printf "%.2e", w }')
  le "$w" 1e-2 && le "$m" 1e-2 && [ "$(metric "$out" loss)" != "$(metric "$tmp/emu_b1" loss)" ] \
    && ok "fp8_b1: 136 --fp8 steps vs bf16's in $((SECONDS - t0)) s: step losses worst rel $w, 17-step means worst rel $m (max 1e-2)" \
    || bad "fp8_b1: step losses worst rel $w, 17-step means worst rel $m (max 1e-2; identical means FP8 did not run)"
}
fp8_soak

wait   # the CPU references, when a run ended before comparing
finish
