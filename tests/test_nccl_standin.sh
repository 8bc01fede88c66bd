#!/usr/bin/env bash
# The NCCL stand-in (tests/nccl_standin/nccl_standin.c: several ranks on ONE GPU, which NCCL
# refuses) tested without a GPU: build/tests/libnccl_standin_emu.so is the same source built
# against the emulated CUDA runtime, loaded by finetune_emu through src/comm_nccl.c's dlopen
# path (FT_NCCL_LIBRARY), exactly as the real one is on a GPU machine. Every run is checked by
# the emulator's ordering checker (a hazard exits 86): the stand-in's copies out and back,
# its gate (cuStreamWaitValue32) and the events around them against the compute stream.
#
#   1. FSDP over 2 emulated ranks on ONE emulated device (FT_EMU_SHARED_DEVICES=1: the
#      emulated NCCL refuses that, as NCCL does) through the stand-in: the losses and gradient
#      norms bitwise those of the emulated NCCL on 2 devices (the same MPI calls, bf16 summed in
#      fp32 and rounded once), and within bf16 tolerance of the single device (the tolerances
#      of tests/test_cuda_emu_train.sh); FT_EMU_STATS shows its collectives went through the
#      gate and none through the emulated NCCL
#   2. HSDP 2 x 2 (4 ranks: world, shard group, its reduce-scatter lane, replica group, i.e.
#      ncclCommSplit and concurrent communicators) and DDP over 2: bitwise the emulated NCCL's;
#      the stand-in accepts the communicators' ncclConfig_t (--nccl_max_ctas 8 for HSDP): its
#      16 communicators (4 per rank) report minCTAs 1, maxCTAs 8 (FT_EMU_NCCL_CONFIG)
#   3. another interleaving (FT_EMU_SEED=2) of FSDP 2: the same losses bitwise, no hazard
#   4. the fault build (FT_FAULT_SKIP_GATE: the copy back does not wait for the exchange):
#      the run must fail (a hazard, an error, or other losses)
#   5. a FT_NCCL_LIBRARY that does not exist: one line naming it
#   6. tests/gpu/multi_rank_gpu.sh (first light's multi_rank check) driven end to end on the
#      emulated device at 2 steps of a small job: its 8 checks pass
#   7. a rank that stops at step 3, or before the reduce-scatter lane's ncclCommSplit: rank 0
#      ends the job within --collective_timeout with the watchdog's one line (the stand-in
#      never blocks the host; its pending collectives are named by their events)
#
# 4 steps each (8 for the comparisons with the single device would add nothing here: the
# arithmetic is the emulated NCCL's, compared bitwise). 2m43 of CPU, 4.5 min wall (measured
# on the shared 2-core machine at load ~15; sections 1-5 alone: 1m46 of CPU, 2.5 to 7.7 min
# wall by the load).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_nccl_standin
emu=$build/tests/finetune_emu
lib=$build/tests/libnccl_standin_emu.so
fault=$build/tests/libnccl_standin_emu_fault_gate.so
if [ ! -x "$emu" ] || [ ! -e "$lib" ]; then skip_or_fail "$emu or $lib not built (needs CUDA headers and MPICH)"; finish; fi
if ! command -v mpiexec >/dev/null; then skip_or_fail "mpiexec not found"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export FT_EMU_SEED=1
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
fault=$(cd "$(dirname "$fault")" && pwd)/$(basename "$fault")
flags=(--device cuda --batch_size_per_device 1 --total_batch_size 4 --seq_len 64 --max_steps 4 --learning_rate 5e-3
       --max_eval_docs 4 --warmup_fraction 0)
why() { grep -m1 'error\|HAZARD' "$1" || tail -1 "$1"; }

# run NAME RANKS NCCL EXTRA...: NCCL = emu (the emulated NCCL, one device per rank) or the
# stand-in's path (all ranks on emulated device 0)
run() {
  local name=$1 n=$2 nccl=$3; shift 3
  local env=(); [ "$nccl" = emu ] || env=(FT_NCCL_LIBRARY="$nccl" FT_EMU_SHARED_DEVICES=1 FT_EMU_STATS=1)
  env "${env[@]}" timeout 300 mpiexec -n "$n" "$emu" "${flags[@]}" "$@" --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1
}
same() { [ "$(metric "$1" loss | wc -l)" = 4 ] && [ "$(step_logs "$1" | sed -E 's/,"(ms|mfu|tflops)[^,]*//g')" = \
                                                   "$(step_logs "$2" | sed -E 's/,"(ms|mfu|tflops)[^,]*//g')" ]; }

# the single device (reference for the tolerance) and FSDP 2 over the emulated NCCL
"$emu" "${flags[@]}" --batch_size_per_device 4 --out_dir "$tmp/one" >"$tmp/one.log" 2>&1 || bad "single device: $(why "$tmp/one.log")"
run fsdp2_emu 2 emu || bad "FSDP 2 over the emulated NCCL: $(why "$tmp/fsdp2_emu.log")"

# 1. FSDP 2 on one device through the stand-in
if run fsdp2 2 "$lib"; then
  same "$tmp/fsdp2" "$tmp/fsdp2_emu" && ok "FSDP 2, both ranks on one device, through the stand-in: 4 steps bitwise the emulated NCCL's (2 devices)" \
    || bad "FSDP 2 through the stand-in: losses $(metric "$tmp/fsdp2" loss | tr '\n' ' ') vs the emulated NCCL's $(metric "$tmp/fsdp2_emu" loss | tr '\n' ' ')"
  w=$(worst_rel "$(metric "$tmp/one" loss)" "$(metric "$tmp/fsdp2" loss)")
  g=$(worst_rel "$(metric "$tmp/one" grad_norm | head -1)" "$(metric "$tmp/fsdp2" grad_norm | head -1)")
  le "$w" 5e-3 && le "$g" 2e-3 && ok "FSDP 2 through the stand-in vs the single device: losses rel $w, step-1 norm rel $g" \
    || bad "FSDP 2 through the stand-in vs the single device: losses rel $w, step-1 norm rel $g"
  gates=$(sed -nE 's/^cuda_emu: issued cuStreamWaitValue32 ([0-9]+)$/\1/p' "$tmp/fsdp2.log" | head -1)
  [ "${gates:-0}" -gt 0 ] && ! grep -q '^cuda_emu: issued nccl' "$tmp/fsdp2.log" \
    && ok "its collectives went through the stand-in's gate ($gates cuStreamWaitValue32 on rank 0), none through the emulated NCCL" \
    || bad "stand-in not used: gates '$gates', $(grep -m1 '^cuda_emu: issued nccl' "$tmp/fsdp2.log")"
else bad "FSDP 2 through the stand-in: $(why "$tmp/fsdp2.log")"; fi

# 2. HSDP 2 x 2 and DDP 2
for c in "hsdp2x2:4:--dp_shard 2 --nccl_max_ctas 8" "ddp2:2:--no_fsdp"; do
  IFS=: read -r name n extra <<<"$c"
  # shellcheck disable=SC2086
  if run "${name}_emu" "$n" emu $extra && FT_EMU_NCCL_CONFIG=1 run "$name" "$n" "$lib" $extra; then
    same "$tmp/$name" "$tmp/${name}_emu" && ok "$name through the stand-in (all ranks on one device): bitwise the emulated NCCL's" \
      || bad "$name through the stand-in: $(metric "$tmp/$name" loss | tr '\n' ' ') vs $(metric "$tmp/${name}_emu" loss | tr '\n' ' ')"
  else bad "$name: $(why "$tmp/${name}_emu.log"); stand-in: $(why "$tmp/$name.log" 2>/dev/null)"; fi
done
k=$(grep -cE '^nccl_standin: NCCL communicator (init|split) \(rank [0-9] of [24]\): minCTAs 1, maxCTAs 8$' "$tmp/hsdp2x2.log")
[ "$k" = 16 ] && ok "HSDP 2 x 2 through the stand-in, --nccl_max_ctas 8: its 16 communicators took the config (maxCTAs 8)" \
  || bad "HSDP 2 x 2 stand-in config: $k of 16 communicators with maxCTAs 8: $(grep -m1 'nccl_standin: NCCL' "$tmp/hsdp2x2.log")"

# 3. another interleaving of the streams and the helper threads
if FT_EMU_SEED=2 run fsdp2_s2 2 "$lib"; then
  same "$tmp/fsdp2_s2" "$tmp/fsdp2" && ok "FT_EMU_SEED=2 (other delays): no hazard, the same 4 steps bitwise" \
    || bad "FT_EMU_SEED=2: losses differ: $(metric "$tmp/fsdp2_s2" loss | tr '\n' ' ')"
else bad "FT_EMU_SEED=2: $(why "$tmp/fsdp2_s2.log")"; fi

# 4. the fault: no gate before the copy back
if [ -e "$fault" ]; then
  if run fault 2 "$fault" && same "$tmp/fault" "$tmp/fsdp2"; then
    bad "FT_FAULT_SKIP_GATE went unnoticed (no hazard, same losses)"
  else ok "FT_FAULT_SKIP_GATE (copy back before the exchange) caught: $(grep -m1 'HAZARD\|error' "$tmp/fault.log" | cut -c1-160 || echo "losses $(metric "$tmp/fault" loss | tr '\n' ' ')")"; fi
else skip_or_fail "$fault not built"; fi

# 5. a library that is not there
err=$(FT_NCCL_LIBRARY=$tmp/none.so timeout 120 mpiexec -n 2 "$emu" "${flags[@]}" --out_dir "$tmp/none" 2>&1 >/dev/null | sort -u)
[ "$(grep -c 'error' <<<"$err")" -ge 1 ] && grep -q "none.so" <<<"$err" \
  && ok "FT_NCCL_LIBRARY naming a missing file: $(grep -m1 error <<<"$err" | cut -c1-150)" || bad "missing FT_NCCL_LIBRARY: '$err'"

# 6. first light's multi_rank script itself (tests/gpu/multi_rank_gpu.sh, never run on a GPU:
# a bug in its bookkeeping would cost a GPU session), on the emulated device with the emulated
# stand-in: 2 steps of a small job instead of 30 of the default, stop at step 1, no sanitizer
# (~1 min of CPU)
out=$(FT_EMU_SHARED_DEVICES=1 OMP_NUM_THREADS=1 FT_MULTI_RANK_BIN="$emu" FT_MULTI_RANK_LIB="$lib" FT_MULTI_RANK_STEPS=2 \
  FT_MULTI_RANK_STOP=1 FT_MULTI_RANK_FLAGS="--batch_size_per_device 1 --total_batch_size 4 --seq_len 32 --max_eval_docs 1" \
  FT_SANITIZER= timeout 600 bash "$(dirname "$0")/gpu/multi_rank_gpu.sh" "$build" "$tmp/multi_rank" 2>&1); rc=$?
[ $rc = 0 ] && grep -q "^multi_rank_gpu: 8 passed, 0 failed$" <<<"$out" \
  && ok "tests/gpu/multi_rank_gpu.sh on the emulated device: $(tail -1 <<<"$out") (1 rank, FSDP 2 and 4, HSDP 2 x 2, DDP 2, LoRA, offload, stop + resume at another world size)" \
  || bad "tests/gpu/multi_rank_gpu.sh on the emulated device: exit $rc: $(grep -m3 '^FAIL' <<<"$out") $(tail -1 <<<"$out")"

# 7. a rank that stops (test-only FT_TEST_STOP_AT_STEP / FT_TEST_STOP_BEFORE, as in
# tests/test_watchdog.sh): the stand-in never blocks the host (its helper waits), so rank 0's
# watchdog ends the job within --collective_timeout with its one line, naming the oldest
# collective not yet complete (the stand-in's events); rank 0 blocked inside ncclCommSplit
# (MPI_Comm_split) is ended by the watchdog's guard
stopped() {  # stopped NAME REGEX VAR=VALUE...
  local name=$1 want=$2; shift 2
  env FT_NCCL_LIBRARY="$lib" FT_EMU_SHARED_DEVICES=1 "$@" timeout 120 mpiexec -n 2 "$emu" "${flags[@]}" --max_steps 100000 \
    --collective_timeout 8 --out_dir "$tmp/$name" >"$tmp/$name.log" 2>"$tmp/$name.err"
  local rc=$? line; line=$(grep "finetune: error" "$tmp/$name.err")
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "finetune: error" "$tmp/$name.err")" = 1 ] && [[ "$line" =~ $want ]] \
    && ok "$name ($*) through the stand-in: exit $rc: $line" || bad "$name ($*): exit $rc: $(head -3 "$tmp/$name.err")"
}
stopped stop_at_step3 "^finetune: error: rank 0: step 3: .* made no progress for 8(\.[0-9])? s.*oldest unfinished: [a-z_ ]+ on the [a-z ]+ of 2 ranks, .*; aborting$" \
  FT_TEST_STOP_AT_STEP=3
stopped stop_before_split "^finetune: error: rank 0: setup: ncclCommSplit of the reduce-scatter lane \(shard group\) made no progress for 8(\.[0-9])? s \(--collective_timeout 8\); aborting$" \
  FT_TEST_STOP_BEFORE=nccl_split

finish
