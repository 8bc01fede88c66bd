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
#      --offload_optimizer (one process and FSDP 2): the host category equals the plan too.
#      --keep_params_gathered (FSDP 2, full and LoRA): the whole-model gather buffer, and the
#      all-gather bytes of a step (every trained unit once; a frozen base not at all).
#      LoRA (--lora_rank, one process and FSDP 2): the frozen base has no gradient or optimizer
#      buffers, the adapters' state and activations are planned from the same tables.
#      --eval_only (1c; one process, LoRA, offload, FSDP 2, DDP 2, HSDP 2 x 2, kept gathers): the
#      closing "peak bytes" line of an evaluation equals `--dry_run --eval_only` exactly, with no
#      gradient, optimizer or host byte; the training plan of the same flags does not match it.
#   2. The comparison can fail: a plan for another job (checkpointing off vs on) is rejected.
#   3. CodeLlama-7b (data/configs/codellama-7b, bf16 with --device cuda): the bytes follow
#      from the parameter count (P = 6,738,546,688; 2 + 12 + 4 bytes per parameter sharded, plus
#      one micro-batch's root + layer gradients; the fp32 root gradient sum of the 16
#      micro-batches reuses the checkpoint gather buffer); FSDP over 4 ranks fits 80 GB, one
#      GPU without sharding does not (18 x 6.7e9 bytes > 80 GiB); the reported largest batch
#      fits and the next one does not; the NCCL communicators are counted (pure FSDP: no
#      duplicate of the world communicator).
#      --offload_optimizer: optimizer bytes move to the host line (12 P / S, plus the pinned
#      staging of two units in flight, sized by the largest slice, the root's: two fp32 gradient
#      slices 8 root / S and two bf16 parameter slices 4 root / S), the device total drops by
#      exactly 12 P / S, host bytes per node = ranks per node x per rank; one GPU
#      fits with it, and its largest batch (with and without checkpointing) is the edge.
#   3b. CodeLlama-7b --eval_only on one GPU: params 2 P bytes (12.55 GiB), no grads, optimizer or
#      host bytes (also with --offload_optimizer), fits 80 GB; its largest batch is the edge; a
#      70B-shaped model that does not fit lists sharding as the one change; the step-time estimate is a
#      forward micro-batch (under 1/2.5 of a one-micro-batch training step's, no backward or optimizer op).
#   4. --fp8 (7B, one micro-batch): the forward GEMMs' and the backward's (dX and dW) rows at
#      half the bf16 time on the H100 (the FP8 peak), the same on the A100 (none), the same
#      FLOPs, more memory-bound bytes; no bf16 layer GEMM row left; fewer bytes with the fused
#      amax than with FT_TEST_FP8_UNFUSED=1 (each amax by its own pass).
#      The step-time estimate (src/plan_time.c), 7B on 4 and 1 H100-class ranks at batch 1 and
#      16, and with --offload_optimizer: the per-class rows add up to the total on every device
#      (printed to 0.01 ms: 5 rows, 6 with the offload row, each off by at most 0.005 plus the
#      total's 0.005 -> |sum - total| <= 0.035 ms); the offload row = host AdamW bytes / 50 GB/s
#      (derived here from P), the device optimizer op keeps 8 of its 38 bytes per element;
#      the gemm row equals FLOPs / (0.69 x 989e12) computed here from the shapes (the layers'
#      matmuls and the lm_head's); GEMM time doubles with the tokens; attention
#      time doubles when T doubles at the same tokens per step (quadratic in T per
#      sequence); the attention rows by path (cuDNN, native wmma, SIMT for a head_dim that is
#      not a multiple of 16: backward/forward FLOPs 2.5 or 3.5, rates 0.25 / 0.10 of peak, SIMT
#      linear in the tokens); collective link time = bytes / 450 GB/s and scales as (W-1)/W from 4 to 8
#      ranks (ratios within 1e-3: the values are 20+ ms,
#      printed to 0.01 ms, so rounding moves a ratio by < 1e-3); MFU and tokens/s printed;
#      FSDP 4 at batch 1 (gathers exposed) is told --keep_params_gathered's predicted step,
#      the numbers of that flag's own plan, and jobs with nothing to gain are not. The ops
#      counted from the model code: the recomputed forward of --gradient_checkpointing equals
#      the forward (none without it); LoRA's frozen lm_head runs 2 of 3 GEMMs, and its layer
#      forward moves more bytes than the full job's (adapter residual reads, split RoPE).
#   5. Flag handling: --dry_run needs no weights and no data; --world_size without --dry_run,
#      --device cuda without a GPU (also at 2 ranks: once) and a non-dividing --dp_shard give
#      one error line.
#   6. The device operations --dry_run counts per step (the issue floor of each op) against
#      the emulated device's count (7 layouts: checkpointing, native attention, LoRA, offload,
#      FSDP 2),
#      and the bundled model's predicted tokens/s bounded by that floor.
#   7. NCCL's memory in the fit check, at its edge on the emulated device: FSDP over 2
#      emulated H100s (81559 MiB; FT_EMU_CONTEXT_MIB=992 held back for the context and the
#      libraries, the plan's 1 GiB less the cuBLASLt workspace the arena holds), each NCCL
#      communicator holding back FT_EMU_NCCL_COMM_BYTES, the figure given to
#      --nccl_gib_per_comm, chosen so that the room left lies between the arenas of batch 3
#      and batch 4: --dry_run's largest batch is 3, batch 3 starts and trains a step (the
#      bootstrap line: 2 communicators took what was planned), batch 4 is refused by the
#      startup check; with the default assumption (0.98 GiB) the plan's largest batch is
#      the flag's maximum, so the figure decides it.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_plan
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
cats="params gathered grads optimizer activations workspace total host"

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
# LoRA: a frozen base (working parameters only) + the adapters' state, the per-target (N, r) activations
# --offload_optimizer: master + moments + one gradient slice in the host category
case_run offload_b2_s64 1 --batch_size_per_device 2 --seq_len 64 --total_batch_size 4 --peak_tflops 1 --offload_optimizer
case_run lora_b2_s64_ckpt 1 --batch_size_per_device 2 --seq_len 64 --total_batch_size 4 --gradient_checkpointing --peak_tflops 1 \
  --lora_rank 8 --lora_targets q,k,v,o,gate,up,down
# --optimizer_moments bf16: the moments 2 bytes an element each; the optimizer category is then
# master 4 + moments 4 = 8 bytes an element against 12 (the same run in fp32: b1_s64)
case_run moments_bf16_b1_s64 1 --batch_size_per_device 1 --seq_len 64 --total_batch_size 2 --peak_tflops 1 \
  --optimizer_moments bf16
o32=$(planned "$tmp/b1_s64.plan" optimizer) o16=$(planned "$tmp/moments_bf16_b1_s64.plan" optimizer)
[ -n "$o32" ] && [ $((o16 * 3)) -eq $((o32 * 2)) ] \
  && ok "--optimizer_moments bf16: optimizer state $o16 bytes = 2/3 of fp32's $o32" \
  || bad "--optimizer_moments bf16: optimizer state '$o16' bytes, fp32 '$o32' (want 2/3)"
if have_mpi; then
  case_run fsdp2_b2_s128      2 --batch_size_per_device 2 --seq_len 128 --total_batch_size 8 --peak_tflops 1
  case_run fsdp2_b1_ckpt_local 2 --batch_size_per_device 1 --seq_len 64 --total_batch_size 4 --gradient_checkpointing --accumulate_grads_locally
  case_run ddp2_b2_s128       2 --batch_size_per_device 2 --seq_len 128 --total_batch_size 4 --no_fsdp --peak_tflops 1
  case_run hsdp4_b1_s64       4 --batch_size_per_device 1 --seq_len 64 --total_batch_size 8 --dp_shard 2 --peak_tflops 1
  case_run lora_fsdp2_b2_s64  2 --batch_size_per_device 2 --seq_len 64 --total_batch_size 8 --peak_tflops 1 --lora_rank 4
  case_run moments_bf16_lora_fsdp2 2 --batch_size_per_device 2 --seq_len 64 --total_batch_size 8 --peak_tflops 1 \
    --lora_rank 4 --optimizer_moments bf16
  case_run offload_fsdp2_b2_s64 2 --batch_size_per_device 2 --seq_len 64 --total_batch_size 8 --peak_tflops 1 --offload_optimizer
  # --keep_params_gathered: one gather buffer of the whole model, every unit gathered once per step
  case_run keep_fsdp2_b1_s64  2 --batch_size_per_device 1 --seq_len 64 --total_batch_size 8 --peak_tflops 1 --keep_params_gathered
  case_run keep_lora_fsdp2_b1 2 --batch_size_per_device 1 --seq_len 64 --total_batch_size 4 --peak_tflops 1 --lora_rank 4 \
    --keep_params_gathered
else skip_or_fail "multi-rank cases (no mpiexec, or $bin built without MPI)"; fi

# ---------------------------------------------------------------- 1b. sampling's inference model
# --sample_tokens builds a (1, 12 + N) model after training, beside the training buffers: the
# plan's "sampling" line (which the GPU arena adds to its size, plan_arena_bytes) must be what
# the tracker's peak grows by (the final "peak memory" line; its bytes are exact). Full and LoRA.
sample_case() {
  local name=$1 d=$tmp/$1 pt ps m; shift
  local flags=(--batch_size_per_device 2 --seq_len 64 --total_batch_size 2 --peak_tflops 1 --sample_tokens 20 "$@")
  "$bin" --max_steps 1 --max_eval_docs 2 --out_dir "$d" "${flags[@]}" > "$d.log" 2>&1 \
    || { bad "$name: training run failed: $(grep -m1 error "$d.log")"; return; }
  "$bin" --dry_run "${flags[@]}" > "$d.plan" 2>&1 || { bad "$name: --dry_run failed: $(cat "$d.plan")"; return; }
  pt=$(planned "$d.plan" total); ps=$(planned "$d.plan" sampling)
  m=$(sed -nE 's/^finetune: peak memory .* \(([0-9]+) bytes\).*/\1/p' "$d.log")
  [ -n "$ps" ] && [ "$ps" -gt 0 ] && [ -n "$m" ] && [ "$((pt + ps))" = "$m" ] \
    && ok "$name: plan total $pt + sampling $ps = the measured peak after sampling" \
    || bad "$name: plan total '$pt' + sampling '$ps' vs measured peak after sampling '$m'"
}
sample_case sample_b2_s64
sample_case sample_lora_b2_s64 --lora_rank 4
"$bin" --dry_run --batch_size_per_device 2 --seq_len 64 --total_batch_size 2 > "$tmp/nosample.plan" 2>&1
[ -z "$(planned "$tmp/nosample.plan" sampling)" ] && ok "no sampling line without --sample_tokens" \
  || bad "a sampling line without --sample_tokens: $(grep sampling "$tmp/nosample.plan")"

# ---------------------------------------------------------------- 1c. --eval_only
# An evaluation allocates what the forward reads: the working parameters (and FSDP's gathers),
# one residual buffer and one activation set, the forward's scratch; no gradients, optimizer
# state (none on the host either with --offload_optimizer) or backward scratch. Its closing
# "peak bytes" line (the tracker's, per category) must equal `--dry_run --eval_only` exactly,
# and hold no gradient or optimizer byte.
eval_measured() { sed -nE "s/^finetune: peak bytes:.* $2 ([0-9]+).*/\1/p" "$1"; }
eval_case() {   # eval_case NAME RANKS flags...
  local name="$1" n="$2" d="$tmp/$1" c p m diffs=""; shift 2
  local run=(--eval_only --max_eval_docs 4 "$@")
  if [ "$n" -eq 1 ]; then "$bin" "${run[@]}" > "$d.log" 2>&1
  else timeout 300 mpiexec -n "$n" "$bin" "${run[@]}" > "$d.log" 2>&1; fi || { bad "$name: --eval_only failed: $(tail -1 "$d.log")"; return; }
  "$bin" --dry_run --world_size "$n" "${run[@]}" > "$d.plan" 2>&1 || { bad "$name: --dry_run failed: $(cat "$d.plan")"; return; }
  for c in $cats; do
    p=$(planned "$d.plan" "$c"); m=$(eval_measured "$d.log" "$c")
    if [ -z "$p" ] || [ -z "$m" ]; then diffs="$diffs $c:missing(plan '$p', measured '$m')"
    elif [ "$p" != "$m" ]; then diffs="$diffs $c:plan=$p,measured=$m"; fi
  done
  [ -z "$diffs" ] && ok "$name: planned = measured peak bytes per category and total ($(planned "$d.plan" total) bytes)" \
    || bad "$name: plan differs from the allocator:$diffs"
  [ "$(eval_measured "$d.log" grads)$(eval_measured "$d.log" optimizer)$(eval_measured "$d.log" host)" = 000 ] \
    && ok "$name: no gradient, optimizer or host bytes" || bad "$name: $(grep '^finetune: peak bytes' "$d.log")"
}
eval_case eval_b2_s64 1 --batch_size_per_device 2 --seq_len 64
eval_case eval_b2_s128_ckpt_offload 1 --batch_size_per_device 2 --seq_len 128 --gradient_checkpointing --offload_optimizer
eval_case eval_lora_b2_s64 1 --batch_size_per_device 2 --seq_len 64 --lora_rank 8 --lora_targets q,k,v,o,gate,up,down
if have_mpi; then
  eval_case eval_fsdp2_b2_s128 2 --batch_size_per_device 2 --seq_len 128
  eval_case eval_ddp2_b1_s64 2 --batch_size_per_device 1 --seq_len 64 --no_fsdp
  eval_case eval_lora_fsdp2_b2_s64 2 --batch_size_per_device 2 --seq_len 64 --lora_rank 4
  eval_case eval_keep_fsdp2_b1_s64 2 --batch_size_per_device 1 --seq_len 64 --keep_params_gathered --offload_optimizer
  eval_case eval_hsdp4_b1_s64 4 --batch_size_per_device 1 --seq_len 64 --dp_shard 2
else skip_or_fail "multi-rank --eval_only cases (no mpiexec, or $bin built without MPI)"; fi
# it can fail: the training plan of the same flags is not the evaluation's
"$bin" --dry_run --batch_size_per_device 2 --seq_len 64 > "$tmp/eval_wrong.plan" 2>&1
[ "$(planned "$tmp/eval_wrong.plan" total)" != "$(eval_measured "$tmp/eval_b2_s64.log" total)" ] \
  && ok "--eval_only: the training plan of its flags ($(planned "$tmp/eval_wrong.plan" total) bytes) is not what it allocates" \
  || bad "--eval_only allocates what training plans"

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
# --reduce_dtype fp32 (FSDP 4, 16 micro-batches: the root summed once per step): the two layer
# gradient buffers in fp32 and no root buffer (the root's micro-batch gradients add into the
# fp32 sum, the checkpoint gather buffer); the two reduce-scatter outputs (layer slices: the
# root's once-per-step reduce-scatter writes its gradient slice directly) twice as large; reduce-scatter bytes: 16 micro-batches x 3/4 x the
# layers in fp32 + 3/4 x the root once in fp32 (bf16: the layers in 2 bytes). Changes nothing
# on the CPU (fp32 already): the CPU plan is identical.
plan7 --world_size 4 --reduce_dtype fp32 > "$tmp/7b_fsdp4_rf32.plan" 2>&1 || bad "7B FSDP 4 fp32 reduce dry run: $(cat "$tmp/7b_fsdp4_rf32.plan")"
expect7 "$tmp/7b_fsdp4_rf32.plan" grads $(( P * 4 / 4 + 2 * layer * 4 ))
expect7 "$tmp/7b_fsdp4_rf32.plan" workspace $(( $(planned "$tmp/7b_fsdp4.plan" workspace) + (layer / 4 + layer / 4) * 2 ))
expect7 "$tmp/7b_fsdp4_rf32.plan" reduce_scatter $(( 16 * 3 * (L * layer / 4) * 4 + 3 * (root / 4) * 4 ))
expect7 "$tmp/7b_fsdp4.plan" reduce_scatter $(( 16 * 3 * (L * layer / 4) * 2 + 3 * (root / 4) * 4 ))
grep -q "per-micro-batch gradients reduce-scattered in fp32" "$tmp/7b_fsdp4_rf32.plan" && ! grep -q "in fp32 (--reduce" "$tmp/7b_fsdp4.plan" \
  && ok "7B FSDP 4: --reduce_dtype fp32 named on the job line (and only there)" || bad "7B --reduce_dtype fp32: job line '$(grep '^job' "$tmp/7b_fsdp4_rf32.plan")'"
a=$("$bin" --dry_run --world_size 2 --reduce_dtype fp32 | sed -n '/^memory/,/^  total/p'); b=$("$bin" --dry_run --world_size 2 | sed -n '/^memory/,/^  total/p')
[ -n "$a" ] && [ "$a" = "$b" ] && ok "--reduce_dtype fp32 on the CPU (fp32 gradients already): the same memory plan" \
  || bad "--reduce_dtype fp32 changed the CPU plan"
grep -q "^fits an 80 GB GPU.*: yes" "$tmp/7b_fsdp4.plan" && ok "7B: FSDP over 4 ranks, batch 1: fits 80 GB" || bad "7B FSDP 4 does not fit: $(grep fits "$tmp/7b_fsdp4.plan")"
grep -q "^fits an 80 GB GPU.*: NO" "$tmp/7b_one.plan" && ok "7B: one GPU without sharding: does not fit 80 GB" || bad "7B on one GPU fits: $(grep fits "$tmp/7b_one.plan")"
grep -q "root gradient summed over micro-batches in fp32" "$tmp/7b_fsdp4.plan" && ok "7B FSDP 4, 16 micro-batches: root gradient summed in fp32" \
  || bad "7B FSDP 4: no fp32 root gradient sum: $(grep '^job' "$tmp/7b_fsdp4.plan")"
# pure FSDP: the world communicator is the shard group's; + its reduce-scatter lane
grep -q ", 2 NCCL communicator(s) at" "$tmp/7b_fsdp4.plan" && ok "7B FSDP 4: 2 NCCL communicators counted (world = shard, reduce-scatter lane)" \
  || bad "7B FSDP 4 NCCL communicators: $(grep '^fits' "$tmp/7b_fsdp4.plan")"
# a job that does not fit lists what one change would need: each line's bytes are the dry run
# of that change (exact), and the FSDP line names the fewest GPUs that fit
alt() { awk -v k="  $2" 'index($0, k) == 1 { for (i = 1; i <= NF; i++) if ($i == "total") { print $(i + 1); exit } }' "$1"; }
for change in --offload_optimizer --gradient_checkpointing "--lora_rank 16"; do
  a=$(alt "$tmp/7b_one.plan" "$change"); b=$(plan7 --world_size 1 --no_fsdp $change | awk '$1 == "total" { print $2; exit }')
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "7B one GPU, what $change would need: $a bytes = its own dry run" \
    || bad "7B one GPU, $change: listed '$a' bytes, its dry run $b"
done
grep -E "^  --(offload_optimizer|lora_rank 16).*: fits" "$tmp/7b_one.plan" | grep -c . | grep -qx 2 \
  && ok "7B one GPU: --offload_optimizer and --lora_rank 16 each fit" || bad "7B one GPU alternatives: $(grep -A5 '^what one change' "$tmp/7b_one.plan")"
nw=$(sed -nE 's/^  FSDP over ([0-9]+) GPUs.*: fits$/\1/p' "$tmp/7b_one.plan")
a=$(alt "$tmp/7b_one.plan" "FSDP over $nw GPUs"); b=$(plan7 --world_size "${nw:-0}" | awk '$1 == "total" { print $2; exit }')
[ "$nw" = 2 ] && [ "$a" = "$b" ] && ok "7B one GPU: FSDP over 2 GPUs would fit, $a bytes = its own dry run" \
  || bad "7B one GPU: FSDP alternative '$nw' GPUs, '$a' bytes vs its dry run '$b'"
# the FSDP line names the flag that kept the job from sharding: --world_size 2 with the job's
# --no_fsdp still on it is DDP over 2 and does not fit (it used to read "(--world_size 2)");
# an HSDP job's names --dp_shard; a fully sharded job's neither (below: batch 28)
fl=$(grep "^  FSDP over $nw GPUs" "$tmp/7b_one.plan"); ddp=$(plan7 --world_size "${nw:-0}" --no_fsdp | grep "^fits")
[[ "$fl" == *"(--world_size 2 without --no_fsdp)"* ]] && [[ "$ddp" == *": NO"* ]] \
  && ok "7B one GPU --no_fsdp: the FSDP line says to drop --no_fsdp (--world_size 2 --no_fsdp does not fit)" \
  || bad "7B one GPU --no_fsdp: FSDP line '$fl', --world_size 2 --no_fsdp: '$ddp'"
fl=$(plan7 --world_size 8 --dp_shard 2 --batch_size_per_device 8 --total_batch_size 64 | grep "^  FSDP over")
[[ "$fl" == *"FSDP over 8 GPUs (--world_size 8 without --dp_shard)"*": fits"* ]] \
  && ok "7B HSDP 2 x 4, batch 8: the FSDP line says to drop --dp_shard" || bad "7B HSDP batch 8: FSDP line '$fl'"
# batch 28 over 4 GPUs does not fit: the fewest GPUs that do (16), and half as many do not;
# batch 64 fits on no number of GPUs (activations are per device)
plan7 --world_size 4 --batch_size_per_device 28 --total_batch_size 112 > "$tmp/7b_b28.plan" 2>&1
nw=$(sed -nE 's/^  FSDP over ([0-9]+) GPUs.*: fits$/\1/p' "$tmp/7b_b28.plan")
if [ -n "$nw" ] && [ "$nw" -gt 4 ]; then
  half=$(plan7 --world_size $((nw / 2)) --batch_size_per_device 28 --total_batch_size $((28 * nw / 2)) | grep "^fits")
  full=$(plan7 --world_size "$nw" --batch_size_per_device 28 --total_batch_size $((28 * nw)) | grep "^fits")
  [[ "$half" == *": NO"* ]] && [[ "$full" == *": yes"* ]] && ok "7B batch 28: FSDP over $nw GPUs fits, $((nw / 2)) does not" \
    || bad "7B batch 28 over $nw GPUs: '$full' / half: '$half'"
  grep -q "^  FSDP over $nw GPUs (--world_size $nw) " "$tmp/7b_b28.plan" && ok "7B batch 28, FSDP already: the FSDP line names --world_size only" \
    || bad "7B batch 28: FSDP line '$(grep '^  FSDP over' "$tmp/7b_b28.plan")'"
else bad "7B batch 28 over 4 GPUs: FSDP alternative '$nw': $(grep -A5 '^what one change' "$tmp/7b_b28.plan")"; fi
plan7 --world_size 8 --batch_size_per_device 64 --total_batch_size 512 | grep -q "^  FSDP over more GPUs  *none up to 1024" \
  && ok "7B batch 64: no number of GPUs fits, said so" || bad "7B batch 64: FSDP alternative not 'none'"
grep -q "^what one change" "$tmp/7b_fsdp4.plan" && bad "7B FSDP 4 fits, yet lists alternatives" || ok "7B FSDP 4 fits: no alternatives listed"
n=$(plan7 --world_size 8 --dp_shard 4 | grep -o "GiB assumed for the CUDA context and the libraries, [0-9]* NCCL" | grep -o "[0-9]* NCCL$")
[ "$n" = "4 NCCL" ] && ok "7B HSDP 4 x 2: 4 NCCL communicators (world, shard, lane, replica)" || bad "7B HSDP NCCL communicators: '$n'"
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

# --offload_optimizer (issue 14 item 2): the fp32 master and the two AdamW moments move from the
# device to host memory: device total drops by exactly 12 P / S, the host line holds that plus
# the pinned staging of two units in flight (src/fsdp.c offload_step): two fp32 gradient slices
# and two bf16 parameter slices of the largest unit, the root's (8 + 4) root / S, per rank and
# per node; one GPU then fits, with and without checkpointing, and the
# reported largest batch fits while the next one does not
plan7 --world_size 1 --no_fsdp --offload_optimizer > "$tmp/7b_one_off.plan" 2>&1 || bad "7B one GPU offload dry run: $(cat "$tmp/7b_one_off.plan")"
plan7 --world_size 4 --offload_optimizer > "$tmp/7b_fsdp4_off.plan" 2>&1 || bad "7B FSDP 4 offload dry run: $(cat "$tmp/7b_fsdp4_off.plan")"
expect7 "$tmp/7b_one_off.plan" optimizer 0
expect7 "$tmp/7b_one_off.plan" host $(( P * 12 + root * 12 ))
expect7 "$tmp/7b_one_off.plan" total $(( $(planned "$tmp/7b_one.plan" total) - P * 12 ))
expect7 "$tmp/7b_one.plan" host 0
expect7 "$tmp/7b_fsdp4_off.plan" host $(( (P * 12 + root * 12) / 4 ))
expect7 "$tmp/7b_fsdp4_off.plan" total $(( $(planned "$tmp/7b_fsdp4.plan" total) - P * 12 / 4 ))
for c in params grads gathered activations workspace; do
  [ "$(planned "$tmp/7b_one_off.plan" $c)" = "$(planned "$tmp/7b_one.plan" $c)" ] || bad "7B offload changed $c"
done
pn=$(sed -nE 's/^  host memory per node: ([0-9]+) bytes .* for ([0-9]+) rank.*/\1 \2/p' "$tmp/7b_fsdp4_off.plan")
[ "$pn" = "$(( P * 12 + root * 12 )) 4" ] && ok "7B FSDP 4 offload: host memory per node = 4 ranks x (12 P + 12 root) / 4 = $(( P * 12 + root * 12 )) bytes" \
  || bad "7B FSDP 4 offload: host per node '$pn'"
grep -q "^fits an 80 GB GPU.*: yes" "$tmp/7b_one_off.plan" && ok "7B: one GPU, full fine-tune with --offload_optimizer: fits 80 GB" \
  || bad "7B one GPU offload: $(grep '^fits' "$tmp/7b_one_off.plan")"
for ck in "without" "with"; do
  flag=""; [ "$ck" = with ] && flag=--gradient_checkpointing
  plan7 --world_size 1 --no_fsdp --offload_optimizer $flag > "$tmp/7b_one_off_$ck.plan"
  best=$(grep -E "^  $ck (gradient|--gradient)" "$tmp/7b_one_off_$ck.plan" | sed -E 's/.*checkpointing +([0-9]+).*/\1/')
  if [ -n "$best" ] && [ "$best" -gt 1 ]; then
    a=$(plan7 --world_size 1 --no_fsdp --offload_optimizer $flag --batch_size_per_device "$best" --total_batch_size "$best" | grep "^fits")
    b=$(plan7 --world_size 1 --no_fsdp --offload_optimizer $flag --batch_size_per_device $((best + 1)) --total_batch_size $((best + 1)) | grep "^fits")
    [[ "$a" == *": yes"* ]] && [[ "$b" == *": NO"* ]] && ok "7B one GPU offload $ck checkpointing: largest batch $best fits, $((best + 1)) does not" \
      || bad "7B one GPU offload $ck checkpointing: largest batch $best inconsistent: '$a' / '$b'"
  else bad "7B one GPU offload $ck checkpointing: no largest batch reported"; fi
done

# the native attention backward's dS^T workspace (src/attention_ws.h): 7B (32 heads, 32 kv
# heads, T 512): one kv head's dS^T is 1 x 512^2 x 2 bytes = 512 KiB, a sequence 16 MiB;
# batch 1 -> 16 MiB, batch 4 -> two sequences per launch under the 32 MiB cap = 32 MiB;
# none with --attention cudnn (its own workspace line instead)
for bw in "1:16777216" "4:33554432"; do
  got=$(plan7 --world_size 4 --attention native --batch_size_per_device ${bw%%:*} --total_batch_size $((4 * ${bw%%:*})) \
        | awk '/dS\^T workspace/ { print $1; exit }')
  [ "$got" = "${bw#*:}" ] && ok "7B batch ${bw%%:*} native: dS^T workspace planned at $got bytes" || bad "7B batch ${bw%%:*}: dS^T workspace '$got', want ${bw#*:}"
done
! grep -q "dS^T workspace" "$tmp/7b_fsdp4.plan" && grep -q "cuDNN attention workspace" "$tmp/7b_fsdp4.plan" \
  && ok "7B --attention cudnn: the cuDNN workspace is planned, not the native one" || bad "7B cudnn plan: workspace lines wrong"

# ---------------------------------------------------------------- 3b. CodeLlama-7b --eval_only
# one GPU, no sharding: the bf16 working parameters (2 P bytes, 12.55 GiB) and the forward's
# buffers; no gradients or optimizer state (also with --offload_optimizer: no host bytes): fits
# 80 GB with room for batches in the hundreds (the training job of the same flags: 115 GiB);
# the step time is one forward micro-batch's, about a third of the training step's
plan7 --world_size 1 --no_fsdp --eval_only > "$tmp/7b_eval.plan" 2>&1 || bad "7B --eval_only dry run: $(cat "$tmp/7b_eval.plan")"
plan7 --world_size 1 --no_fsdp --eval_only --offload_optimizer > "$tmp/7b_eval_off.plan" 2>&1
expect7 "$tmp/7b_eval.plan" params $(( P * 2 ))
for f in 7b_eval 7b_eval_off; do
  for c in grads optimizer host; do expect7 "$tmp/$f.plan" $c 0; done
done
t=$(planned "$tmp/7b_eval.plan" total)
[ -n "$t" ] && [ "$t" -lt $(( 2 * P + (1 << 30) )) ] && grep -q "^fits an 80 GB GPU.*: yes (12\.[0-9][0-9] GiB" "$tmp/7b_eval.plan" \
  && ok "7B --eval_only on one GPU: $t bytes (2 P + $(( (t - 2 * P) >> 20 )) MiB), fits 80 GB$(grep -oE ': yes \([0-9.]+ GiB' "$tmp/7b_eval.plan")" \
  || bad "7B --eval_only on one GPU: total '$t': $(grep '^fits' "$tmp/7b_eval.plan")"
mem=$(sed -n '/^memory/,/^  total/p' "$tmp/7b_eval.plan")
[ -n "$mem" ] && ! grep -qiE "backward|master|gradient|moment" <<<"$mem" && ok "7B --eval_only: no backward, gradient or optimizer line in the memory plan" \
  || bad "7B --eval_only memory plan: $(grep -iE "backward|master|gradient|moment" <<<"$mem")"
b=$(sed -nE 's/^largest batch_size_per_device that fits \(seq 512, same grid, --eval_only: forward only\): ([0-9]+).*/\1/p' "$tmp/7b_eval.plan")
if [ -n "$b" ] && [ "$b" -gt 100 ]; then
  fit() { plan7 --world_size 1 --no_fsdp --eval_only --batch_size_per_device "$1" | grep -c "^fits an 80 GB GPU.*: yes"; }
  [ "$(fit "$b")" = 1 ] && [ "$(fit $((b + 1)))" = 0 ] && ok "7B --eval_only: largest batch $b fits, $((b + 1)) does not" \
    || bad "7B --eval_only largest batch $b: not the edge"
else bad "7B --eval_only largest batch: '$b'"; fi
# a model whose parameters do not fit one GPU (Llama-2-70b's shape, 69 B parameters: 129 GiB of
# bf16): the one change listed is sharding (no optimizer to offload, no backward to
# checkpoint, no trained state for LoRA to shrink), its bytes those of its own dry run
mkdir -p "$tmp/m70"; sed -e 's/"hidden_size": 4096/"hidden_size": 8192/' -e 's/"intermediate_size": 11008/"intermediate_size": 28672/' \
  -e 's/"num_attention_heads": 32/"num_attention_heads": 64/' -e 's/"num_hidden_layers": 32/"num_hidden_layers": 80/' \
  -e 's/"num_key_value_heads": 32/"num_key_value_heads": 8/' $m7/config.json > "$tmp/m70/config.json"
"$bin" --dry_run --model_dir "$tmp/m70" --device cuda --world_size 1 --no_fsdp --eval_only > "$tmp/70b_eval.plan" 2>&1
alts=$(sed -n '/^what one change/,/^$/p' "$tmp/70b_eval.plan" | tail -n +2 | grep -c .)
nw=$(sed -nE 's/^  FSDP over ([0-9]+) GPUs.*: fits$/\1/p' "$tmp/70b_eval.plan")
a=$(alt "$tmp/70b_eval.plan" "FSDP over $nw GPUs")
b=$("$bin" --dry_run --model_dir "$tmp/m70" --device cuda --world_size "${nw:-0}" --eval_only | awk '$1 == "total" { print $2; exit }')
grep -q "^fits an 80 GB GPU.*: NO" "$tmp/70b_eval.plan" && [ "$alts" = 1 ] && [ -n "$nw" ] && [ "$a" = "$b" ] \
  && ok "70B-shaped --eval_only on one GPU: does not fit; the one change listed: FSDP over $nw GPUs, $a bytes = its own dry run" \
  || bad "70B-shaped --eval_only: $(sed -n '/^fits/,/^$/p' "$tmp/70b_eval.plan")"
step_h100() { awk '$1 == "total" && NF >= 4 && $2 ~ /^[0-9.]+$/ && $3 ~ /^[0-9.]+$/ { print $3 }' "$1" | tail -1; }
plan7 --world_size 1 --no_fsdp --total_batch_size 1 > "$tmp/7b_one_mb.plan" 2>&1   # training, the same one micro-batch
te=$(step_h100 "$tmp/7b_eval.plan"); tt=$(step_h100 "$tmp/7b_one_mb.plan")
grep -q "^  --eval_only: a step is one evaluation micro-batch, the FORWARD only" "$tmp/7b_eval.plan" \
  && awk -v e="$te" -v t="$tt" 'BEGIN { exit !(e > 0 && e < t / 2.5) }' && ! grep -q "backward\|optimizer: grad norm" <(sed -n '/^step time/,$p' "$tmp/7b_eval.plan") \
  && ok "7B --eval_only step-time estimate: a forward micro-batch, $te ms on the H100 (a training step of one micro-batch: $tt ms), no backward or optimizer op" \
  || bad "7B --eval_only step time '$te' ms vs training '$tt' ms: $(sed -n '/^step time/,/^  op /p' "$tmp/7b_eval.plan")"

# ---------------------------------------------------------------- 4. step time per op class
# row KEY of the class table, device column $3 (1 A100, 2 H100, 3 H200) of plan $1
crow() { awk -v k="$2" -v d="$3" '/per class, ms per step/ { on = 1 } on && $1 == k { v = $(d + 1); sub(/%$/, "", v); print v; exit }' "$1"; }
# ratio check: crow ratio $1/$2 of row $3 on H100 must be $4 within 1e-3
ratio_ok() { awk -v a="$(crow "$1" "$3" 2)" -v b="$(crow "$2" "$3" 2)" -v r="$4" 'BEGIN { exit !(b > 0 && (a / b - r)^2 < 1e-6) }'; }
# --fp8 (7B, one micro-batch): the decoder linears' forward, dX and dW GEMMs priced at the FP8
# peak (twice bf16's on the H100 and H200; the A100 has none: bf16's price), the same FLOPs;
# the quantisations add memory-bound bytes (plan_price.c, backend_count.c). B x T = 512 rows,
# a multiple of 16: every dW runs in FP8, so no bf16 layer GEMM row is left.
oprow() { awk -v k="$2" -v c="$3" 'index($0, "  " k) == 1 { print $(NF + c); exit }' "$1"; }   # c: 0 H200 .. -4 GFLOP
plan7 --world_size 1 --no_fsdp --total_batch_size 1 --fp8 > "$tmp/7b_fp8.plan" 2>&1
# the same FLOPs, A100 time and half the H100 time: row $2 of the bf16 plan against row $3 of the FP8 plan
fp8_row_ok() {
  awk -v g0="$(oprow "$tmp/7b_one_mb.plan" "$1" -4)" -v g1="$(oprow "$tmp/7b_fp8.plan" "$2" -4)" \
      -v a0="$(oprow "$tmp/7b_one_mb.plan" "$1" -2)" -v a1="$(oprow "$tmp/7b_fp8.plan" "$2" -2)" \
      -v h0="$(oprow "$tmp/7b_one_mb.plan" "$1" -1)" -v h1="$(oprow "$tmp/7b_fp8.plan" "$2" -1)" \
      'BEGIN { exit !(g0 > 0 && g0 == g1 && a0 == a1 && (h1 / h0 - 0.5)^2 < 1e-6) }'
}
bf="layer GEMMs forward (q k v o gate|up down)"; f8="layer GEMMs forward in FP8 (--fp8)"
bb="layer GEMMs backward (dX, dW)"; b8="layer GEMMs backward dX, dW in FP8 (--fp8)"
fp8_row_ok "$bf" "$f8" && fp8_row_ok "$bb" "$b8" \
  && awk -v m0="$(crow "$tmp/7b_one_mb.plan" memory 2)" -v m1="$(crow "$tmp/7b_fp8.plan" memory 2)" 'BEGIN { exit !(m1 > m0) }' \
  && ! grep -q "^  $bf" "$tmp/7b_fp8.plan" && ! grep -q "^  layer GEMMs backward (" "$tmp/7b_fp8.plan" \
  && ok "7B --fp8: forward GEMMs $(oprow "$tmp/7b_fp8.plan" "$f8" -4), backward (dX, dW) $(oprow "$tmp/7b_fp8.plan" "$b8" -4) GFLOP at half bf16's H100 time, A100 unchanged, quantisations' bytes added; step $tt -> $(step_h100 "$tmp/7b_fp8.plan") ms on the H100" \
  || bad "7B --fp8 pricing: $(grep "layer GEMMs" "$tmp/7b_fp8.plan")"
# the fused amax (src/fp8_linear.h): q|k|v's, gate|up's and down's inputs quantised without
# their amax pass; FT_TEST_FP8_UNFUSED=1 (every amax by its own pass) prices more memory time
FT_TEST_FP8_UNFUSED=1 plan7 --world_size 1 --no_fsdp --total_batch_size 1 --fp8 > "$tmp/7b_fp8u.plan" 2>&1
awk -v f="$(crow "$tmp/7b_fp8.plan" memory 2)" -v u="$(crow "$tmp/7b_fp8u.plan" memory 2)" 'BEGIN { exit !(f > 0 && u > f) }' \
  && ok "7B --fp8 fused amax: memory-bound time $(crow "$tmp/7b_fp8.plan" memory 2) ms on the H100, $(crow "$tmp/7b_fp8u.plan" memory 2) unfused" \
  || bad "7B --fp8 fused amax not priced: memory $(crow "$tmp/7b_fp8.plan" memory 2) vs unfused $(crow "$tmp/7b_fp8u.plan" memory 2)"

for job in "fsdp4_b1:--world_size 4" "fsdp4_b16:--world_size 4 --batch_size_per_device 16" \
           "one_b1:--world_size 1 --no_fsdp" "one_b16:--world_size 1 --no_fsdp --batch_size_per_device 16" \
           "one_off:--world_size 1 --no_fsdp --offload_optimizer" "fsdp4_off:--world_size 4 --offload_optimizer"; do
  name=${job%%:*}; f="$tmp/7b_t_$name.plan"
  plan7 ${job#*:} > "$f" 2>&1 || { bad "7B $name dry run: $(head -1 "$f")"; continue; }
  grep -q "step time ESTIMATE per op class" "$f" && grep -q "not a measurement" "$f" \
    && ok "7B $name: step-time estimate labelled as an estimate" || bad "7B $name: no labelled estimate"
  for d in 1 2 3; do
    sum=0; for k in gemm attention simt memory comm_exposed $(grep -q '^  offload ' "$f" && echo offload); do sum=$(awk -v s="$sum" -v v="$(crow "$f" $k $d)" 'BEGIN { printf "%.4f", s + v }'); done
    tot=$(crow "$f" total $d)
    awk -v s="$sum" -v t="$tot" 'BEGIN { exit !(t > 0 && (s - t)^2 <= 0.035^2) }' \
      && ok "7B $name device $d: classes sum to the total ($sum ~ $tot ms)" || bad "7B $name device $d: classes $sum != total '$tot'"
  done
  # derived: 6 FLOPs per matmul parameter (the layers' and the lm_head's C x V) per token at
  # 0.69 x 989e12 (H100 column)
  tokens=$(sed -nE 's/.*per optimizer step: ([0-9]+) tokens.*/\1/p' "$f")
  want=$(awk -v n="$tokens" -v c=$C -v ff=$F -v l=$L -v v=$V 'BEGIN { printf "%.2f", 1e3 * 6 * n * (l * (4 * c * c + 3 * c * ff) + c * v) / (0.69 * 989e12) }')
  [ "$(crow "$f" gemm 2)" = "$want" ] && ok "7B $name: H100 gemm = 6 x tokens x (layer + lm_head) params / (0.69 x 989e12) = $want ms" \
    || bad "7B $name: H100 gemm '$(crow "$f" gemm 2)', derived $want"
  mfu=$(crow "$f" MFU 2); tps=$(crow "$f" tokens/s/GPU 2)
  [ -n "$mfu" ] && [ -n "$tps" ] && ok "7B $name: H100 predicted MFU $mfu%, $tps tokens/s/GPU" || bad "7B $name: no MFU/tokens per s"
done
# --offload_optimizer: the offload row prices the host AdamW (28 + 2 bytes of host memory per
# element of this rank's slice, at the assumed 50 GB/s; PCIe moves 4 + 2 bytes at 50 GB/s, one
# direction at a time, less), and the device optimizer op keeps 8 bytes per element (zero + norm) of its 38
for name in one_off:1 fsdp4_off:4; do
  f="$tmp/7b_t_${name%%:*}.plan"; S=${name#*:}
  want=$(awk -v p=$P -v s=$S 'BEGIN { printf "%.2f", 1e3 * (p / s) * 30 / 50e9 }')
  got=$(crow "$f" offload 2)
  awk -v a="$got" -v b="$want" 'BEGIN { exit !(a > 0 && (a / b - 1)^2 < 1e-8) }' \
    && ok "7B ${name%%:*}: offload row = P / $S x 30 bytes / 50 GB/s = $got ms (derived $want)" || bad "7B ${name%%:*}: offload row '$got', derived $want"
  base="$tmp/7b_t_$([ "$S" = 1 ] && echo one_b1 || echo fsdp4_b1).plan"
  opt_off=$(grep -F "  optimizer: grad norm" "$f" | awk '{ print $(NF - 3) }'); opt_dev=$(grep -F "  optimizer: grad norm" "$base" | awk '{ print $(NF - 3) }')
  awk -v a="$opt_off" -v b="$opt_dev" 'BEGIN { exit !(b > 0 && (a / b * 38 - 8)^2 < 1e-2) }' \
    && ok "7B ${name%%:*}: device optimizer bytes $opt_off GB = 8/38 of $opt_dev GB" || bad "7B ${name%%:*}: device optimizer bytes $opt_off vs $opt_dev"
done
! grep -q '^  offload ' "$tmp/7b_t_one_b1.plan" && ok "no offload row without the flag" || bad "offload row without --offload_optimizer"
# a sharded job whose gathers outrun the compute (FSDP 4, batch 1: collectives exposed) is told
# what --keep_params_gathered would predict: its step time and exposed collectives are the
# same numbers as that flag's own plan (H100 column), and it fits; not at batch 16 (hidden),
# not with the flag already given, not on one rank
line=$(grep "^faster, predicted on the H100" "$tmp/7b_t_fsdp4_b1.plan")
plan7 --world_size 4 --keep_params_gathered > "$tmp/7b_t_fsdp4_keep.plan" 2>&1
step_keep=$(crow "$tmp/7b_t_fsdp4_keep.plan" total 2); exp_keep=$(crow "$tmp/7b_t_fsdp4_keep.plan" comm_exposed 2)
step_now=$(crow "$tmp/7b_t_fsdp4_b1.plan" total 2)
[[ "$line" == *"--keep_params_gathered"*"step $step_now -> $step_keep ms (collectives exposed "*" -> $exp_keep ms"*": fits" ]] \
  && awk -v a="$step_now" -v b="$step_keep" 'BEGIN { exit !(b < 0.95 * a) }' \
  && ok "7B FSDP 4 batch 1: --keep_params_gathered suggested, $step_now -> $step_keep ms (its own plan's numbers)" \
  || bad "7B FSDP 4 batch 1: suggestion '$line' (keep plan: step $step_keep, exposed $exp_keep)"
for f in fsdp4_b16 fsdp4_keep one_b1; do
  ! grep -q "^faster, predicted" "$tmp/7b_t_$f.plan" && ok "7B $f: no --keep_params_gathered suggestion" \
    || bad "7B $f: suggests $(grep '^faster' "$tmp/7b_t_$f.plan")"
done

# GEMM linear in tokens (batch 2 -> 4 at one micro-batch), attention quadratic in T (seq 256 ->
# 512 at the same tokens per step: x2 per token), collectives = bytes / link bandwidth
plan7 --world_size 4 --batch_size_per_device 2 --total_batch_size 8 > "$tmp/t_b2.plan"
plan7 --world_size 4 --batch_size_per_device 4 --total_batch_size 16 > "$tmp/t_b4.plan"
# (attention at batch 32/64: 30+ ms, so the 0.01 ms print moves the ratio by < 1e-3)
plan7 --world_size 4 --batch_size_per_device 64 --seq_len 256 --total_batch_size 256 > "$tmp/t_b64s256.plan"
plan7 --world_size 4 --batch_size_per_device 32 --seq_len 512 --total_batch_size 128 > "$tmp/t_b32s512.plan"
ratio_ok "$tmp/t_b4.plan" "$tmp/t_b2.plan" gemm 2 && ok "GEMM time doubles with the tokens" || bad "GEMM time: $(crow "$tmp/t_b4.plan" gemm 2) vs $(crow "$tmp/t_b2.plan" gemm 2)"
ratio_ok "$tmp/t_b32s512.plan" "$tmp/t_b64s256.plan" attention 2 \
  && ok "attention time x2 at the same tokens when T doubles (quadratic in T per sequence)" \
  || bad "attention time: $(crow "$tmp/t_b32s512.plan" attention 2) vs $(crow "$tmp/t_b64s256.plan" attention 2)"
# attention by path: the tensor-core backward is 5 products to the forward's 2 (2.5x its
# GFLOP), cuDNN at 0.25 and native wmma at 0.10 of peak, so native / cudnn time = 2.5; with
# a head_dim that is not a multiple of 16, --attention native runs the SIMT kernels (7
# products: 3.5x), the attention row is empty and SIMT time is linear in the tokens
gflop() { grep -F "  $2" "$1" | head -1 | awk '{ print $(NF - 4) }'; }   # op row: GFLOP GB A100 H100 H200
plan7 --world_size 4 --batch_size_per_device 32 --total_batch_size 128 --attention native > "$tmp/t_b32n.plan"
ratio_ok "$tmp/t_b32n.plan" "$tmp/t_b32s512.plan" attention 2.5 && ok "attention: native wmma time = 2.5 x cuDNN's (0.25 / 0.10 of peak)" \
  || bad "attention native vs cudnn: $(crow "$tmp/t_b32n.plan" attention 2) vs $(crow "$tmp/t_b32s512.plan" attention 2)"
for f in t_b32s512 t_b32n; do
  fw=$(gflop "$tmp/$f.plan" "attention forward ("); bw=$(gflop "$tmp/$f.plan" "attention backward (")
  awk -v f="$fw" -v b="$bw" 'BEGIN { exit !(f > 0 && (b / f - 2.5)^2 < 1e-5) }' && ok "$f: attention backward $bw GFLOP = 2.5 x forward $fw (5 products of 2)" \
    || bad "$f: attention backward '$bw' vs forward '$fw' GFLOP"
done
[ "$(crow "$tmp/t_b2.plan" simt 2)" = 0.00 ] && ok "head_dim 128: no SIMT time" || bad "head_dim 128: SIMT row $(crow "$tmp/t_b2.plan" simt 2)"
mkdir -p "$tmp/d120" && sed 's/"hidden_size": 4096,/"hidden_size": 4096,\n  "head_dim": 120,/' $m7/config.json > "$tmp/d120/config.json"
planD() { "$bin" --dry_run --model_dir "$tmp/d120" --device cuda --attention native --world_size 4 "$@"; }
# (batch 16/32: 1000+ GFLOP printed as integers, so a ratio is off by < 2.5e-3)
planD --batch_size_per_device 16 --total_batch_size 64 > "$tmp/t_d2.plan" 2>&1
planD --batch_size_per_device 32 --total_batch_size 128 > "$tmp/t_d4.plan" 2>&1
fw=$(gflop "$tmp/t_d2.plan" "attention forward (SIMT"); bw=$(gflop "$tmp/t_d2.plan" "attention backward (SIMT")
awk -v f="$fw" -v b="$bw" 'BEGIN { exit !(f > 0 && (b / f - 3.5)^2 < 1e-5) }' && [ "$(crow "$tmp/t_d2.plan" attention 2)" = 0.00 ] \
  && ok "head_dim 120, native: SIMT attention, backward $bw GFLOP = 3.5 x forward $fw, attention row empty" \
  || bad "head_dim 120: SIMT forward '$fw' backward '$bw', attention row '$(crow "$tmp/t_d2.plan" attention 2)'"
ratio_ok "$tmp/t_d4.plan" "$tmp/t_d2.plan" simt 2 && ok "SIMT time doubles with the tokens" || bad "SIMT time not linear: $(crow "$tmp/t_d4.plan" simt 2) vs $(crow "$tmp/t_d2.plan" simt 2)"
# the model's ops are counted from the model code (src/backend_count.c), so what a flag changes
# in it shows: with --gradient_checkpointing the recomputed forward's rows have the forward's
# GEMM GFLOP and memory GB, without it there are none; a LoRA job's frozen lm_head runs 2 of
# the 3 GEMMs (no dW) and its layer forward moves more bytes (the adapters' residual reads and
# the split RoPE passes)
gbytes() { grep -F "  $2" "$1" | head -1 | awk '{ print $(NF - 3) }'; }
plan7 --world_size 4 --batch_size_per_device 2 --total_batch_size 8 --gradient_checkpointing > "$tmp/t_b2ck.plan"
plan7 --world_size 4 --batch_size_per_device 2 --total_batch_size 8 --lora_rank 16 > "$tmp/t_b2lora.plan"
gf=$(gflop "$tmp/t_b2ck.plan" "layer GEMMs forward"); gr=$(gflop "$tmp/t_b2ck.plan" "layer GEMMs recomputed")
mf=$(gbytes "$tmp/t_b2ck.plan" "layer norms, RoPE + q|k|v split"); mr=$(gbytes "$tmp/t_b2ck.plan" "layer memory-bound forward recomputed")
[ -n "$gf" ] && [ "$gf" = "$gr" ] && [ -n "$mf" ] && [ "$mf" = "$mr" ] && ! grep -q "recomputed" "$tmp/t_b2.plan" \
  && ok "--gradient_checkpointing: the recomputed forward = the forward ($gr GFLOP, $mr GB); no recompute rows without it" \
  || bad "recompute rows: GEMMs forward '$gf' recomputed '$gr' GFLOP, memory forward '$mf' recomputed '$mr' GB"
lf=$(gflop "$tmp/t_b2.plan" "lm_head GEMMs: logits, dX, dW"); ll=$(gflop "$tmp/t_b2lora.plan" "lm_head GEMMs: logits, dX (frozen)")
awk -v f="$lf" -v l="$ll" 'BEGIN { exit !(f > 0 && (l / f - 2 / 3)^2 < 1e-4) }' \
  && awk -v a="$(gbytes "$tmp/t_b2lora.plan" "layer norms, RoPE + q|k|v split")" -v b="$(gbytes "$tmp/t_b2.plan" "layer norms, RoPE + q|k|v split")" 'BEGIN { exit !(a > b && b > 0) }' \
  && ok "LoRA: lm_head $ll GFLOP = 2/3 of the full job's $lf (frozen: no dW GEMM); more layer forward bytes than the full job" \
  || bad "LoRA lm_head '$ll' vs full '$lf' GFLOP, forward bytes: $(gbytes "$tmp/t_b2lora.plan" "layer norms, RoPE + q|k|v split") vs $(gbytes "$tmp/t_b2.plan" "layer norms, RoPE + q|k|v split")"
bytes=$(( $(planned "$tmp/t_b2.plan" all_gather) + $(planned "$tmp/t_b2.plan" reduce_scatter) + $(planned "$tmp/t_b2.plan" all_reduce) ))
want=$(awk -v b=$bytes 'BEGIN { printf "%.2f", 1e3 * b / 450e9 }')
[ "$(crow "$tmp/t_b2.plan" link 2)" = "$want" ] && ok "collectives: H100 link time = bytes / 450 GB/s = $want ms" || bad "link time '$(crow "$tmp/t_b2.plan" link 2)', bytes/bw $want"
plan7 --world_size 8 --batch_size_per_device 2 --total_batch_size 16 > "$tmp/t_w8.plan"
ratio_ok "$tmp/t_w8.plan" "$tmp/t_b2.plan" link "$(awk 'BEGIN { print (7 / 8) / (3 / 4) }')" \
  && ok "collective time per rank scales as (W-1)/W (4 -> 8 ranks)" || bad "link time 4 -> 8 ranks: $(crow "$tmp/t_w8.plan" link 2) vs $(crow "$tmp/t_b2.plan" link 2)"

# ---------------------------------------------------------------- 5. flags
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

# ---------------------------------------------------------------- 6. device operations
# --dry_run's count of device operations per step (each takes at least the issue floor)
# against the emulated device's: FT_EMU_STATS=1 makes it print what it was issued, by name;
# kernels, cuBLASLt GEMMs, cuDNN graphs and memsets of a 2-step run less a 1-step run (the
# startup checks, evals and final save cancel) per rank. The plan counts the model's passes
# by running the model code once over a backend that only counts (src/backend_count.c) and the
# gradient schedule's and optimizer's passes by formula (src/plan_time.c); within 5% of the
# emulated count on every case below (measured 2026-11-28: equal on every one-GPU case, FSDP 2
# 1.3% over, in the formula's per-unit gradient passes; when the model's passes were a formula
# too, 0.99-1.01, and a forgotten per-layer term was off by more: LoRA's split RoPE pass alone
# was 7% of its count, the backward's 8 GEMMs per layer are a third).
# The same runs check the device arena against the plan it is sized from: its high-water mark
# (the highest byte any buffer, per-call workspace or kernel scratch ever reached, rank 0's
# line "device arena: high-water") is at most the planned total + cuBLASLt's 32 MiB workspace
# (measured 2026-11-26: 64 KiB to 17 MiB under it on every case below; the arena's margin of
# 1% + 256 MiB beyond that is left for what only a real GPU could add).
emu=$build/tests/finetune_emu
emu_ops() {  # emu_ops RANKS STEPS FLAGS...: operations summed over the ranks ($tmp/ops.log: the output)
  local n=$1 s=$2; shift 2; local launch=(); [ "$n" -gt 1 ] && launch=(timeout 300 mpiexec -n "$n")
  FT_EMU_STATS=1 "${launch[@]}" "$emu" --device cuda --max_steps "$s" --out_dir "$tmp/ops" --overwrite_out_dir "$@" \
    > "$tmp/ops.log" 2>&1
  awk '/^cuda_emu: issued (kernel|cublasLtMatmul|cudnn|cudaMemsetAsync)/ { n += $NF } END { print n + 0 }' "$tmp/ops.log"
}
ops_case() {  # ops_case NAME RANKS FLAGS...
  local name=$1 n=$2; shift 2
  local f=(--pack --seq_len 64 --batch_size_per_device 2 --total_batch_size $((4 * n)) --max_eval_docs 2 "$@")
  "$bin" --dry_run --device cuda --world_size "$n" "${f[@]}" > "$tmp/ops.plan" 2>&1
  local plan total; plan=$(awk '/device operations \(kernels/ { print $1 }' "$tmp/ops.plan")
  total=$(awk '$1 == "total" && NF >= 3 { print $2; exit }' "$tmp/ops.plan")
  local a b; a=$(emu_ops "$n" 1 "${f[@]}"); b=$(emu_ops "$n" 2 "${f[@]}")
  local got=$(( (b - a) / n ))
  awk -v p="${plan:-0}" -v g="$got" 'BEGIN { exit !(g > 0 && p / g > 0.95 && p / g < 1.05) }' \
    && ok "device operations per step, $name: planned $plan, emulated $got" \
    || bad "device operations per step, $name: planned '${plan:-none}', emulated $got (1 step $a, 2 steps $b)"
  local hw; hw=$(sed -nE 's/^finetune: device arena: high-water .* \(([0-9]+) bytes\) of .*/\1/p' "$tmp/ops.log")
  # (the train records carry it too, as it stood after each step: what bench_gpu.py reads)
  local rec; rec=$(grep '"type":"train"' "$tmp/ops/metrics.jsonl" | tail -1 | sed -nE 's/.*"arena_high_water_bytes":([0-9]+).*/\1/p')
  [ -n "$hw" ] && [ -n "$total" ] && [ "$hw" -le $((total + 33554432)) ] && [ -n "$rec" ] && [ "$rec" -le "$hw" ] \
    && ok "device arena, $name: high-water $hw <= planned $total + 32 MiB (cuBLASLt's workspace)" \
    || bad "device arena, $name: high-water '${hw:-none}' (train record '${rec:-none}') vs planned '${total:-none}' + 32 MiB"
}
if [ -x "$emu" ]; then
  ops_case "1 GPU" 1
  ops_case "1 GPU, --gradient_checkpointing" 1 --gradient_checkpointing
  ops_case "1 GPU, --attention native" 1 --attention native
  ops_case "1 GPU, LoRA q,k,v,o" 1 --lora_rank 4
  ops_case "1 GPU, LoRA on all 7 projections" 1 --lora_rank 4 --lora_targets q,k,v,o,gate,up,down
  ops_case "1 GPU, --offload_optimizer (AdamW on the host)" 1 --offload_optimizer
  if command -v mpiexec >/dev/null; then ops_case "FSDP over 2" 2; else skip_or_fail "FSDP operation count (needs mpiexec)"; fi
else
  skip_or_fail "$emu not built (make CUDA=1): device operations per step not compared"
fi
out=$("$bin" --dry_run --device cuda 2>&1 | grep -E "^  tokens/s/GPU ")
awk '{ exit !(NF == 4 && $2 > 0 && $2 < 2e6 && $3 < 2e6 && $4 < 2e6) }' <<<"$out" \
  && ok "bundled model: the issue floor keeps the predicted tokens/s/GPU below 2 M (A100 H100 H200:$(echo $out | cut -d' ' -f2-))" \
  || bad "bundled model: predicted '$out' (22 M/s before the floor)"

# ---------------------------------------------------------------- 7. NCCL's bytes at the fit edge
if [ -x "$emu" ] && command -v mpiexec >/dev/null; then
  fit=(--device cuda --seq_len 64 --max_eval_docs 1 --warmup_fraction 0)
  total_at() { "$bin" --dry_run --world_size 2 "${fit[@]}" --batch_size_per_device "$1" --total_batch_size $((2 * $1)) \
                 | awk '$1 == "total" && NF >= 3 { print $2; exit }'; }
  t3=$(total_at 3); t4=$(total_at 4)
  # arena = total + total / 100 + 256 MiB (src/plan.h); the room between batch 3's and 4's
  read -r room per_comm gib < <(awk -v a="$t3" -v b="$t4" 'BEGIN {
    m = 268435456; a3 = a + int(a / 100) + m; a4 = b + int(b / 100) + m; room = int((a3 + a4) / 2);
    n = int((81559 * 1048576 - 1073741824 - room) / 2); printf "%.0f %.0f %.12f\n", room, n, n / 1073741824 }')
  "$bin" --dry_run --world_size 2 "${fit[@]}" --batch_size_per_device 1 --total_batch_size 2 --nccl_gib_per_comm "$gib" \
    > "$tmp/fit.plan" 2>&1
  best=$(awk '/^  without gradient checkpointing/ { print $4; exit }' "$tmp/fit.plan" | tr -d ';')
  dflt=$("$bin" --dry_run --world_size 2 "${fit[@]}" --batch_size_per_device 1 --total_batch_size 2 \
         | awk '/^  without gradient checkpointing/ { print $4; exit }' | tr -d ';')
  grep -q "2 NCCL communicator(s) at [0-9.]* GiB each (--nccl_gib_per_comm)" "$tmp/fit.plan" && [ "$best" = 3 ] \
    && [ "$dflt" = 4096 ] && ok "--nccl_gib_per_comm $gib: --dry_run's largest batch 3 (4096 at the default 0.98 GiB)" \
    || bad "--nccl_gib_per_comm $gib: largest batch '$best' (default '$dflt'), $(grep '^fits' "$tmp/fit.plan")"
  fit_run() {  # fit_run B: 2 ranks at batch B on the emulated H100s, NCCL holding back per_comm each
    FT_EMU_MEMORY_MIB=81559 FT_EMU_CONTEXT_MIB=992 FT_EMU_NCCL_COMM_BYTES=$per_comm timeout 300 mpiexec -n 2 "$emu" \
      "${fit[@]}" --batch_size_per_device "$1" --total_batch_size $((2 * $1)) --max_steps 1 --nccl_gib_per_comm "$gib" \
      --out_dir "$tmp/fit$1" > "$tmp/fit$1.log" 2>&1
  }
  fit_run 3; rc=$?
  took=$(sed -nE 's/.*; 2 NCCL communicator\(s\) took ([0-9.]+) GiB of device memory on rank 0 \(planned ([0-9.]+) GiB.*/\1 \2/p' "$tmp/fit3.log")
  [ $rc -eq 0 ] && [ "$(grep -c '"type":"train"' "$tmp/fit3/metrics.jsonl" 2>/dev/null)" = 1 ] && [ -n "$took" ] \
    && [ "${took% *}" = "${took#* }" ] \
    && ok "batch 3 at the edge starts and trains a step (NCCL took / planned GiB: $took)" \
    || bad "batch 3 at the edge: rc $rc, NCCL '$took', $(grep -m1 'error' "$tmp/fit3.log")"
  fit_run 4; rc=$?
  [ $rc -ne 0 ] && grep -q "the memory plan needs .* GiB are free" "$tmp/fit4.log" && ok "batch 4 past the edge: refused at startup" \
    || bad "batch 4 past the edge: rc $rc, $(grep -m1 'error' "$tmp/fit4.log")"
fi

finish
