#!/usr/bin/env bash
# test_watchdog.sh BUILD_DIR: a hung rank ends the job (--collective_timeout, src/watchdog.h),
# on CPU ranks over MPI (mpiexec, MPICH). 18 s measured on the 2-core development machine.
#   1. an uninterrupted 2-rank FSDP run, 12 steps, checkpoints every 4, with the watchdog
#      off (--collective_timeout 0: plain MPI_Wait)
#   2. the same job (open-ended --max_steps) with --collective_timeout 4: after step 6, rank 1
#      is stopped with SIGSTOP (found by its pid and PMI_RANK, never by a name pattern). Rank 0
#      must end the job within the timeout + 10 s of margin (it reaches its next collective
#      within one step; MPI_Abort's teardown takes about a second), exit non-zero, print
#      exactly one "finetune: error:" line naming rank 0, the step, the operation, its group
#      and size (MPICH adds its own abort notice), and the stopped rank must be gone too. While
#      it waits (past the watchdog's 0.1-s spin phase) rank 0 must not burn a core: under 20%
#      of one, measured from /proc between 1.5 and 3.5 s after the stop (it reaches the
#      collective within a step, 0.3 s here).
#   3. --resume latest from the last complete checkpoint (step 4) with the default timeout
#      finishes the 12 steps with exactly the uninterrupted run's weights and AdamW moments:
#      the step-12 model.safetensors and optimizer.safetensors are equal byte for byte (the
#      same ranks sum in the same order; the watchdog changes how a collective is waited
#      for, not what it computes).
# Skips (and says so) when finetune was built without MPI; a FAIL when CI=true.
set -u
build="${1:-build}"
bin="$build/finetune"
nmse="$build/tests/st_nmse"
pass=0; fail=0
ok()  { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
if ! command -v mpiexec >/dev/null || ! nm "$bin" 2>/dev/null | grep -q MPI_Init; then
  if [ "${CI:-}" = true ]; then bad "$bin built without MPI or no mpiexec"
  else echo "skip: $bin was built without MPI or mpiexec is missing (install libmpich-dev; make MPI=1)"; fi
  echo "test_watchdog: $pass passed, $fail failed"; [ $fail -eq 0 ]; exit
fi
tmp=$(mktemp -d)
pids=()   # processes this test started that must not outlive it
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1
flags=(--seq_len 64 --batch_size_per_device 2 --total_batch_size 8 --max_eval_docs 16 --learning_rate 3e-3
       --lr_schedule constant --warmup_fraction 0 --save_every 4)

# bad values of the flag
for v in -1 abc; do
  err=$("$bin" --collective_timeout "$v" --out_dir "$tmp/bad" 2>&1 >/dev/null); rc=$?
  [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c .)" = 1 ] && [[ "$err" == *"--collective_timeout"* ]] && [ ! -e "$tmp/bad" ] \
    && ok "--collective_timeout $v: $err" || bad "--collective_timeout $v: rc $rc, '$err'"
done
"$bin" --help | grep -q -- "--collective_timeout .*(default: 600)" && ok "--help lists --collective_timeout (default 600 s)" \
  || bad "--help: no --collective_timeout"

# ---------------------------------------------------------------- 1. uninterrupted
timeout 300 mpiexec -n 2 "$bin" "${flags[@]}" --max_steps 12 --collective_timeout 0 --out_dir "$tmp/ref" > "$tmp/ref.log" 2>&1 \
  || bad "uninterrupted run failed: $(grep -m1 error "$tmp/ref.log")"

# ---------------------------------------------------------------- 2. SIGSTOP of rank 1
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
mpiexec -n 2 "$bin" "${flags[@]}" --max_steps 100000 --collective_timeout 4 --out_dir "$tmp/hang" \
  > "$tmp/hang.log" 2> "$tmp/hang.err" &
mp=$!; pids+=("$mp")
for _ in $(seq 1 600); do grep -q "^step    6/" "$tmp/hang.log" 2>/dev/null && break; sleep 0.1; done
r0=""; r1=""
for proxy in $(pgrep -P "$mp"); do
  for p in $(pgrep -P "$proxy"); do
    pids+=("$p")
    case "$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep '^PMI_RANK=')" in
      PMI_RANK=0) r0=$p ;; PMI_RANK=1) r1=$p ;;
    esac
  done
done
if [ -z "$r0" ] || [ -z "$r1" ]; then
  bad "could not find the two ranks' pids (mpiexec $mp; log: $(tail -1 "$tmp/hang.log"))"
else
  start=$(date +%s.%N)
  kill -STOP "$r1"
  sleep 1.5; c0=$(cpu_ticks "$r0"); sleep 2; c1=$(cpu_ticks "$r0")
  busy=$(awk -v a="$c0" -v b="$c1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.0f", 100 * (b - a) / hz / 2 }')
  while kill -0 "$mp" 2>/dev/null && awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { exit !(n - s < 14) }'; do sleep 0.1; done
  took=$(awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  if kill -0 "$mp" 2>/dev/null; then
    bad "SIGSTOP of rank 1: the job still runs ${took} s later (rank 0: $(tail -1 "$tmp/hang.log"))"
  else
    wait "$mp"; rc=$?
    lines=$(grep -c "finetune: error" "$tmp/hang.err")
    line=$(grep "finetune: error" "$tmp/hang.err")
    re='^finetune: error: rank 0: step [0-9]+: [a-z_ ]+ \((shard|replica) group of 2 ranks, [0-9.]+ (B|KiB|MiB)\) made no progress for 4(\.[0-9])? s \(--collective_timeout 4\); aborting$'
    [ "$rc" -ne 0 ] && [ "$lines" = 1 ] && [[ "$line" =~ $re ]] \
      && ok "SIGSTOP of rank 1: the job ended ${took} s later, exit $rc: $line" \
      || bad "SIGSTOP of rank 1: exit $rc after ${took} s, $lines error line(s): $(cat "$tmp/hang.err")"
  fi
  [ "$busy" -lt 20 ] && ok "rank 0 used ${busy}% of a core while waiting for the stopped rank" \
    || bad "rank 0 used ${busy}% of a core while waiting (spinning instead of backing off)"
  for _ in $(seq 1 50); do kill -0 "$r1" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$r1" 2>/dev/null && bad "the stopped rank $r1 outlived the job" || ok "the stopped rank is gone as well"
fi

# ---------------------------------------------------------------- 3. resume
last=$(cat "$tmp/hang/checkpoints/latest" 2>/dev/null)
if timeout 300 mpiexec -n 2 "$bin" "${flags[@]}" --max_steps 12 --resume latest --out_dir "$tmp/hang" > "$tmp/resume.log" 2>&1; then
  for f in model optimizer; do
    got="$tmp/hang/checkpoints/step_00000012/$f.safetensors" want="$tmp/ref/checkpoints/step_00000012/$f.safetensors"
    cmp -s "$got" "$want" && ok "resumed from $last: step 12 $f.safetensors is byte for byte the uninterrupted run's" \
      || bad "resumed from '$last': step 12 $f.safetensors differs: $("$nmse" "$got" "$want" 2>&1)"
  done
else bad "resume after the abort: $(grep -m1 error "$tmp/resume.log")"; fi

echo "test_watchdog: $pass passed, $fail failed"
[ $fail -eq 0 ]
