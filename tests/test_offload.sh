#!/usr/bin/env bash
# test_offload.sh BUILD_DIR: --offload_optimizer on the CPU backend (issue 14 item 2).
#   With the flag the fp32 master weights and AdamW moments live in a separate host allocation
#   (category "host", outside the device total) and AdamW runs on the host unit by unit
#   (src/fsdp.c offload_step_unit: the unit's gradient slice copied to a host buffer, the CPU
#   AdamW kernel, the updated weights copied back as the working parameters). On the CPU the
#   working dtype is fp32 and the arithmetic is the same element for element, so the result
#   must be BITWISE the one without the flag:
#   1. FSDP over 2 MPI ranks, 4 steps (2 micro-batches each): the step logs (loss, lr, grad
#      norm) and the step-4 checkpoint (model.safetensors, optimizer.safetensors) and the final
#      export are byte-identical with and without the flag; the host category holds the
#      optimizer state and the optimizer category is empty.
#   2. Resume: with the flag, 2 steps + stop + resume + 2 steps gives the same step-4 checkpoint
#      bytes as the straight run without the flag.
#   3. One process with gradient checkpointing, and LoRA (the adapters' state offloaded): the
#      same bitwise check.
#   4. Not enough host memory for the planned optimizer state of this node's ranks: one line
#      naming the flag, non-zero exit, nothing written (7B on a 64 GB host; the tiny model on
#      a 1000-byte host; 2 ranks: both counted, reported once).
#   5. The GPU path on the emulated device (bf16, asynchronous streams): with vs without the
#      flag within a derived tolerance (below), on 1 emulated GPU (2 seeds) and on FSDP over 2
#      with a stop + resume (2 seeds), no ordering hazard; and a build that skips the wait for
#      the parameters' copies back to the device is reported by the emulated runtime.
#   6. Without clipping (--max_grad_norm 0) the layers' host updates start during the last
#      micro-batch's backward: bitwise on the CPU (FSDP 2, one process with checkpointing,
#      LoRA), and on the emulated GPU (1 GPU, with checkpointing too, FSDP 2) within the
#      tolerance of 5, no hazard; LoRA offload on the emulated GPU likewise (its adapters).
#   A unit whose update is skipped on the offload path (a mutant in fsdp.c) fails 1-3 and 5;
#   an early update pushed before the slice's last contribution (a mutant) fails 6.
# Runtime on the 2-core machine: about 2 min wall (most of it the emulated GPU).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_offload
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
small=(--seq_len 64 --batch_size_per_device 2 --total_batch_size 8 --max_eval_docs 8 --learning_rate 3e-3
       --save_dtype fp32 --max_steps 4 --save_every 2 --peak_tflops 1)

# same_run NAME DIR_A DIR_B: step logs, step-4 checkpoint and final export byte-identical
same_run() {
  local name="$1" a="$2" b="$3" f
  [ "$(step_logs "$a")" = "$(step_logs "$b")" ] && [ "$(step_logs "$a" | wc -l)" -eq 4 ] \
    && ok "$name: the 4 step losses, lrs and grad norms are identical" || bad "$name: step logs differ"
  for f in checkpoints/step_00000004/model.safetensors checkpoints/step_00000004/optimizer.safetensors \
           final/model.safetensors; do
    [ -s "$a/$f" ] && cmp -s "$a/$f" "$b/$f" && ok "$name: $f byte-identical" || bad "$name: $f differs (or is missing)"
  done
}

# run N DIR flags...: train with N ranks (1: no launcher)
run() {
  local n="$1" d="$2" rc; shift 2
  if [ "$n" -eq 1 ]; then "$bin" "${small[@]}" --out_dir "$d" "$@" > "$d.log" 2>&1; rc=$?
  else timeout 300 mpiexec -n "$n" "$bin" "${small[@]}" --out_dir "$d" "$@" > "$d.log" 2>&1; rc=$?; fi
  [ $rc -eq 0 ] || bad "run $d $*: rc $rc: $(grep -m1 error "$d.log")"
}

# ---------------------------------------------------------------- 1. and 2. FSDP over 2 ranks
if have_mpi; then
  run 2 "$tmp/ref"; run 2 "$tmp/off" --offload_optimizer
  same_run "FSDP 2, with vs without --offload_optimizer" "$tmp/ref" "$tmp/off"
  h=$(train_field "$tmp/off/metrics.jsonl" 2 peak_mem_bytes)
  host=$(grep '"type":"train","step":2,' "$tmp/off/metrics.jsonl" | sed -nE 's/.*"host":([0-9]+).*/\1/p')
  opt=$(grep '"type":"train","step":2,' "$tmp/off/metrics.jsonl" | sed -nE 's/.*"optimizer":([0-9]+).*/\1/p')
  ref_opt=$(grep '"type":"train","step":2,' "$tmp/ref/metrics.jsonl" | sed -nE 's/.*"optimizer":([0-9]+).*/\1/p')
  [ "$opt" = 0 ] && [ -n "$host" ] && [ "$host" -gt "$ref_opt" ] && [ "$ref_opt" -gt 0 ] \
    && ok "FSDP 2 offload: optimizer state in host memory ($host bytes; device optimizer 0, was $ref_opt; device peak $h)" \
    || bad "FSDP 2 offload: host '$host', optimizer '$opt' (without: '$ref_opt')"
  run 2 "$tmp/res" --offload_optimizer --stop_at_step 2
  run 2 "$tmp/res" --offload_optimizer --resume latest
  grep -q "resumed from .*step_00000002 at step 2" "$tmp/res.log" && ok "FSDP 2 offload: resumed at step 2" || bad "FSDP 2 offload: no resume"
  same_run "FSDP 2, offload 2 + resume + 2 vs straight without" "$tmp/ref" "$tmp/res"
else skip_or_fail "FSDP over 2 ranks (no mpiexec, or $bin built without MPI)"; fi

# ---------------------------------------------------------------- 3. one process, checkpointing
run 1 "$tmp/one_ref" --gradient_checkpointing; run 1 "$tmp/one_off" --gradient_checkpointing --offload_optimizer
same_run "one process with checkpointing, with vs without --offload_optimizer" "$tmp/one_ref" "$tmp/one_off"
# LoRA: the adapters' master and moments are offloaded (the frozen base has none)
lora=(--lora_rank 4 --lora_targets q,v,gate)
run 1 "$tmp/lora_ref" "${lora[@]}"; run 1 "$tmp/lora_off" "${lora[@]}" --offload_optimizer
[ "$(step_logs "$tmp/lora_ref")" = "$(step_logs "$tmp/lora_off")" ] && [ "$(step_logs "$tmp/lora_ref" | wc -l)" -eq 4 ] \
  && cmp -s "$tmp/lora_ref/checkpoints/step_00000004/model.safetensors" "$tmp/lora_off/checkpoints/step_00000004/model.safetensors" \
  && cmp -s "$tmp/lora_ref/final/adapter_model.safetensors" "$tmp/lora_off/final/adapter_model.safetensors" \
  && ok "LoRA, with vs without --offload_optimizer: step logs, step-4 adapters and the PEFT export byte-identical" \
  || bad "LoRA with --offload_optimizer differs"

# ---------------------------------------------------------------- 4. not enough host memory
# planned and checked before anything is allocated or written (FT_HOST_MEMORY_BYTES stands in
# for the smaller of the machine's memory and the cgroup memory limits, src/fsutil.c, tested
# in test_fsutil): one line, non-zero exit, no output directory
FT_HOST_MEMORY_BYTES=64e9 expect_error "flag --offload_optimizer: the optimizer state needs 77.26 GiB of pinned host memory" \
  --model_dir data/configs/codellama-7b --offload_optimizer --out_dir "$tmp/nomem7b"
FT_HOST_MEMORY_BYTES=1000 expect_error "flag --offload_optimizer: the optimizer state needs" --offload_optimizer --out_dir "$tmp/nomem"
[ ! -e "$tmp/nomem" ] && [ ! -e "$tmp/nomem7b" ] && ok "no output directory left behind" || bad "an output directory was created"
if have_mpi; then
  err=$(FT_HOST_MEMORY_BYTES=1000 timeout 120 mpiexec -n 2 "$bin" --offload_optimizer --out_dir "$tmp/nomem2" 2>&1 >/dev/null); rc=$?
  [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c 'the optimizer state needs')" -eq 1 ] && printf '%s' "$err" | grep -q "x 2 rank(s)" \
    && ok "2 ranks on one node: both ranks' host bytes counted, reported once (rc $rc)" || bad "2 ranks, no host memory: rc $rc '$err'"
fi

# ---------------------------------------------------------------- 6. (CPU) overlap with the backward
# Without clipping (--max_grad_norm 0) the AdamW parameters are known before the backward, so
# each layer's host update starts as soon as its gradient slice is final in the step's last
# micro-batch (src/fsdp.c fsdp_offload_early), while the rest of the backward runs; the root
# waits for the optimizer step. Still bitwise: the same arithmetic per element, only earlier.
# A push of a slice before its last contribution (before the reduce-scatter's accumulate, or
# in the first micro-batch) changes the step logs and the bytes.
noclip=(--max_grad_norm 0)
grep -q "host AdamW overlaps the last micro-batch's backward" "$tmp/one_off.log" \
  && bad "with clipping the host AdamW must not start in the backward" || true
if have_mpi; then
  run 2 "$tmp/nc_ref" "${noclip[@]}"; run 2 "$tmp/nc_off" "${noclip[@]}" --offload_optimizer
  grep -q "host AdamW overlaps the last micro-batch's backward (no clipping)" "$tmp/nc_off.log" \
    && ok "FSDP 2 offload, --max_grad_norm 0: the host AdamW overlaps the backward (said once)" || bad "no overlap line: $(grep -m1 'offload' "$tmp/nc_off.log")"
  same_run "FSDP 2, --max_grad_norm 0, overlapped offload vs without" "$tmp/nc_ref" "$tmp/nc_off"
else skip_or_fail "FSDP over 2 ranks (no mpiexec, or $bin built without MPI)"; fi
run 1 "$tmp/nc1_ref" "${noclip[@]}" --gradient_checkpointing; run 1 "$tmp/nc1_off" "${noclip[@]}" --gradient_checkpointing --offload_optimizer
same_run "one process with checkpointing, --max_grad_norm 0, overlapped offload vs without" "$tmp/nc1_ref" "$tmp/nc1_off"
run 1 "$tmp/ncl_ref" "${noclip[@]}" "${lora[@]}"; run 1 "$tmp/ncl_off" "${noclip[@]}" "${lora[@]}" --offload_optimizer
[ "$(step_logs "$tmp/ncl_ref")" = "$(step_logs "$tmp/ncl_off")" ] && [ "$(step_logs "$tmp/ncl_ref" | wc -l)" -eq 4 ] \
  && cmp -s "$tmp/ncl_ref/final/adapter_model.safetensors" "$tmp/ncl_off/final/adapter_model.safetensors" \
  && ok "LoRA, --max_grad_norm 0, overlapped offload vs without: step logs and the PEFT export byte-identical" \
  || bad "LoRA, --max_grad_norm 0: overlapped offload differs"

# ---------------------------------------------------------------- 5. the GPU path, emulated
# The emulated GPU (bf16 working parameters; src/ linked with tests/cuda_emu, asynchronous
# streams with seeded delays and hazard checks): the master and moments live in pinned host
# memory, each unit's fp32 gradient slice comes to the host on the copy stream while the host
# AdamW updates the previous unit, and the host-cast bf16 weights go back behind it.
# Tolerance: the only arithmetic difference from the device AdamW is the order of fp32
# operations in the two AdamW implementations (a few fp32 ulps in the master), which flips a
# bf16 rounding now and then; AdamW's sign-like steps then carry those flips on as in any
# bf16 run, so the floor is not derived (as test_train_golden.c's after step 1). It is bounded
# by the bf16-vs-fp32 difference of the same mechanism, which holds every bf16 rounding
# (tests/test_cuda_emu_train.sh's 8 steps at lr 5e-3, measured 2026-11-26: weights NMSE
# 1.7e-3, loss rel 3.4e-4), and that is where the bounds sit: NMSE 1e-3, loss rel 5e-4.
# Measured 2026-11-26 after 4 steps, worst of the 7 comparisons below (2 seeds, overlapped,
# checkpointing, FSDP 2): NMSE 5.3e-6, loss rel 1.0e-5 (earlier 3.8e-6, 1e-5). The bounds
# stay rather than go 10x above the measured: nothing derived keeps the floor from growing
# with another seed or interleaving, and the guard against a unit whose host update is
# skipped (a mutant) is the NMSE, 7.2e-2, 72x above its bound (its loss rel, 1e-3 at step 4,
# is only 2x above the loss bound).
emu="$build/tests/finetune_emu"
nmse="$build/tests/st_nmse"
gpu=(--device cuda --warmup_fraction 0)
# close_run NAME DIR_A DIR_B: 4 step losses within loss rel 5e-4, step-4 fp32 weights and final export within NMSE 1e-3
close_run() {
  local name="$1" a="$2" b="$3" w e f
  w=$(worst_rel "$(metric "$a" loss)" "$(metric "$b" loss)")
  [ "$(metric "$b" loss | wc -l)" -eq 4 ] && le "$w" 5e-4 && ok "$name: 4 step losses, worst rel $w" || bad "$name: losses worst rel '$w'"
  for f in checkpoints/step_00000004/model.safetensors final/model.safetensors; do
    e=$("$nmse" "$a/$f" "$b/$f" 2>&1 | awk '{print $NF}')
    le "$e" 1e-3 && ok "$name: $f worst tensor NMSE $e" || bad "$name: $f NMSE '$e'"
  done
}
if [ -x "$emu" ] && [ -x "$nmse" ]; then
  # one emulated GPU, 2 micro-batches per step, two delay seeds
  FT_EMU_SEED=1 bin="$emu" run 1 "$tmp/g_ref" "${gpu[@]}"
  for seed in 1 2; do
    FT_EMU_SEED=$seed bin="$emu" run 1 "$tmp/g_off$seed" "${gpu[@]}" --offload_optimizer
    ! grep -q HAZARD "$tmp/g_off$seed.log" && ok "1 emulated GPU, seed $seed: no ordering hazard" || bad "seed $seed: $(grep -m1 HAZARD "$tmp/g_off$seed.log")"
    close_run "1 emulated GPU, seed $seed, with vs without --offload_optimizer" "$tmp/g_ref" "$tmp/g_off$seed"
  done
  # without clipping: layer updates overlap the backward on the copy stream and the host
  FT_EMU_SEED=1 bin="$emu" run 1 "$tmp/gn_ref" "${gpu[@]}" "${noclip[@]}"
  FT_EMU_SEED=2 bin="$emu" run 1 "$tmp/gn_off" "${gpu[@]}" "${noclip[@]}" --offload_optimizer
  ! grep -q HAZARD "$tmp/gn_off.log" && grep -q "host AdamW overlaps" "$tmp/gn_off.log" \
    && ok "1 emulated GPU, --max_grad_norm 0: host AdamW overlapped with the backward, no ordering hazard" || bad "1 emulated GPU overlapped: $(grep -m1 'HAZARD\|error' "$tmp/gn_off.log")"
  close_run "1 emulated GPU, --max_grad_norm 0, overlapped offload vs without" "$tmp/gn_ref" "$tmp/gn_off"
  # the same with gradient checkpointing (recomputed layers read the weights in place), and
  # LoRA (the adapters' state offloaded; the frozen bf16 base stays on the device)
  for c in "ck:--gradient_checkpointing ${noclip[*]}" "lora:${lora[*]}"; do
    k=${c%%:*}; read -r -a extra <<<"${c#*:}"
    FT_EMU_SEED=1 bin="$emu" run 1 "$tmp/g${k}_ref" "${gpu[@]}" "${extra[@]}"
    FT_EMU_SEED=3 bin="$emu" run 1 "$tmp/g${k}_off" "${gpu[@]}" "${extra[@]}" --offload_optimizer
    ! grep -q HAZARD "$tmp/g${k}_off.log" && ok "1 emulated GPU, offload with ${extra[*]}: no ordering hazard" \
      || bad "1 emulated GPU, offload with ${extra[*]}: $(grep -m1 'HAZARD\|error' "$tmp/g${k}_off.log")"
    if [ "$k" = ck ]; then close_run "1 emulated GPU, offload vs without, ${extra[*]}" "$tmp/g${k}_ref" "$tmp/g${k}_off"
    else
      w=$(worst_rel "$(metric "$tmp/g${k}_ref" loss)" "$(metric "$tmp/g${k}_off" loss)")
      e=$("$nmse" "$tmp/g${k}_ref/final/adapter_model.safetensors" "$tmp/g${k}_off/final/adapter_model.safetensors" 2>&1 | awk '{print $NF}')
      host=$(train_field "$tmp/g${k}_off/metrics.jsonl" 2 host)
      [ "$(metric "$tmp/g${k}_off" loss | wc -l)" -eq 4 ] && le "$w" 5e-4 && le "$e" 1e-3 && [ "${host:-0}" -gt 0 ] \
        && ok "1 emulated GPU, LoRA offload ($host host bytes) vs without: 4 step losses worst rel $w, PEFT adapters worst tensor NMSE $e" \
        || bad "1 emulated GPU, LoRA offload: losses '$w', adapters NMSE '$e', host bytes '$host'"
    fi
  done
  host=$(train_field "$tmp/g_off1/metrics.jsonl" 2 host); opt=$(train_field "$tmp/g_off1/metrics.jsonl" 2 optimizer)
  [ "$opt" = 0 ] && [ -n "$host" ] && [ "$host" -gt 0 ] && ok "emulated GPU offload: optimizer state on the host ($host bytes), device optimizer 0"     || bad "emulated GPU offload: host '$host', optimizer '$opt'"
  # FSDP over 2 emulated GPUs: stop at step 2 and resume, two seeds, against the straight run without the flag
  if have_mpi; then
    FT_EMU_SEED=1 bin="$emu" run 2 "$tmp/f_ref" "${gpu[@]}"
    for seed in 1 3; do
      FT_EMU_SEED=$seed bin="$emu" run 2 "$tmp/f_res$seed" "${gpu[@]}" --offload_optimizer --stop_at_step 2
      FT_EMU_SEED=$seed bin="$emu" run 2 "$tmp/f_res$seed" "${gpu[@]}" --offload_optimizer --resume latest
      grep -q "resumed from .*step_00000002 at step 2" "$tmp/f_res$seed.log" && ! grep -q HAZARD "$tmp/f_res$seed.log" \
        && ok "FSDP 2 emulated GPUs, seed $seed: offload resumed at step 2, no hazard" || bad "FSDP 2 emulated, seed $seed: no resume or a hazard"
      close_run "FSDP 2 emulated GPUs, seed $seed, offload 2 + resume + 2 vs straight without" "$tmp/f_ref" "$tmp/f_res$seed"
    done
    FT_EMU_SEED=1 bin="$emu" run 2 "$tmp/fn_ref" "${gpu[@]}" "${noclip[@]}"
    FT_EMU_SEED=3 bin="$emu" run 2 "$tmp/fn_off" "${gpu[@]}" "${noclip[@]}" --offload_optimizer
    ! grep -q HAZARD "$tmp/fn_off.log" && grep -q "host AdamW overlaps" "$tmp/fn_off.log" \
      && ok "FSDP 2 emulated GPUs, --max_grad_norm 0: host AdamW overlapped with the backward and its reduce-scatters, no hazard" \
      || bad "FSDP 2 emulated overlapped: $(grep -m1 'HAZARD\|error' "$tmp/fn_off.log")"
    close_run "FSDP 2 emulated GPUs, --max_grad_norm 0, overlapped offload vs without" "$tmp/fn_ref" "$tmp/fn_off"
  else skip_or_fail "FSDP over 2 emulated GPUs (no mpiexec, or built without MPI)"; fi
else skip_or_fail "$emu or $nmse not built (make test-bins)"; fi

# A build whose offload step does not wait for the parameters' copies to the device
# (-DFT_FAULT_SKIP_OFFLOAD_WAIT, kernels/kernels.mk): the next forward reads them unordered,
# and the emulated runtime must say so (exit 86, naming the copy and its stream).
fault="$build/tests/finetune_emu_fault_offload"
if [ -x "$fault" ]; then
  FT_EMU_SEED=1 "$fault" "${small[@]}" "${gpu[@]}" --max_steps 2 --offload_optimizer --out_dir "$tmp/fault" > "$tmp/fault.log" 2>&1; rc=$?
  line=$(grep -m1 -E 'HAZARD read-after-write: kernel [a-z_0-9]+ \([^)]*\) on stream [0-9]+ \(op #[0-9]+\) reads .* last written by cudaMemcpyAsync host-to-device \([0-9]+ bytes\) on stream [0-9]+' "$tmp/fault.log")
  [ $rc -eq 86 ] && [ -n "$line" ] && ok "offload without its parameter-copy wait: exit 86, ${line#cuda_emu: }" \
    || bad "offload fault not reported: rc $rc, $(grep -m1 'HAZARD\|error' "$tmp/fault.log")"
else skip_or_fail "$fault not built (make test-bins)"; fi

finish
