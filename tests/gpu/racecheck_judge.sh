#!/usr/bin/env bash
# tests/gpu/racecheck_judge.sh LOG: are all the hazards in a compute-sanitizer racecheck log
# inside library kernels? Exit 0 printing their kernels' names when every hazard it reports
# names a kernel that is not one of ours (the __global__ functions of kernels/*.cu) and the
# program completed; exit 1 when a hazard is in one of ours, the program failed, or the log
# names no kernel. tests/gpu/first_light.sh turns such a racecheck failure into a pass.
#
# Why: racecheck instruments every kernel, the libraries' too. On the first H200 run
# (2026-11-26) it reported 2 hazards, both inside cuBLASLt's own nvjet_sm90 GEMM kernel (TMA
# and wgmma: asynchronous shared-memory traffic) and none in ours: library code, which says
# nothing about our kernels. Instrumenting ours alone (--kernel-name kns=_kernel) made the
# sanitizer fail "to handle a hardware exception" in rope_qkv_fwd on that machine, where the
# unfiltered racecheck and memcheck ran clean, so the filter is not used.
# tests/test_first_light.sh checks this script on made-up logs.
set -u
log=${1:?usage: racecheck_judge.sh LOG}
cd "$(dirname "$0")/../.." || exit 2
grep -q "Target application returned an error" "$log" && exit 1
ours=$(grep -ho '[A-Za-z_0-9]*_kernel(' kernels/*.cu | tr -d '(' | sort -u | paste -sd'|')
[ -n "$ours" ] || exit 1
# "Race reported between Read access at NAME+0x..": NAME demangled (NAME(args)) or mangled (_Z..)
names=$(grep -oE 'access at [A-Za-z_0-9:<>]+' "$log" | sed 's/^access at //' | sort -u)
[ -n "$names" ] || exit 1
grep -qE "^($ours)([^A-Za-z_0-9]|$)|^_Z[0-9]+($ours)" <<<"$names" && exit 1   # (mangled: _Z<length><name><args>)
paste -sd' ' <<<"$names"
