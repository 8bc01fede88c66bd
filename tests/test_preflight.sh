#!/usr/bin/env bash
# test_preflight.sh BUILD_DIR: the preflight (src/preflight.h, --preflight; docs/cluster.md,
# "Preflight") on CPU ranks over MPI and on emulated GPUs (build/tests/finetune_emu, NCCL
# emulated over MPI). The figures are not speeds here (2 shared cores): what is checked is
# that every line is there and well formed, that the bandwidths follow nccl-tests' formulas
# from the printed sizes and times, that the per-step bytes are the planner's (--dry_run),
# the exit status (0: nothing stands out; 3: a rank stands out), and that an odd rank is
# named in one line and no other is:
#   1. one process; CPU ranks: FSDP 2 (busbw = algbw / 2), HSDP 4 = 2 x 2 (the replica
#      all-reduce: busbw = algbw x 2(n-1)/n = algbw), the per-step line against --dry_run;
#      a multi-rank CPU training job runs no preflight unless asked
#   2. FT_TEST_PREFLIGHT_SLOW_RANK=1 (test-only: rank 1's own part sleeps 20 ms) and
#      FT_TEST_PREFLIGHT_FAKE_VERSION=2 (test-only: rank 2 reports another finetune build):
#      exit 3, that rank named, no other
#   3. emulated GPUs: --preflight over 2 ranks (the CUDA, cuDNN, cuBLASLt and NCCL rows, a PCI
#      bus id per rank); rank 1 loading another NCCL (FT_EMU_NCCL_VERSION, set for that rank
#      alone with mpiexec's per-executable -env) is named; a 2-rank training job runs the
#      preflight before step 1 on its own and trains on
# Without MPI it skips (fails when CI=true). About 30 s on 2 cores.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_preflight
if ! have_mpi; then skip_or_fail "no mpiexec, or $bin built without MPI (install mpich libmpich-dev; make MPI=1)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
common=(--seq_len 64 --total_batch_size 8 --batch_size_per_device 1)
mpirun_() { local n="$1"; shift; timeout 300 mpiexec -n "$n" "$@"; }

# num LOG OP FIELD: the number before FIELD ("ms", "algbw", "busbw") on LOG's line of OP
num() {
  local line; line=$(grep -m1 "^preflight: $2 " "$1")
  case $3 in
    ms) sed -nE 's/.*median ([0-9.]+) ms of.*/\1/p' <<<"$line" ;;
    MB) sed -nE 's/.* ([0-9.]+) MB \(.*/\1/p' <<<"$line" ;;
    *) sed -nE "s/.*$3 ([0-9.]+) GB\/s.*/\1/p" <<<"$line" ;;
  esac
}
# bw_ok LOG OP FACTOR: algbw = MB / ms (to the printed digits) and busbw = algbw x FACTOR
bw_ok() {
  local mb ms alg bus
  mb=$(num "$1" "$2" MB); ms=$(num "$1" "$2" ms); alg=$(num "$1" "$2" algbw); bus=$(num "$1" "$2" busbw)
  awk -v mb="$mb" -v ms="$ms" -v a="$alg" -v b="$bus" -v f="$3" 'BEGIN {
    if (mb == "" || ms <= 0 || a <= 0) exit 1
    want = mb / ms   # MB per ms = GB/s
    # preflight.c prints MB and GB/s to 2 decimals, ms to 3: each printed figure is within half
    # its last digit of the true one, so MB/ms is off by at most want x (0.005/mb + 0.0005/ms)
    # (first order), a by 0.005 more; busbw = algbw x f exactly before rounding, so the printed
    # b and a x f differ by at most 0.005 + 0.005 f. 1e-9 absorbs the decimal parsing.
    da = want * (0.005 / mb + 0.0005 / ms) * 1.01 + 0.005 + 1e-9
    db = 0.005 + 0.005 * f + 1e-9
    exit !((a - want) ^ 2 <= da ^ 2 && (b - a * f) ^ 2 <= db ^ 2) }'
}
# lines_ok LOG NAME: the table, the timings, the step line and the verdict are all there
lines_ok() {
  local l="$1" miss=""
  for pat in "^preflight: [0-9]+ rank\(s\) on [0-9]+ host\(s\); shared by every rank:" "^preflight:   finetune " \
             "^preflight:   device " "^preflight: local copy +one decoder layer on each rank's device: fastest of 20, median over ranks [0-9.]+ ms" \
             "^preflight: nothing stands out$"; do
    grep -qE "$pat" "$l" || miss="$miss [$pat]"
  done
  [ -z "$miss" ] && ok "$2: the table, the local copy and the verdict lines" || bad "$2: missing$miss: $(head -c 1500 "$l")"
}

# ---------------------------------------------------------------- 1. CPU ranks
"$bin" --preflight "${common[@]}" > "$tmp/one.log" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^preflight: one rank: no collective to time$" "$tmp/one.log" && grep -q "^preflight:   host " "$tmp/one.log" \
  && ! grep -qE "^(step|eval) " "$tmp/one.log" && ok "one process: the table, no collective, exit 0, no training" \
  || bad "one process: rc $rc: $(cat "$tmp/one.log")"
lines_ok "$tmp/one.log" "one process"

mpirun_ 2 "$bin" --preflight "${common[@]}" > "$tmp/fsdp2.log" 2>&1; rc=$?
[ $rc = 0 ] && ok "FSDP 2 --preflight: exit 0" || bad "FSDP 2 --preflight: rc $rc: $(tail -3 "$tmp/fsdp2.log")"
lines_ok "$tmp/fsdp2.log" "FSDP 2"
grep -qE "^preflight:   mpi +.+, /" "$tmp/fsdp2.log" && grep -qE "^preflight:   device +cpu: " "$tmp/fsdp2.log" \
  && ok "FSDP 2: the MPI library and its file, the CPU" || bad "FSDP 2: mpi/device rows: $(grep -E 'mpi|device' "$tmp/fsdp2.log")"
grep -q "^preflight: 2 rank(s) on 1 host(s)" "$tmp/fsdp2.log" && ! grep -q "per rank:" "$tmp/fsdp2.log" \
  && ok "FSDP 2: one host, every value shared: no per-rank rows" || bad "FSDP 2 header: $(grep -m3 preflight: "$tmp/fsdp2.log")"
for op in all-gather reduce-scatter; do
  grep -qE "^preflight: $op +shard group of 2 ranks, one decoder layer [0-9.]+ MB \(F32\): median [0-9.]+ ms of 20 \(5 warm-up\), algbw [0-9.]+ GB/s, busbw [0-9.]+ GB/s$" "$tmp/fsdp2.log" \
    && bw_ok "$tmp/fsdp2.log" "$op" 0.5 && ok "FSDP 2: $op line; algbw = size / time, busbw = algbw x 1/2" \
    || bad "FSDP 2: $op: $(grep "preflight: $op" "$tmp/fsdp2.log")"
done
# one decoder layer of the bundled model: 184,576 fp32 elements (tests/test_dist.sh, section 2)
[ "$(num "$tmp/fsdp2.log" all-gather MB)" = "0.74" ] && ok "FSDP 2: the unit is one decoder layer, 0.74 MB in fp32" \
  || bad "FSDP 2: unit size $(num "$tmp/fsdp2.log" all-gather MB) MB"
grep -qE "^preflight: all-reduce +skipped: no replica group" "$tmp/fsdp2.log" && ok "FSDP 2: the all-reduce skipped with a note" \
  || bad "FSDP 2: all-reduce line: $(grep 'all-reduce' "$tmp/fsdp2.log")"
# the per-step bytes are the planner's (--dry_run's table of bytes sent per rank)
plan_mb() { "$bin" --dry_run --world_size "$1" "${common[@]}" "${@:3}" | awk -v k="$2" '$1 == k { printf "%.1f", $2 / 1e6 }'; }
step_mb() { sed -nE "s/.* $2 ([0-9.]+) MB [0-9.]+ ms,.*/\1/p" "$1"; }
ag=$(plan_mb 2 all_gather); rs=$(plan_mb 2 reduce_scatter)
[ -n "$ag" ] && [ "$(step_mb "$tmp/fsdp2.log" all-gather)" = "$ag" ] && [ "$(step_mb "$tmp/fsdp2.log" reduce-scatter)" = "$rs" ] \
  && grep -qE "^preflight: per optimizer step of this job .* [0-9.]+ ms of communication$" "$tmp/fsdp2.log" \
  && ok "FSDP 2: per step all-gather $ag MB, reduce-scatter $rs MB: the plan's bytes" \
  || bad "FSDP 2: step line '$(grep 'per optimizer step' "$tmp/fsdp2.log")' vs plan ag $ag rs $rs"

mpirun_ 4 "$bin" --preflight "${common[@]}" --dp_shard 2 > "$tmp/hsdp4.log" 2>&1; rc=$?
[ $rc = 0 ] && ok "HSDP 4 --preflight: exit 0" || bad "HSDP 4 --preflight: rc $rc: $(tail -3 "$tmp/hsdp4.log")"
lines_ok "$tmp/hsdp4.log" "HSDP 4"
grep -qE "^preflight: all-reduce +replica group of 2 ranks, one unit's slice [0-9.]+ MB \(fp32\): median" "$tmp/hsdp4.log" \
  && bw_ok "$tmp/hsdp4.log" all-reduce 1 && bw_ok "$tmp/hsdp4.log" all-gather 0.5 \
  && ok "HSDP 4: the replica all-reduce of one slice, busbw = algbw x 2(n-1)/n" \
  || bad "HSDP 4: $(grep -E 'all-reduce|all-gather' "$tmp/hsdp4.log")"
ar=$(plan_mb 4 all_reduce --dp_shard 2)
[ -n "$ar" ] && [ "$(step_mb "$tmp/hsdp4.log" all-reduce)" = "$ar" ] && ok "HSDP 4: per step all-reduce $ar MB, the plan's" \
  || bad "HSDP 4: all-reduce per step '$(step_mb "$tmp/hsdp4.log" all-reduce)' vs plan '$ar'"

mpirun_ 2 "$bin" "${common[@]}" --max_steps 1 --max_eval_docs 4 --out_dir "$tmp/train2" > "$tmp/train2.log" 2>&1; rc=$?
[ $rc = 0 ] && ! grep -q "preflight:" "$tmp/train2.log" && ok "CPU ranks training without --preflight: no preflight" \
  || bad "CPU training: rc $rc, $(grep -c preflight: "$tmp/train2.log") preflight lines"

# ---------------------------------------------------------------- 2. a rank that stands out
# named NAME LOG RC RANK WHAT: exit 3, one stand-out line, naming RANK with WHAT
named() {
  local n; n=$(grep -c "stands out:" "$2")
  [ "$3" = 3 ] && [ "$n" = 1 ] && grep -qE "^preflight: rank $4 \(host [^)]+\) stands out: .*$5" "$2" \
    && grep -q "^preflight: 1 of [0-9]* rank(s) stand out" "$2" \
    && ok "$1: exit 3, rank $4 named once: $(grep -o 'stands out: .*' "$2" | head -c 160)" \
    || bad "$1: rc $3, $n stand-out line(s): $(grep -E 'stand|error' "$2")"
}
FT_TEST_PREFLIGHT_SLOW_RANK=1 mpirun_ 2 "$bin" --preflight "${common[@]}" > "$tmp/slow.log" 2>&1
named "a slow rank of 2" "$tmp/slow.log" $? 1 "its own part \(a local copy of one decoder layer\) took [0-9.]+ ms at best"
FT_TEST_PREFLIGHT_FAKE_VERSION=2 mpirun_ 4 "$bin" --preflight "${common[@]}" > "$tmp/fake.log" 2>&1
named "another build on rank 2 of 4" "$tmp/fake.log" $? 2 "finetune '.*-fake' \(rank 0 and most others: "
[ "$(grep -cE '^preflight:   rank [0-3]: finetune ' "$tmp/fake.log")" = 4 ] && ok "another build: listed per rank (4 rows)" \
  || bad "another build: per-rank rows: $(grep 'rank [0-9]:' "$tmp/fake.log")"

# ---------------------------------------------------------------- 3. emulated GPUs
emu=$build/tests/finetune_emu
if [ ! -x "$emu" ]; then skip_or_fail "$emu not built (needs the CUDA toolkit's headers: make CUDA=1)"; finish; fi
export FT_EMU_DEVICES=2 FT_EMU_SEED=1
gflags=(--device cuda "${common[@]}")
mpirun_ 2 "$emu" --preflight "${gflags[@]}" > "$tmp/gpu2.log" 2>&1; rc=$?
[ $rc = 0 ] && ok "emulated GPUs, FSDP 2 --preflight: exit 0" || bad "emulated GPUs: rc $rc: $(grep -m3 -E 'error|HAZARD' "$tmp/gpu2.log")"
lines_ok "$tmp/gpu2.log" "emulated GPUs"
miss=""
for pat in "^preflight:   device +CPU emulation \(tests/cuda_emu\), [0-9.]+ GiB, sm_80$" "^preflight:   driver +CUDA 12\.4, " \
           "^preflight:   cuda runtime +12\.4, .*finetune_emu$" "^preflight:   cudnn +9\.19\.0, .*finetune_emu$" \
           "^preflight:   cublaslt +12\.4\.5, .*finetune_emu$" "^preflight:   nccl +2\.28\.9, .*finetune_emu$" "^preflight:   rank 0: pci bus 0000:10:00\.0$" \
           "^preflight:   rank 1: pci bus 0000:11:00\.0$" \
           "^preflight: all-gather +shard group of 2 ranks, one decoder layer 0\.37 MB \(BF16\)"; do
  grep -qE "$pat" "$tmp/gpu2.log" || miss="$miss [$pat]"
done
[ -z "$miss" ] && ok "emulated GPUs: device, driver, runtime, cuDNN, cuBLASLt and NCCL rows; a PCI bus per rank; bf16 unit" \
  || bad "emulated GPUs: missing$miss: $(grep preflight: "$tmp/gpu2.log")"
bw_ok "$tmp/gpu2.log" reduce-scatter 0.5 && ok "emulated GPUs: reduce-scatter busbw = algbw / 2" \
  || bad "emulated GPUs: $(grep 'reduce-scatter' "$tmp/gpu2.log")"

# another NCCL on rank 1 alone (mpiexec's per-executable environment)
timeout 300 mpiexec -n 1 "$emu" --preflight "${gflags[@]}" : -n 1 -env FT_EMU_NCCL_VERSION 22703 "$emu" --preflight "${gflags[@]}" \
  > "$tmp/nccl.log" 2>&1
named "another NCCL on rank 1" "$tmp/nccl.log" $? 1 "nccl '2\.27\.3, "

# a multi-rank GPU job runs it before step 1 unasked, then trains
mpirun_ 2 "$emu" "${gflags[@]}" --max_steps 1 --max_eval_docs 4 --out_dir "$tmp/gtrain" > "$tmp/gtrain.log" 2>&1; rc=$?
first_step=$(grep -n -m1 -E '^step +1/' "$tmp/gtrain.log" | cut -d: -f1); verdict=$(grep -n -m1 '^preflight: nothing stands out' "$tmp/gtrain.log" | cut -d: -f1)
[ $rc = 0 ] && [ -n "$verdict" ] && [ -n "$first_step" ] && [ "$verdict" -lt "$first_step" ] && [ -f "$tmp/gtrain/metrics.jsonl" ] \
  && ok "a 2-rank GPU training job: the preflight (line $verdict) before step 1 (line $first_step), then training" \
  || bad "GPU training: rc $rc, verdict line '$verdict', step line '$first_step': $(grep -m3 -E 'error|HAZARD' "$tmp/gtrain.log")"
finish
