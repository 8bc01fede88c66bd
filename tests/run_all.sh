#!/usr/bin/env bash
# tests/run_all.sh CMD...: run each test command, echo its output, and add up the per-suite
# summary lines "name: N passed, M failed" (the last such line a command prints) into
#     all tests: N passed, M failed
# A command counts one extra failure when it prints no summary line, when it exits non-zero
# with no failure counted, or when it ran nothing (0 passed, 0 failed) without saying why on
# a skip line. A skip line is any output line that begins with "skip", in any case ("skip:
# WHY", skip_or_fail in tests/lib.sh, is the usual spelling). Suites that skipped something
# (a missing prerequisite; under CI=true that is a failure already) are listed on one line
# before the total. Exits non-zero if any command failed or printed a failure.
#
# Time: after each command's output, one line "run_all: S s, cpu U s  CMD": S its wall
# seconds, U the CPU seconds (user + sys) of its processes (those waited for), both rounded
# to whole seconds; on a loaded machine S grows, U much less. Before the total, the five
# slowest commands (by wall time) and the sums.
set -u
total_p=0; total_f=0; rc_all=0; skipped=(); times=(); cpu_sum=0
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }
times_file=$(mktemp); trap 'rm -f "$times_file"' EXIT
cpu_now() {   # cpu_ms = CPU milliseconds (user + sys) of this shell's finished children so far
  local u s v m sec
  times > "$times_file"   # (the builtin in this shell: a subshell would count its own children)
  { read -r _; read -r u s; } < "$times_file"
  cpu_ms=0
  for v in "$u" "$s"; do   # "1m2.345s"
    v=${v%s}; m=${v%%m*}; sec=${v#*m}; sec=${sec/[.,]/}
    cpu_ms=$((cpu_ms + 10#$m * 60000 + 10#$sec))
  done
}
for cmd in "$@"; do
  t0=$(now_ms); cpu_now; c0=$cpu_ms
  out=$(eval "$cmd" 2>&1); rc=$?
  secs=$(( ($(now_ms) - t0 + 500) / 1000 )); cpu_now; cpu=$(( (cpu_ms - c0 + 500) / 1000 ))
  times+=("$secs	$cpu	${cmd//$'\n'/ }"); cpu_sum=$((cpu_sum + cpu))
  printf '%s\n' "$out"
  line=$(printf '%s\n' "$out" | grep -E '^[A-Za-z0-9_.-]+: [0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -z "$line" ]; then
    echo "run_all: '$cmd' printed no summary line (rc=$rc)"; total_f=$((total_f+1)); rc_all=1
  else
    name=${line%%:*}
    p=$(printf '%s' "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(printf '%s' "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    total_p=$((total_p+p)); total_f=$((total_f+f))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then total_f=$((total_f+1)); echo "run_all: '$cmd' exited $rc"; fi
    if printf '%s\n' "$out" | grep -qiE '^skip'; then skipped+=("$name")
    elif [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
      total_f=$((total_f+1)); echo "run_all: '$cmd' ran no checks and printed no skip line"
    fi
    [ $rc -ne 0 ] && rc_all=1
  fi
  echo "run_all: $secs s, cpu $cpu s  $cmd"
done
if [ ${#times[@]} -gt 0 ]; then
  sum=0; for t in "${times[@]}"; do sum=$((sum + ${t%%	*})); done
  echo "run_all: the slowest suites (${#times[@]} suites, $sum s in all, cpu $cpu_sum s):"
  printf '%s\n' "${times[@]}" | sort -t '	' -k1,1nr -s | head -n 5 | \
    while IFS='	' read -r s u c; do echo "run_all:   $s s, cpu $u s  $c"; done
fi
[ ${#skipped[@]} -eq 0 ] || echo "run_all: skipped something (see their skip lines): ${skipped[*]}"
echo "all tests: $total_p passed, $total_f failed"
[ $total_f -eq 0 ] && [ $rc_all -eq 0 ]
