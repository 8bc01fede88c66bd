#!/usr/bin/env bash
# tests/test_run_all.sh [BUILD]: tests/run_all.sh itself, fed fake suite commands (echo,
# sleep, exit): its verdict for each (a pass, a failure, no summary line, a non-zero exit with
# nothing failed, a skip in each spelling, a suite that ran nothing), the totals, the exit
# status, one timing line per command and the five slowest at the end. Then the Makefile's
# test tiers (make test-list): every shell suite in exactly one tier, a suite not named in
# SLOW_TESTS in the fast one, and naming suites in SLOW_TESTS moves them, nothing lost. Needs
# no build. ~10 s (2 s of CPU).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_run_all
run_all="$(cd "$(dirname "$0")" && pwd)/run_all.sh"

# run_all.sh CMD..: its output into $out, its exit status into $rc
out=""; rc=0
run() { out=$(bash "$run_all" "$@" 2>&1); rc=$?; }
has() { printf '%s\n' "$out" | grep -qxF -- "$1"; }
has_re() { printf '%s\n' "$out" | grep -qE -- "$1"; }
lacks() { ! has_re "$1"; }

pass1="echo 'a: 3 passed, 0 failed'"
pass2="echo 'b: 2 passed, 0 failed'"
run "$pass1" "$pass2"
check "two passing suites: exit 0" [ $rc -eq 0 ]
check "two passing suites: total 5 passed, 0 failed" has "all tests: 5 passed, 0 failed"
check "no skipped line when nothing skipped" lacks "skipped something"

run "$pass1" "echo 'b: 1 passed, 2 failed'; exit 1"
check "a failing suite: exit non-zero" [ $rc -ne 0 ]
check "a failing suite: its failures counted" has "all tests: 4 passed, 2 failed"

run "$pass1" "echo no summary here"
check "no summary line: exit non-zero" [ $rc -ne 0 ]
check "no summary line: named and counted" has_re "^run_all: 'echo no summary here' printed no summary line \(rc=0\)$"
check "no summary line: one failure" has "all tests: 3 passed, 1 failed"

run "echo 'c: 2 passed, 0 failed'; exit 3"
check "non-zero exit, nothing failed: exit non-zero" [ $rc -ne 0 ]
check "non-zero exit, nothing failed: named" has_re "^run_all: '.*' exited 3$"
check "non-zero exit, nothing failed: one failure" has "all tests: 2 passed, 1 failed"

run "echo 'e: 0 passed, 0 failed'"
check "ran nothing, no skip line: exit non-zero" [ $rc -ne 0 ]
check "ran nothing, no skip line: named" has_re "ran no checks and printed no skip line$"
check "ran nothing, no skip line: one failure" has "all tests: 0 passed, 1 failed"

# skip lines: the lib.sh spelling, upper case (a C or C++ test's), and "Skipping"
for s in "skip: no widget" "SKIPPED (no widget)" "Skipping: no widget"; do
  run "echo '$s'; echo 'd: 0 passed, 0 failed'" "$pass1"
  check "ran nothing, '$s': exit 0" [ $rc -eq 0 ]
  check "ran nothing, '$s': listed as skipped" has "run_all: skipped something (see their skip lines): d"
  check "ran nothing, '$s': no failure" has "all tests: 3 passed, 0 failed"
done
# a word that only contains "skip" further on is no skip line
run "echo 'ok   unskipped'; echo 'd: 0 passed, 0 failed'"
check "'skip' inside a line is no skip line" has "all tests: 0 passed, 1 failed"
# a skip besides passing checks: still passes, still listed
run "echo 'skip: one part'; echo 'g: 4 passed, 0 failed'"
check "a partial skip passes" [ $rc -eq 0 ]
check "a partial skip is listed" has "run_all: skipped something (see their skip lines): g"

# timing: one line per command after its output, in whole seconds, and the five slowest
slow2="sleep 2.2; echo 's2: 1 passed, 0 failed'"
slow1="sleep 1.2; echo 's1: 1 passed, 0 failed'"
run "$pass1" "$slow1" "$pass2" "$slow2" "echo 'h: 1 passed, 0 failed'" "echo 'i: 1 passed, 0 failed'"
check "timed run: exit 0" [ $rc -eq 0 ]
timing=$(printf '%s\n' "$out" | grep -E '^run_all: [0-9]+ s, cpu [0-9]+ s  ')
check "one timing line per command (6)" [ "$(printf '%s\n' "$timing" | grep -c .)" -eq 6 ]
secs_of() { printf '%s\n' "$timing" | grep -F -- "  $1" | head -n 1 | sed -E 's/^run_all: ([0-9]+) s, cpu ([0-9]+) s .*/\1/'; }
cpu_of() { printf '%s\n' "$timing" | grep -F -- "  $1" | head -n 1 | sed -E 's/^run_all: ([0-9]+) s, cpu ([0-9]+) s .*/\2/'; }
t1=$(secs_of "$slow1"); t2=$(secs_of "$slow2"); tp=$(secs_of "$pass1")
check "sleep 1.2 timed at 1-6 s ($t1)" le 1 "${t1:-0}"
check "sleep 1.2 timed at most 6 s" le "${t1:-99}" 6
check "sleep 2.2 timed at least 2 s ($t2)" le 2 "${t2:-0}"
check "sleep 2.2 timed more than sleep 1.2" le "${t1:-99}" "$((${t2:-0} - 1))"
check "an echo timed at 0-2 s ($tp)" le "${tp:-99}" 2
# each timing line right after that command's summary line
check "timing line follows its suite's output" has_re "^s2: 1 passed, 0 failed$"
after=$(printf '%s\n' "$out" | grep -A1 -xF "s2: 1 passed, 0 failed" | tail -n 1)
check "timing line right after the suite's output ($after)" [ "$after" = "run_all: $t2 s, cpu 0 s  $slow2" ]
check "a sleep takes no CPU time" [ "$(cpu_of "$slow2")" = 0 ]
slowest=$(printf '%s\n' "$out" | sed -n '/^run_all: the slowest suites (6 suites, /,/^all tests/p' | grep -E '^run_all:   [0-9]+ s, cpu [0-9]+ s  ')
check "five slowest listed" [ "$(printf '%s\n' "$slowest" | grep -c .)" -eq 5 ]
check "slowest first: sleep 2.2" [ "$(printf '%s\n' "$slowest" | sed -n 1p)" = "run_all:   $t2 s, cpu 0 s  $slow2" ]
check "then sleep 1.2" [ "$(printf '%s\n' "$slowest" | sed -n 2p)" = "run_all:   $t1 s, cpu 0 s  $slow1" ]
check "the total last" [ "$(printf '%s\n' "$out" | tail -n 1)" = "all tests: 9 passed, 0 failed" ]
# CPU time: an awk loop of about 1 s of CPU (0.5 s to 2 s on the machines measured) against a
# sleep; the wall time grows with the machine's load, the CPU time much less
burn="awk 'BEGIN { for (i = 0; i < 4e7; i++) s += i; print \"j: 1 passed, 0 failed\" }'"
run "$burn" "$slow1"
timing=$(printf '%s\n' "$out" | grep -E '^run_all: [0-9]+ s, cpu [0-9]+ s  ')
check "a CPU-bound suite's CPU seconds counted ($(cpu_of "$burn") s)" le 1 "$(cpu_of "$burn")"
check "and not the sleep's ($(cpu_of "$slow1") s)" [ "$(cpu_of "$slow1")" = 0 ]
check "the CPU sum in the slowest line" has_re "^run_all: the slowest suites \(2 suites, [0-9]+ s in all, cpu $(cpu_of "$burn") s\):$"

# the tiers: `make test-list` prints "fast CMD" / "slow CMD", one a line
root="$(cd "$(dirname "$0")/.." && pwd)"
tiers() { make -s --no-print-directory -C "$root" test-list BUILD="$build" "$@" 2>"$tmp_err"; }
tmp_err=$(mktemp); trap 'rm -f "$tmp_err"' EXIT
list=$(tiers); list_rc=$?
check "make test-list works" [ $list_rc -eq 0 ]
check "no suite twice" [ -z "$(printf '%s\n' "$list" | sed 's/^[a-z]* //' | sort | uniq -d)" ]
missing=""
for f in "$root"/tests/test_*.sh; do
  n=$(printf '%s\n' "$list" | grep -cxE "(fast|slow) bash tests/${f##*/} $build")
  [ "$n" -eq 1 ] || missing="$missing ${f##*/}($n)"
done
check "every tests/test_*.sh in exactly one tier${missing:+:$missing}" [ -z "$missing" ]
# C and C++ tests: each one built (its binary in BUILD/tests) from a source that exists
missing=""; n_c=0
for f in "$root"/tests/test_*.c "$root"/tests/cuda_emu/test_*.c*; do
  t=${f##*/}; t=${t%.*}
  [ -x "$root/$build/tests/$t" ] || [ -x "$build/tests/$t" ] || continue
  n_c=$((n_c + 1))
  n=$(printf '%s\n' "$list" | grep -cxE "(fast|slow) $build/tests/$t")
  [ "$n" -eq 1 ] || missing="$missing $t($n)"
done
check "every built C test ($n_c) in exactly one tier${missing:+:$missing}" [ -z "$missing" ]
check "this suite (named nowhere) in the fast tier" bash -c 'printf "%s\n" "$1" | grep -qx "fast bash tests/test_run_all.sh $2"' _ "$list" "$build"
check "the slow tier is not empty" bash -c 'printf "%s\n" "$1" | grep -q "^slow "' _ "$list"
moved=$(tiers SLOW_TESTS="test_layers.sh test_ops")
check "SLOW_TESTS moves a script and a C test to the slow tier" \
  [ "$(printf '%s\n' "$moved" | grep '^slow ')" = "$(printf 'slow %s\n' "$build/tests/test_ops" "bash tests/test_layers.sh $build")" ]
check "and loses no suite" [ "$(printf '%s\n' "$moved" | sed 's/^[a-z]* //' | sort)" = "$(printf '%s\n' "$list" | sed 's/^[a-z]* //' | sort)" ]
tiers SLOW_TESTS="test_no_such_suite.sh" >/dev/null
check "a SLOW_TESTS name without a suite warns" grep -q "SLOW_TESTS: no tests/test_no_such_suite.sh" "$tmp_err"
finish
