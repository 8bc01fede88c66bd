#!/usr/bin/env bash
# test_early_update.sh BUILD_DIR: the device AdamW that starts in the backward (src/fsdp.c
# fsdp_update_early, early_update) and the gradient norm taken unit by unit (norm_add).
#
# Without clipping (--max_grad_norm 0) the AdamW parameters are known before the backward, so
# each layer unit is updated as soon as its gradient slice is final in the step's last
# micro-batch (after its backward with one shard; after its reduce-scatter, held back behind
# the next layer's, when sharded), and the root and anything left wait for the optimizer step.
# AdamW is elementwise, so the result must be bit for bit that of the update after the backward.
# The reference is the same job with --max_grad_norm 1e30: clipping on, so nothing starts
# early, and its scale min(1, 1e30 / (norm + 1e-6)) is exactly 1.0f, so the arithmetic per
# element is the same. Both runs take the norm the same way (per unit), so the step logs (loss,
# lr, grad norm) and the final model and optimizer state must be byte-identical:
#   1. CPU ranks: one process (the layers updated right after their backward), FSDP 2 and
#      FSDP 3 over MPI, FSDP 2 with 2 micro-batches and --keep_params_gathered, FSDP 2 with
#      --accumulate_grads_locally, FSDP 2 with checkpointing and --reduce_dtype fp32, LoRA
#      over FSDP 2, DDP 2 (replicas: no early update, the same either way);
#   2. emulated GPUs (asynchronous streams with hazard checks): one GPU and FSDP 2 with 2
#      micro-batches; no HAZARD line (the early AdamW writes a unit's working parameters while
#      the all-gather of the next layer reads another unit's slice of the same buffer).
# An update that read a gradient slice before its last contribution (before the reduce-scatter
# was added, or in the first micro-batch), or skipped a unit, or updated one twice, changes the
# weights. Runtime: about 20 s of CPU (9 CPU job pairs of 3 steps, 2 emulated pairs of 2 steps).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_early_update
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
export FT_TEST_POISON_FRESH_GRADS=1   # an element the backward fails to write is NaN, not stale
small=(--seq_len 64 --batch_size_per_device 2 --total_batch_size 8 --max_eval_docs 4 --learning_rate 3e-3
       --save_dtype fp32 --max_steps 3 --save_every 3 --eval_every 0 --warmup_fraction 0)
lora=(--lora_rank 4 --lora_targets q,v)
steps=3

# pair NAME RANKS BINARY flags...: the job with --max_grad_norm 0 and with 1e30, compared
pair() {
  local name="$1" n="$2" b="$3" rc f m; shift 3
  for m in 0 1e30; do
    if [ "$n" -eq 1 ]; then timeout 300 "$b" "${small[@]}" "$@" --max_grad_norm $m --out_dir "$tmp/$name.$m" \
        > "$tmp/$name.$m.log" 2>&1
    else timeout 300 mpiexec -n "$n" "$b" "${small[@]}" "$@" --max_grad_norm $m --out_dir "$tmp/$name.$m" \
        > "$tmp/$name.$m.log" 2>&1; fi
    rc=$?
    [ $rc -eq 0 ] || { bad "$name, --max_grad_norm $m: rc $rc: $(grep -m1 'error\|HAZARD' "$tmp/$name.$m.log")"; return; }
  done
  local a="$tmp/$name.0" r="$tmp/$name.1e30"
  [ "$(step_logs "$a")" = "$(step_logs "$r")" ] && [ "$(step_logs "$a" | wc -l)" -eq $steps ] \
    && ok "$name: early AdamW vs after the backward: the $steps step logs (loss, lr, grad norm) identical" \
    || bad "$name: step logs differ"
  for f in checkpoints/step_00000003/model.safetensors checkpoints/step_00000003/optimizer.safetensors \
           final/model.safetensors final/adapter_model.safetensors; do
    [ -e "$r/$f" ] || continue
    cmp -s "$a/$f" "$r/$f" && ok "$name: $f byte-identical" || bad "$name: $f differs"
  done
  ! grep -q HAZARD "$a.log" "$r.log" || bad "$name: a HAZARD line: $(grep -m1 -h HAZARD "$a.log" "$r.log")"
}

# ---------------------------------------------------------------- 1. CPU ranks
pair one 1 "$bin"
pair one_lora 1 "$bin" "${lora[@]}"
if have_mpi; then
  pair fsdp2 2 "$bin"
  pair fsdp3 3 "$bin" --total_batch_size 6
  pair fsdp2_keep_accum2 2 "$bin" --batch_size_per_device 1 --keep_params_gathered
  pair fsdp2_local 2 "$bin" --batch_size_per_device 1 --accumulate_grads_locally
  pair fsdp2_ckpt_f32 2 "$bin" --gradient_checkpointing --reduce_dtype fp32
  pair fsdp2_lora 2 "$bin" "${lora[@]}"
  pair ddp2 2 "$bin" --no_fsdp
else skip_or_fail "MPI runs (no mpiexec, or $bin built without MPI)"; fi

# ---------------------------------------------------------------- 2. emulated GPUs
emu="$build/tests/finetune_emu"
if [ -x "$emu" ] && have_mpi; then
  small+=(--device cuda --max_steps 2 --save_every 0)   # (bf16; the final save only)
  steps=2
  export FT_EMU_SEED=1
  pair emu_one 1 "$emu" --batch_size_per_device 4 --total_batch_size 4
  pair emu_fsdp2_accum2 2 "$emu" --batch_size_per_device 1 --total_batch_size 4
else skip_or_fail "emulated GPUs: $emu not built (make CUDA=1) or no mpiexec"; fi

finish
