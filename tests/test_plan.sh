#!/usr/bin/env bash
# test_plan.sh BUILD_DIR: the --dry_run planner (src/plan.c) against the real allocator.
#   1. For several jobs on the CPU backend (bundled model and chess shards; batch 1/2/4, seq
#      64/128/512, with and without --gradient_checkpointing, --accumulate_grads_locally, the
#      MFU benchmark on and off; with MPI also FSDP 2, DDP 2 and HSDP 2 x 2), a 2-step training
#      run records the tracker's peak bytes per category in each metrics.jsonl train line
#      ("peak_bytes":{...}, and the total in "peak_mem_bytes"), and `--dry_run` with the same
#      flags must predict every category and the total of step 2 EXACTLY.
#      Margin 0, because nothing in the plan is approximate: model_init and fsdp_init allocate
#      every buffer once at setup, sized by --seq_len (trimming a micro-batch to its longest
#      row changes the compute, not the allocations), and nothing is freed before the end;
#      the only transient, the MFU benchmark, is planned too. A plan off by one buffer fails.
#      With several ranks the collective bytes of a steady-state step (step 2) must match too:
#      all-gather and reduce-scatter exactly, all-reduce within 16 bytes (the plan counts the
#      gradient all-reduce, not the one-double norm all-reduce over the shard group).
#   2. The comparison can fail: a plan for another job (checkpointing off vs on) is rejected.
#   3. CodeLlama-7b (data/configs/codellama-7b, bf16 with --device cuda): the bytes follow
#      from the parameter count (P = 6,738,546,688; 2 + 12 + 4 bytes per parameter sharded, plus
#      one micro-batch's root + layer gradients); FSDP over 4 ranks fits 80 GB, one GPU without
#      sharding does not (18 x 6.7e9 bytes > 80 GiB); the reported largest batch fits and the
#      next one does not.
#   4. Flag handling: --dry_run needs no weights and no data; --world_size without --dry_run,
#      --device cuda without a GPU (also at 2 ranks: once) and a non-dividing --dp_shard give
#      one error line.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_plan
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
cats="params gathered grads optimizer activations workspace total"

# planned bytes of category $2 (or all_gather / reduce_scatter / all_reduce) in report $1
planned() { awk -v c="$2" '$1 == c { print $2; exit }' "$1"; }
# field $2 of the step-2 train line of metrics.jsonl $1
step2() { train_field "$1" 2 "$2"; }
# measured peak bytes of category $2 after step 2 ("peak_bytes":{...}; the total: peak_mem_bytes)
measured() {
  if [ "$2" = total ]; then step2 "$1" peak_mem_bytes
  else grep '"type":"train","step":2,' "$1" | sed -nE "s/.*\"peak_bytes\":\{.*\"$2\":([0-9]+).*/\1/p"; fi
}

# compare_plan NAME PLAN_FILE METRICS_FILE: 0 when every category matches exactly
compare_plan() {
  local name="$1" planf="$2" metrics="$3" c p m diffs=""
  for c in $cats; do
    p=$(planned "$planf" "$c"); m=$(measured "$metrics" "$c")
    if [ -z "$p" ] || [ -z "$m" ]; then diffs="$diffs $c:missing(plan '$p', measured '$m')"
    elif [ "$p" != "$m" ]; then diffs="$diffs $c:plan=$p,measured=$m"; fi
  done
  [ -z "$diffs" ] && return 0
  echo "$diffs"; return 1
}

# case_run NAME RANKS flags...: train 2 steps, dry-run the same flags, compare
case_run() {
  local name="$1" n="$2"; shift 2
  local d="$tmp/$name" rc
  local run=(--max_steps 2 --max_eval_docs 4 --learning_rate 1e-3 --out_dir "$d" "$@")
  if [ "$n" -eq 1 ]; then "$bin" "${run[@]}" > "$d.log" 2>&1; rc=$?
  else timeout 300 mpiexec -n "$n" "$bin" "${run[@]}" > "$d.log" 2>&1; rc=$?; fi
  [ $rc -eq 0 ] || { bad "$name: training run failed: $(grep -m1 error "$d.log")"; return; }
  "$bin" --dry_run --world_size "$n" "$@" > "$d.plan" 2>&1 || { bad "$name: --dry_run failed: $(cat "$d.plan")"; return; }
  local out
  if out=$(compare_plan "$name" "$d.plan" "$d/metrics.jsonl"); then
    ok "$name: planned = measured peak bytes per category and total ($(planned "$d.plan" total) bytes)"
  else bad "$name: plan differs from the allocator:$out"; fi
  if [ "$n" -gt 1 ]; then
    local k p m
    for k in all_gather reduce_scatter; do
      p=$(planned "$d.plan" $k); m=$(step2 "$d/metrics.jsonl" ${k}_bytes)
      [ -n "$p" ] && [ "$p" = "$m" ] && ok "$name: $k bytes of step 2 = plan ($p)" || bad "$name: $k bytes: plan '$p', step 2 '$m'"
    done
    p=$(planned "$d.plan" all_reduce); m=$(step2 "$d/metrics.jsonl" all_reduce_bytes)
    [ -n "$p" ] && [ -n "$m" ] && [ $((m - p)) -ge 0 ] && [ $((m - p)) -le 16 ] \
      && ok "$name: all_reduce bytes of step 2 = plan + $((m - p)) (scalars)" || bad "$name: all_reduce bytes: plan '$p', step 2 '$m'"
  fi
}

# ---------------------------------------------------------------- 1. plan == allocator
case_run b1_s64          1 --batch_size_per_device 1 --seq_len 64 --total_batch_size 2 --peak_tflops 1
case_run b2_s128_ckpt    1 --batch_size_per_device 2 --seq_len 128 --total_batch_size 4 --gradient_checkpointing --peak_tflops 1
case_run b4_s512_bench   1 --batch_size_per_device 4 --seq_len 512 --total_batch_size 4
case_run b2_s128_local   1 --batch_size_per_device 2 --seq_len 128 --total_batch_size 8 --accumulate_grads_locally --peak_tflops 1
if have_mpi; then
  case_run fsdp2_b2_s128      2 --batch_size_per_device 2 --seq_len 128 --total_batch_size 8 --peak_tflops 1
  case_run fsdp2_b1_ckpt_local 2 --batch_size_per_device 1 --seq_len 64 --total_batch_size 4 --gradient_checkpointing --accumulate_grads_locally
  case_run ddp2_b2_s128       2 --batch_size_per_device 2 --seq_len 128 --total_batch_size 4 --no_fsdp --peak_tflops 1
  case_run hsdp4_b1_s64       4 --batch_size_per_device 1 --seq_len 64 --total_batch_size 8 --dp_shard 2 --peak_tflops 1
else skip_or_fail "multi-rank cases (no mpiexec, or $bin built without MPI)"; fi

# ---------------------------------------------------------------- 2. the comparison can fail
"$bin" --dry_run --batch_size_per_device 2 --seq_len 128 --total_batch_size 4 --peak_tflops 1 > "$tmp/wrong.plan"
if out=$(compare_plan wrong "$tmp/wrong.plan" "$tmp/b2_s128_ckpt/metrics.jsonl"); then
  bad "a plan without checkpointing matched a checkpointed run"
else ok "a plan for another job is rejected:$out"; fi

# ---------------------------------------------------------------- 3. CodeLlama-7b
m7=data/configs/codellama-7b
C=4096; F=11008; V=32016; L=32
layer=$(( 4 * C * C + 3 * C * F + 2 * C )); root=$(( 2 * V * C + C )); P=$(( L * layer + root ))
[ $P -eq 6738546688 ] && ok "CodeLlama-7b: $P parameters" || bad "CodeLlama-7b parameter count $P"
plan7() { "$bin" --dry_run --model_dir $m7 --device cuda "$@"; }
plan7 --world_size 4 > "$tmp/7b_fsdp4.plan" 2>&1 || bad "7B FSDP 4 dry run: $(cat "$tmp/7b_fsdp4.plan")"
plan7 --world_size 1 --no_fsdp > "$tmp/7b_one.plan" 2>&1 || bad "7B one GPU dry run: $(cat "$tmp/7b_one.plan")"
# units are multiples of 64 already (no padding); bf16 working params, fp32 master + 2 moments,
# fp32 gradient slice + bf16 root and two layer gradient buffers (one reduce-scatter in flight
# while the next layer's backward runs); gathered root + 2 layers (FSDP)
expect7() {  # expect7 PLAN CATEGORY BYTES
  local got; got=$(planned "$1" "$2")
  [ "$got" = "$3" ] && ok "7B $(basename "$1" .plan): $2 = $3 bytes (arithmetic)" || bad "7B $(basename "$1" .plan): $2 = '$got', arithmetic $3"
}
expect7 "$tmp/7b_fsdp4.plan" params $(( P * 2 / 4 ))
expect7 "$tmp/7b_fsdp4.plan" optimizer $(( P * 12 / 4 ))
expect7 "$tmp/7b_fsdp4.plan" grads $(( P * 4 / 4 + (root + 2 * layer) * 2 ))
expect7 "$tmp/7b_fsdp4.plan" gathered $(( (root + 2 * layer) * 2 ))
expect7 "$tmp/7b_one.plan" params $(( P * 2 ))
expect7 "$tmp/7b_one.plan" optimizer $(( P * 12 ))
grep -q "^fits an 80 GB GPU.*: yes" "$tmp/7b_fsdp4.plan" && ok "7B: FSDP over 4 ranks, batch 1: fits 80 GB" || bad "7B FSDP 4 does not fit: $(grep fits "$tmp/7b_fsdp4.plan")"
grep -q "^fits an 80 GB GPU.*: NO" "$tmp/7b_one.plan" && ok "7B: one GPU without sharding: does not fit 80 GB" || bad "7B on one GPU fits: $(grep fits "$tmp/7b_one.plan")"
grep -q "step time ESTIMATE" "$tmp/7b_fsdp4.plan" && grep -q "^  H100-SXM5-80GB" "$tmp/7b_fsdp4.plan" && grep -q "^  A100-SXM4-80GB" "$tmp/7b_fsdp4.plan" \
  && ok "7B: step-time estimate for A100 and H100, labelled" || bad "7B: step-time estimate missing"
# the reported largest batch fits and one more does not, with and without checkpointing
for ck in "without" "with"; do
  flag=""; [ "$ck" = with ] && flag=--gradient_checkpointing
  best=$(grep -E "^  $ck (gradient|--gradient)" "$tmp/7b_fsdp4.plan" | sed -E 's/.*checkpointing +([0-9]+).*/\1/')
  if [ -n "$best" ] && [ "$best" -gt 1 ]; then
    a=$(plan7 --world_size 4 $flag --batch_size_per_device "$best" --total_batch_size $((4 * best)) | grep "^fits")
    b=$(plan7 --world_size 4 $flag --batch_size_per_device $((best + 1)) --total_batch_size $((4 * best + 4)) | grep "^fits")
    [[ "$a" == *": yes"* ]] && [[ "$b" == *": NO"* ]] && ok "7B FSDP 4 $ck checkpointing: largest batch $best fits, $((best + 1)) does not" \
      || bad "7B $ck checkpointing: largest batch $best inconsistent: '$a' / '$b'"
  else bad "7B $ck checkpointing: no largest batch reported"; fi
done

# ---------------------------------------------------------------- 4. flags
out=$("$bin" --dry_run --model_dir $m7 --data_dir "$tmp/none" --device cuda 2>&1) && [ ! -e $m7/model.safetensors ] \
  && ok "--dry_run reads only config.json (no weights, no data dir)" || bad "--dry_run without weights/data: $out"
expect_error "--world_size is for --dry_run" --world_size 4
# --device cuda where nothing can run it (no driver, no device, or a build without CUDA):
# one clear line, exit non-zero, nothing written; under 2 MPI ranks the line appears once
if [ -x "$build/tests/gpu/cuda_probe" ] && "$build/tests/gpu/cuda_probe" >/dev/null; then
  echo "skip --device cuda failure: this machine has a GPU"
else
  expect_error "flag --device cuda: " --device cuda --out_dir "$tmp/cuda_out"
  [ ! -e "$tmp/cuda_out" ] && ok "--device cuda without a GPU leaves no output dir" || bad "--device cuda created $tmp/cuda_out"
  if command -v mpiexec >/dev/null; then
    err=$(mpiexec -n 2 "$bin" --device cuda --out_dir "$tmp/cuda_out2" 2>&1 >/dev/null); rc=$?
    [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c 'flag --device cuda')" -eq 1 ] \
      && ok "2 ranks, --device cuda without a GPU: reported once, rc $rc" || bad "2 ranks --device cuda: rc $rc '$err'"
  fi
fi
expect_error "--dp_shard: 3 does not divide the world size 4" --dry_run --world_size 4 --dp_shard 3
expect_error "--total_batch_size: 6 is not a multiple" --dry_run --world_size 4 --total_batch_size 6
expect_error "exceeds the model's max_position_embeddings" --dry_run --seq_len 1024

finish
