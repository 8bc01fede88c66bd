#!/usr/bin/env bash
# tests/test_first_light.sh [BUILD]: tests/gpu/first_light.sh on a machine without a GPU, as
# CI is: it must still run, exit 3 ("nothing failed, something not run"), touch nothing but
# its report folder, and write a markdown and a JSON report that list every check as not
# run with the reason (no GPU). Both report locations: $OUT when set, else the argument.
# Also scripts/bench_gpu.py's no-GPU refusal and its --plan_only arithmetic.
# ~1 s. Where a GPU is present it skips: first_light.sh itself is the test there (~8 min).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_first_light
cd "$(dirname "$0")/.." || exit 2
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "skip: this machine has a GPU (run tests/gpu/first_light.sh itself)"; finish
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
checks="build fatbin test-gpu memcheck racecheck synccheck soak"
listing() { ls -a . build .deps 2>/dev/null | md5sum; }
before=$(listing)

# report_ok DIR RC: the exit status and both reports
report_ok() {
  local d=$1 rc=$2 c
  [ "$rc" = 3 ] && ok "exit 3 (nothing failed, checks not run)" || bad "exit $rc, want 3"
  [ -s "$d/first_light.md" ] && [ -s "$d/first_light.json" ] && [ -s "$d/first_light_logs.tar.gz" ] \
    && ok "first_light.md, first_light.json and the logs in $d" || { bad "reports missing in $d: $(ls "$d")"; return; }
  local listed=0
  for c in $checks; do
    grep -q "^- $c: no GPU: " "$d/first_light.md" && listed=$((listed + 1))
  done
  [ $listed = 7 ] && ok "markdown: all 7 checks under 'Not run, and why', each with the reason" \
    || bad "markdown lists $listed of 7 checks as not run for want of a GPU"
  local js
  js=$(python3 - "$d/first_light.json" "$checks" <<'EOF' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
want = sys.argv[2].split()
got = [(c["id"], c["status"], c["detail"]) for c in r["checks"]]
assert [g[0] for g in got] == want, "checks %s" % [g[0] for g in got]
bad = [g for g in got if g[1] != "not_run" or not g[2].startswith("no GPU: ")]
assert not bad, "not 'not_run' with a no-GPU reason: %s" % bad
assert r["summary"] == {"pass": 0, "fail": 0, "timeout": 0, "not_run": 7}, r["summary"]
print("ok")
EOF
)
  js=$(tail -1 <<<"$js")
  [ "$js" = ok ] && ok "JSON: parses, 7 checks, each not_run with the no-GPU reason" || bad "JSON: $js"
}

out=$(bash tests/gpu/first_light.sh "$tmp/arg" 2>&1); rc=$?
report_ok "$tmp/arg" $rc
grep -q "7 not run" <<<"$out" && ok "summary line: $(tail -1 <<<"$out")" || bad "summary line: $(tail -1 <<<"$out")"
out=$(OUT="$tmp/out" bash tests/gpu/first_light.sh "$tmp/ignored" 2>&1); rc=$?
report_ok "$tmp/out" $rc
[ ! -e "$tmp/ignored" ] && ok "\$OUT wins over the argument" || bad "wrote to the argument although \$OUT was set"
# scripts/bench_gpu.py (the GPU benchmark, unverified on GPU) without a GPU: one line naming
# the reason, exit 1, no JSON written (the listing below); --plan_only plans the 7B-width job
# for an H100 80GB without one (15 layers by its fit estimate; 3.298B parameters)
err=$(python3 scripts/bench_gpu.py 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [ "$(grep -c . <<<"$err")" = 1 ] && [[ "$err" == *"no usable GPU"* ]] \
  && ok "bench_gpu.py without a GPU: $err" || bad "bench_gpu.py without a GPU: rc $rc '$err'"
out=$(python3 scripts/bench_gpu.py --plan_only --jobs 7b --gpu_name "NVIDIA H100 80GB HBM3" --gpu_mem_gib 79.6 2>&1)
grep -q "job 7b: 15 layers .*3.298B parameters, batch 4 x 512" <<<"$out" \
  && ok "bench_gpu.py --plan_only: $(grep 'job 7b' <<<"$out" | cut -c1-90)" || bad "bench_gpu.py --plan_only: $out"
[ "$(listing)" = "$before" ] && ok "nothing created outside the report folder" \
  || bad "the repository changed (., build/ or .deps/)"
finish
