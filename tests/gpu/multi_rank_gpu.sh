#!/usr/bin/env bash
# tests/gpu/multi_rank_gpu.sh BUILD [LOG_DIR]: several ranks on the ONE GPU of a lent machine
# (first_light.sh's multi_rank check). NCCL refuses two ranks on one device ("Duplicate GPU
# detected"), so the ranks' collectives go through the test-only NCCL stand-in
# (BUILD/tests/libnccl_standin.so, FT_NCCL_LIBRARY; tests/nccl_standin/nccl_standin.c:
# host-staged over MPI, stream-ordered) while everything else is real: kernels, cuBLASLt,
# streams, events, src/comm_nccl.c's ordering, FSDP's prefetch and overlapped reduce-scatters.
# NEVER RUN ON A REAL GPU YET (written 2026-11-28; its emulated twin is tests/test_nccl_standin.sh).
#
#   wave 1 (at once): the default job of tests/gpu/test_gpu.sh (batch 8 per device, 32 in
#     all, lr 5e-3, 30 steps) on 1 rank, and over FSDP 2, FSDP 4, HSDP 2 x 2 and DDP 2
#   wave 2: LoRA (rank 5, all projections) on 1 rank and over FSDP 2; --offload_optimizer over
#     FSDP 2; FSDP 2 stopped at step 10 (--stop_at_step) then resumed over FSDP 4
#   wave 3: compute-sanitizer memcheck and racecheck, each over 2 ranks, 2 short steps
#
# Each multi-rank run's per-step losses against the 1-rank run within test_gpu.sh's FSDP
# tolerance (1e-2: the ranks sum the bf16 gradients in another order), the resumed run's steps
# 11..30 too. --attention native everywhere (our kernels: no cuDNN plan compiles per rank at
# start-up, and racecheck judges our kernels); the cuDNN path is test-gpu's.
# MPI: mpiexec on PATH (first_light.sh puts the bundle's first), MPI_THREAD_MULTIPLE asked of
# MPICH (the stand-in's helper threads call MPI). Output: ok/FAIL lines and
# "multi_rank_gpu: N passed, M failed". Time on an H100/H200: unmeasured (budget 150 s).
#
# For a dry run of this script without a GPU (tests/test_nccl_standin.sh drives it on the
# emulated device): FT_MULTI_RANK_BIN (the binary), FT_MULTI_RANK_LIB (the stand-in),
# FT_MULTI_RANK_STEPS / FT_MULTI_RANK_STOP (30 / 10), FT_MULTI_RANK_FLAGS (more flags, after
# the job's: later flags win), FT_SANITIZER= (empty: no sanitizer wave).
set -u
. "$(dirname "$0")/../lib.sh" multi_rank_gpu
build=${1:?usage: multi_rank_gpu.sh BUILD [LOG_DIR]}
bin=${FT_MULTI_RANK_BIN:-$build/finetune}
keep=${2:-}
lib=${FT_MULTI_RANK_LIB:-$(cd "$build/tests" 2>/dev/null && pwd)/libnccl_standin.so}
steps=${FT_MULTI_RANK_STEPS:-30} stop=${FT_MULTI_RANK_STOP:-10}
# the runs' logs and output folders: LOG_DIR when given (kept, also when a time limit ends the
# script: first_light.sh packs it, less the safetensors), else a temporary folder
if [ -n "$keep" ]; then mkdir -p "$keep" && tmp=$(cd "$keep" && pwd) || exit 2
else tmp=$(mktemp -d /tmp/ft-multi-rank.XXXXXX); fi
finish_hook() { [ -n "$keep" ] || rm -rf "$tmp"; }
if [ ! -e "$lib" ]; then bad "$lib not built (make ... $build/tests/libnccl_standin.so: needs MPICH)"; finish; fi
if ! command -v mpiexec >/dev/null; then bad "mpiexec not found (the bundle's MPICH: scripts/gpu_bundle.sh)"; finish; fi
export FT_NCCL_LIBRARY=$lib MPIR_CVAR_DEFAULT_THREAD_LEVEL=MPI_THREAD_MULTIPLE OMP_NUM_THREADS=1
# more hardware queues than the default 8: a stream gated on the stand-in's wait must not
# share a queue with one it waits for (CUDA's stream memory operations' deadlock warning)
export CUDA_DEVICE_MAX_CONNECTIONS=32

flags=(--device cuda --attention native --model_dir data/model --data_dir data/chess --batch_size_per_device 8
       --total_batch_size 32 --learning_rate 5e-3 --max_steps "$steps" --eval_every 0 --save_every 0 --sample_tokens 0)
# shellcheck disable=SC2206
flags+=(${FT_MULTI_RANK_FLAGS:-})
# (test_gpu.sh's compare) A B TOL: worst per-step relative loss difference, must be <= TOL
compare() {
  local a b w
  a=$(metric "$1" loss) b=$(metric "$2" loss)
  [ "$(grep -c . <<<"$b")" -ge "$steps" ] || { echo "missing-steps"; return 1; }
  w=$(worst_rel "$a" "$b")
  echo "$w"
  le "$w" "$3"
}
why() { grep -m1 -iE 'error|nccl stand-in' "$1" 2>/dev/null || tail -1 "$1" 2>/dev/null; }
# job NAME RANKS EXTRA...: in the background, output in $tmp/NAME.log
job() {
  local name=$1 n=$2; shift 2
  if [ "$n" = 1 ]; then "$bin" "${flags[@]}" "$@" --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1 &
  else mpiexec -n "$n" "$bin" "${flags[@]}" "$@" --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1 & fi
}
judge() {   # judge NAME WHAT REF TOL [PIDSTATUS]
  local w
  if [ "$5" = 0 ] && w=$(compare "$tmp/$3" "$tmp/$1" "$4"); then ok "$2: losses follow 1 rank over $steps steps (worst rel $w)"
  else bad "$2: exit $5, $(why "$tmp/$1.log") ${w:-}"; fi
}

# ---------------------------------------------------------------- wave 1
job one 1; p1=$!
job fsdp2 2; p2=$!
job fsdp4 4; p3=$!
job hsdp2x2 4 --dp_shard 2; p4=$!
job ddp2 2 --no_fsdp; p5=$!
wait $p1; s1=$?; wait $p2; s2=$?; wait $p3; s3=$?; wait $p4; s4=$?; wait $p5; s5=$?
if [ $s1 = 0 ] && [ "$(metric "$tmp/one" loss | wc -l)" = "$steps" ]; then ok "1 rank: $steps steps, loss $(metric "$tmp/one" loss | head -1) -> $(metric "$tmp/one" loss | tail -1)"
else bad "1 rank (the reference): exit $s1, $(why "$tmp/one.log")"; fi
judge fsdp2 "FSDP 2 on one GPU (stand-in)" one 1e-2 $s2
judge fsdp4 "FSDP 4 on one GPU" one 1e-2 $s3
judge hsdp2x2 "HSDP 2 x 2 on one GPU" one 1e-2 $s4
judge ddp2 "DDP 2 on one GPU" one 1e-2 $s5

# ---------------------------------------------------------------- wave 2
lora=(--lora_rank 5 --lora_targets q,k,v,o,gate,up,down)
job lora1 1 "${lora[@]}"; q1=$!
job lora2 2 "${lora[@]}"; q2=$!
job offload2 2 --offload_optimizer; q3=$!
job stop2 2 --stop_at_step "$stop"; q4=$!
wait $q1; t1=$?; wait $q2; t2=$?; wait $q3; t3=$?; wait $q4; t4=$?
[ $t1 = 0 ] || bad "LoRA on 1 rank: exit $t1, $(why "$tmp/lora1.log")"
judge lora2 "LoRA over FSDP 2" lora1 1e-2 $t2
judge offload2 "--offload_optimizer over FSDP 2" one 1e-2 $t3
if [ $t4 = 0 ] && [ "$(metric "$tmp/stop2" loss | wc -l)" = "$stop" ]; then
  # resumed at another world size: FSDP 4, the same global batch (without --stop_at_step: the
  # stopped job's own line would train nothing past its stop)
  if mpiexec -n 4 "$bin" "${flags[@]}" --resume latest --out_dir "$tmp/stop2" >"$tmp/resume4.log" 2>&1 &&
     [ "$(metric "$tmp/stop2" loss | wc -l)" = "$steps" ] &&
     w=$(worst_rel "$(metric "$tmp/one" loss | tail -n +$((stop + 1)))" "$(metric "$tmp/stop2" loss | tail -n +$((stop + 1)))") &&
     le "$w" 1e-2; then
    ok "FSDP 2 stopped at step $stop, resumed over FSDP 4: steps $((stop + 1))..$steps follow 1 rank (worst rel $w)"
  else bad "stop at $stop over FSDP 2, resume over FSDP 4: $(why "$tmp/resume4.log") ${w:-} ($(metric "$tmp/stop2" loss | wc -l) steps)"; fi
else bad "FSDP 2 --stop_at_step $stop: exit $t4, $(why "$tmp/stop2.log")"; fi

# ---------------------------------------------------------------- wave 3
san=${FT_SANITIZER-$(command -v compute-sanitizer)}
if [ -n "$san" ]; then
  short=(--batch_size_per_device 2 --total_batch_size 4 --seq_len 64 --max_steps 2 --max_eval_docs 2)
  for tool in memcheck racecheck; do
    mpiexec -n 2 "$san" --tool $tool --error-exitcode 7 --print-limit 30 "$bin" "${flags[@]}" "${short[@]}" \
      --out_dir "$tmp/san_$tool" >"$tmp/san_$tool.log" 2>&1 &
    eval "r_$tool=\$!"
  done
  for tool in memcheck racecheck; do
    eval "wait \$r_$tool"; rc=$?
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$tmp/san_$tool.log" | sort -u | tr '\n' ' ')
    [ $rc = 0 ] && ok "compute-sanitizer $tool over 2 ranks on one GPU: $summary" \
      || bad "compute-sanitizer $tool over 2 ranks: exit $rc, $summary $(why "$tmp/san_$tool.log")"
  done
else echo "skip: compute-sanitizer not found"; fi
finish
