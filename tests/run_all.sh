#!/usr/bin/env bash
# Run each test command given as an argument, echo its output, and print the grand total
# "all tests: N passed, N failed" from the per-binary "name: N passed, N failed" lines.
# Exits non-zero if any test command failed or printed a failure.
set -u
total_p=0; total_f=0; rc_all=0
for cmd in "$@"; do
  out=$(eval "$cmd" 2>&1); rc=$?
  printf '%s\n' "$out"
  line=$(printf '%s\n' "$out" | grep -E '^[A-Za-z0-9_.-]+: [0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -z "$line" ]; then
    echo "run_all: '$cmd' printed no summary line (rc=$rc)"; total_f=$((total_f+1)); rc_all=1; continue
  fi
  p=$(printf '%s' "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
  f=$(printf '%s' "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  total_p=$((total_p+p)); total_f=$((total_f+f))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then total_f=$((total_f+1)); echo "run_all: '$cmd' exited $rc"; fi
  [ $rc -ne 0 ] && rc_all=1
done
echo "all tests: $total_p passed, $total_f failed"
[ $total_f -eq 0 ] && [ $rc_all -eq 0 ]
