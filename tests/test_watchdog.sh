#!/usr/bin/env bash
# test_watchdog.sh BUILD_DIR: a hung rank ends the job (--collective_timeout, src/watchdog.h),
# on 2 CPU ranks over MPI and on 2 emulated GPUs (NCCL transport; build/tests/finetune_emu,
# asynchronous emulated runtime). Measured on the 2-core development machine while other jobs
# ran: 67 s at load 11 (18 s of it on CPU ranks), 131 s at load 19.
#   1. an uninterrupted run, checkpoints every few steps, with the watchdog off
#      (--collective_timeout 0: plain MPI_Wait / cudaStreamSynchronize)
#   2. the same job (open-ended --max_steps) with a short --collective_timeout: after a few
#      steps rank 1 is stopped with SIGSTOP (found by its pid and PMI_RANK, never by a name
#      pattern). Rank 0 must end the job within the timeout + 10 s of margin (it reaches its
#      next wait within a step; MPI_Abort's teardown takes about a second), exit non-zero,
#      print exactly one "finetune: error:" line naming rank 0, the step, the operation, its
#      group and size (MPICH adds its own abort notice), and the stopped rank must be gone
#      too. CPU ranks: the operation is an MPI collective, and while it waits (past the
#      watchdog's 0.1-s spin phase) rank 0 must not burn a core: under 20% of one, measured
#      from /proc 1.5 to 3.5 s after the stop (a step takes 0.3 s). Emulated GPUs: the host
#      waits for its compute stream, and the line also names the oldest NCCL collective not
#      yet complete (then ncclCommAbort).
#   3. --resume latest from the last complete checkpoint with the default timeout finishes
#      the steps with exactly the uninterrupted run's weights and AdamW moments: the final
#      model.safetensors and optimizer.safetensors are equal byte for byte (the same ranks
#      sum in the same order; the watchdog changes how a wait is done, not what is computed).
#   4. (below) the emulated GPUs with a bounded launch queue: the host must not block inside a
#      launch (backend pace()), so a stopped peer still ends the job with the line.
# Timeouts: 4 s on CPU ranks; 8 s on the emulated GPUs, whose longest normal wait (the host
# waiting for a whole emulated step) stayed under 2 s with the machine at load 11 (a 2-s
# timeout did not fire). A missing prerequisite (MPI, the emulated binary) is a skip, a FAIL
# when CI=true.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_watchdog
emu="$build/tests/finetune_emu"
nmse="$build/tests/st_nmse"
if ! have_mpi; then skip_or_fail "no mpiexec, or $bin built without MPI (install mpich libmpich-dev; make MPI=1)"; finish; fi
tmp=$(mktemp -d)
jobs_started=()   # mpiexec processes of this test: their trees must not outlive it
cleanup() { for p in "${jobs_started[@]}"; do kill_tree "$p"; done; rm -rf "$tmp"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1
common=(--learning_rate 3e-3 --lr_schedule constant --warmup_fraction 0)

# bad values of the flag
for v in -1 abc; do
  err=$("$bin" --collective_timeout "$v" --out_dir "$tmp/bad" 2>&1 >/dev/null); rc=$?
  [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c .)" = 1 ] && [[ "$err" == *"--collective_timeout"* ]] && [ ! -e "$tmp/bad" ] \
    && ok "--collective_timeout $v: $err" || bad "--collective_timeout $v: rc $rc, '$err'"
done
"$bin" --help | grep -q -- "--collective_timeout .*(default: 600)" && ok "--help lists --collective_timeout (default 600 s)" \
  || bad "--help: no --collective_timeout"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
elapsed() { awk -v s="$1" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }

# hang_case NAME BINARY TIMEOUT STOP_AFTER_STEP LINE_REGEX flags...: section 2 for one job;
# the run's output goes to $tmp/NAME
hang_case() {
  local name="$1" b="$2" to="$3" after="$4" re="$5" mp r0="" r1="" p start busy=""
  shift 5
  mpiexec -n 2 "$b" "$@" --max_steps 100000 --collective_timeout "$to" --out_dir "$tmp/$name" \
    > "$tmp/$name.log" 2> "$tmp/$name.err" &
  mp=$!; jobs_started+=("$mp")
  for _ in $(seq 1 1200); do grep -q "^step *$after/" "$tmp/$name.log" 2>/dev/null && break; sleep 0.1; done
  for p in $(pgrep -P "$(pgrep -P "$mp" | head -1)"); do
    case "$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep '^PMI_RANK=')" in
      PMI_RANK=0) r0=$p ;; PMI_RANK=1) r1=$p ;;
    esac
  done
  if [ -z "$r0" ] || [ -z "$r1" ]; then bad "$name: no pids of the two ranks (log: $(tail -1 "$tmp/$name.log"))"; return; fi
  start=$(date +%s.%N)
  kill -STOP "$r1"
  if [ "$b" = "$bin" ]; then
    sleep 1.5; local c0; c0=$(cpu_ticks "$r0"); sleep 2
    busy=$(awk -v a="$c0" -v b="$(cpu_ticks "$r0")" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.0f", 100 * (b - a) / hz / 2 }')
  fi
  while kill -0 "$mp" 2>/dev/null && awk -v t="$(elapsed "$start")" -v m="$((to + 10))" 'BEGIN { exit !(t < m) }'; do sleep 0.1; done
  if kill -0 "$mp" 2>/dev/null; then
    bad "$name: SIGSTOP of rank 1: the job still runs $(elapsed "$start") s later (rank 0: $(tail -1 "$tmp/$name.log"))"
  else
    wait "$mp"; local rc=$? line
    line=$(grep "finetune: error" "$tmp/$name.err")
    [ "$rc" -ne 0 ] && [ "$(grep -c "finetune: error" "$tmp/$name.err")" = 1 ] && [[ "$line" =~ $re ]] \
      && ok "$name: SIGSTOP of rank 1: the job ended $(elapsed "$start") s later, exit $rc: $line" \
      || bad "$name: SIGSTOP of rank 1: exit $rc after $(elapsed "$start") s: $(cat "$tmp/$name.err")"
  fi
  if [ -n "$busy" ]; then
    [ "$busy" -lt 20 ] && ok "$name: rank 0 used ${busy}% of a core while waiting for the stopped rank" \
      || bad "$name: rank 0 used ${busy}% of a core while waiting (spinning instead of backing off)"
  fi
  for _ in $(seq 1 50); do kill -0 "$r1" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$r1" 2>/dev/null && bad "$name: the stopped rank $r1 outlived the job" || ok "$name: the stopped rank is gone as well"
}

# resume_case NAME BINARY STEPS flags...: section 3; $tmp/NAME.ref is the uninterrupted run
resume_case() {
  local name="$1" b="$2" steps="$3" last f got want
  shift 3
  last=$(cat "$tmp/$name/checkpoints/latest" 2>/dev/null)
  if ! timeout 300 mpiexec -n 2 "$b" "$@" --max_steps "$steps" --resume latest --out_dir "$tmp/$name" > "$tmp/$name.resume.log" 2>&1; then
    bad "$name: resume after the abort: $(grep -m1 error "$tmp/$name.resume.log")"; return
  fi
  for f in model optimizer; do
    got="$tmp/$name/checkpoints/step_$(printf %08d "$steps")/$f.safetensors"
    want="$tmp/$name.ref/checkpoints/step_$(printf %08d "$steps")/$f.safetensors"
    cmp -s "$got" "$want" && ok "$name: resumed from $last: step $steps $f.safetensors is byte for byte the uninterrupted run's" \
      || bad "$name: resumed from '$last': step $steps $f.safetensors differs: $("$nmse" "$got" "$want" 2>&1)"
  done
}

# run_case NAME BINARY STEPS TIMEOUT STOP_AFTER LINE_REGEX flags...: sections 1-3
run_case() {
  local name="$1" b="$2" steps="$3" to="$4" after="$5" re="$6"
  shift 6
  timeout 300 mpiexec -n 2 "$b" "$@" --max_steps "$steps" --collective_timeout 0 --out_dir "$tmp/$name.ref" \
    > "$tmp/$name.ref.log" 2>&1 || bad "$name: uninterrupted run failed: $(grep -m1 error "$tmp/$name.ref.log")"
  hang_case "$name" "$b" "$to" "$after" "$re" "$@"
  resume_case "$name" "$b" "$steps" "$@"
}

size='[0-9.]+ (B|KiB|MiB)'
# the phase: usually the step; a rank 1 ahead of rank 0 can let rank 0 finish the step and
# stop in the checkpoint (save_every 4) or evaluation after it, or in the next step's
# world all-reduce of the token count (each seen once in CI). In a checkpoint the deadline
# has the grace for rank 0's writing on top (src/watchdog.h), named in the line. On the emulated
# GPUs the host may be waiting in its pacing after a layer ("pacing: the work of two layers
# back", backend pace()) rather than in a synchronisation.
grace=" \\+ [0-9.]+ s for rank 0 writing the checkpoint, $size"
run_case cpu "$bin" 12 4 6 \
  "^finetune: error: rank 0: ((checkpoint|eval) at )?step [0-9]+: [a-z_ ]+ \(((shard|replica) group|world) of 2 ranks, $size\) made no progress for 4(\.[0-9])? s \(--collective_timeout 4($grace)?\); aborting$" \
  --seq_len 64 --batch_size_per_device 2 --total_batch_size 8 --max_eval_docs 16 --save_every 4 "${common[@]}"
if [ -x "$emu" ]; then
  run_case emulated_gpus "$emu" 4 8 3 \
    "^finetune: error: rank 0: ((checkpoint|eval) at )?step [0-9]+: (pacing: )?[a-z_ ]+ \([a-z ]+(, $size)?\) made no progress for 8(\.[0-9])? s \(--collective_timeout 8($grace)?; oldest unfinished: [a-z_ ]+ on the (shard|replica) group of 2 ranks, $size, enqueued in step [0-9]+\); aborting$" \
    --device cuda --seq_len 64 --batch_size_per_device 1 --total_batch_size 4 --max_eval_docs 4 --save_every 2 "${common[@]}"
else skip_or_fail "$emu not built (needs the CUDA headers, CUDA=1): the emulated-GPU case"; fi

# 4. A full launch queue. A real device queues about a thousand launches, then blocks the host
# inside the next launch, outside every deadline; a 7B micro-batch queues more than that
# before its next host wait. The emulated device gets a queue of 96 (FT_EMU_MAX_QUEUE, below
# the ~155 operations of the bundled model's micro-batch) and rank 1 stops itself as step 3
# begins its first forward (test-only FT_TEST_STOP_AT_STEP, past the step's host all-reduce): rank 0's
# compute stream stalls at the step's first gather while its host keeps queueing. The host
# paces itself (backend pace(): at most 2 layers ahead, a deadline-bound wait), so the job
# must end with the one line. Can fail: with pace() made a no-op this check failed, the job
# still running 60 s after its start, rank 0 blocked in a kernel launch (measured
# 2026-11-26; it ends in about 10 s with pacing); at a queue of 50 even
# the paced host blocks (2 layers of this model's backward and their waits are ~60 items).
# stopped_case NAME REGEX VAR=VALUE...: two emulated GPU ranks with the environment given,
# rank 1 stopping itself somewhere (a test-only variable); the job must end within 60 s, non-zero,
# with exactly one error line matching REGEX.
stopped_case() {
  local name=$1 want=$2; shift 2
  env "$@" mpiexec -n 2 "$emu" --device cuda --seq_len 64 --batch_size_per_device 1 --total_batch_size 4 \
    --max_eval_docs 4 --max_steps 100000 --collective_timeout 8 "${common[@]}" --out_dir "$tmp/$name" \
    > "$tmp/$name.log" 2> "$tmp/$name.err" &
  local mp=$! start; jobs_started+=("$mp"); start=$(date +%s.%N)
  while kill -0 "$mp" 2>/dev/null && awk -v t="$(elapsed "$start")" 'BEGIN { exit !(t < 60) }'; do sleep 0.2; done
  if kill -0 "$mp" 2>/dev/null; then
    bad "$name ($*): the job still runs $(elapsed "$start") s after its start (rank 0: $(tail -1 "$tmp/$name.log"))"
    kill_tree "$mp"
    return
  fi
  local rc line
  wait "$mp"; rc=$?; line=$(grep "finetune: error" "$tmp/$name.err")
  [ "$rc" -ne 0 ] && [ "$(grep -c "finetune: error" "$tmp/$name.err")" = 1 ] && [[ "$line" =~ $want ]] \
    && ok "$name ($*): the job ended after $(elapsed "$start") s, exit $rc: $line" \
    || bad "$name ($*): exit $rc: $(cat "$tmp/$name.err")"
}
if [ -x "$emu" ]; then
  stopped_case queue96 "^finetune: error: rank 0: step 3: .* made no progress for 8(\.[0-9])? s.*oldest unfinished: .*; aborting$" \
    FT_EMU_MAX_QUEUE=96 FT_TEST_STOP_AT_STEP=3
fi

# 5. NCCL's init and split. They wait for every rank of the group without a deadline of their
# own (a rank that stopped or died after the last barrier, a network NCCL cannot reach); they
# run under the watchdog's guard (a thread that ends the job from outside the blocked call).
# Rank 1 stops itself right before the call (test-only FT_TEST_STOP_BEFORE), after the id's
# broadcast / the split's barrier; rank 0 blocks inside the emulated NCCL call (an MPI
# collective). Can fail: without the guard (CHECK_NCCL instead of CHECK_NCCL_GUARDED) both
# jobs ran past 60 s (measured 2026-11-26).
if [ -x "$emu" ]; then
  for call in nccl_init nccl_split; do
    stopped_case "stop_before_$call" "^finetune: error: rank 0: setup: (ncclCommInitRank(Config)? \\(world of 2 ranks\\)|ncclCommSplit of the reduce-scatter lane \\(shard group\\)) made no progress for 8(\\.[0-9])? s \\(--collective_timeout 8\\); aborting$" FT_TEST_STOP_BEFORE=$call
  done
fi
finish
