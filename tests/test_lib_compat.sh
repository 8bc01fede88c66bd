#!/usr/bin/env bash
# test_lib_compat.sh [BUILD]: GPU jobs with older or missing libraries, on the emulated device
# (build/tests/finetune_emu; its NCCL and cuDNN stand-ins report the versions that
# FT_EMU_NCCL_VERSION and FT_EMU_CUDNN_VERSION name) and on build/finetune itself.
#   1. NCCL 2.19 (older than 2.26, which orders concurrent communicators): FSDP over 2
#      emulated GPUs runs in the one-lane mode (src/comm_nccl.c): one warning line on rank 0,
#      one NCCL communicator instead of two (no reduce-scatter lane), no ordering hazard, and
#      bitwise the losses and gradient norms of the two-lane run under NCCL 2.28 (the same
#      arithmetic; only the streams differ); NCCL_LAUNCH_ORDER_IMPLICIT=0 under 2.28 does the
#      same; HSDP 2 x 2 under 2.19 likewise against its two-lane run (3 communicators, not 4)
#   2. in the one-lane mode every collective shares one stream: the fault builds of
#      tests/test_cuda_emu_hazards.sh (a gather and a reduce-scatter each missing one wait)
#      are still caught (exit 86), and the stream their reports name for ncclAllGather is the
#      one they name for ncclReduceScatter (two lanes: two streams, that test's check 3)
#   3. NCCL 2.17 (no ncclCommSplit of the kind finetune needs): refused in one line
#   4. cuDNN 9.15 (older than the 9.16 the attention graphs are written for): one warning
#      naming both versions, attention on the native kernels, and bitwise the losses of
#      --attention native
#   5. no libnccl.so.2 on the library path (FT_TEST_NCCL_SONAME, test-only, names a file that
#      does not exist) but a Python on PATH whose site-packages holds nvidia/nccl/lib/
#      libnccl.so.2 (a fake virtual environment; the machine's real libnccl.so.2 linked in
#      when there is one, else an empty stub): build/finetune over 2 ranks loads that file
#      and rank 0 says so in one line (real NCCL: then stops at the missing GPU), or names it
#      in its error (the stub has no ncclGetUniqueId)
#   6. NCCL's share of the SMs (--nccl_max_ctas, src/comm.h): every communicator of every
#      rank is created with the ncclConfig_t CTA bounds the emulated NCCL reports
#      (FT_EMU_NCCL_CONFIG): a table of cases: the default 16 (FSDP 2: world + lane; HSDP
#      2 x 2: world, shard, replica, lane), under NCCL 2.19 (the oldest finetune accepts,
#      one lane: the fields exist since 2.17, so it gets them too), --nccl_max_ctas 8, 0 (no
#      config: NCCL's defaults), NCCL_MAX_CTAS in the environment (NCCL's own override: said
#      once by rank 0, the config still passed), and 65 refused in one line
# Runtime: about 2 min on the 2-core development machine (fourteen emulated runs of 1-3
# steps, two of them 4 ranks).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_lib_compat
emu=$build/tests/finetune_emu
missing=""
for b in finetune_emu finetune_emu_fault_prefetch finetune_emu_fault_rs; do
  [ -x "$build/tests/$b" ] || missing="$missing $b"
done
command -v mpiexec >/dev/null || missing="$missing mpiexec"
if [ -n "$missing" ]; then skip_or_fail "not built or missing:$missing (needs the CUDA headers, CUDA=1, and MPICH)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export FT_EMU_SEED=1 FT_EMU_NCCL_CONFIG=1
flags=(--device cuda --batch_size_per_device 1 --total_batch_size 4 --seq_len 64 --max_steps 3 --max_eval_docs 1
       --warmup_fraction 0 --learning_rate 5e-3)
run() {  # run NAME RANKS BINARY [FLAGS...]: sets rc; NAME.log holds stdout and stderr, NAME.err stderr
  local name=$1 n=$2 b=$3; shift 3
  timeout 600 mpiexec -n "$n" "$build/tests/$b" "${flags[@]}" "$@" --out_dir "$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err"
  rc=$?
  cat "$tmp/$name.out" "$tmp/$name.err" > "$tmp/$name.log"
}
comms() { grep -oE '[0-9]+ NCCL communicator\(s\) took' "$tmp/$1.log" | grep -oE '^[0-9]+'; }
warned() { grep -c 'warning: NCCL .*collectives of all NCCL communicators run one at a time on one stream' "$tmp/$1.err"; }
same_run() {  # same_run A B: bitwise the same losses and gradient norms
  [ -n "$(metric "$tmp/$1" loss)" ] && [ "$(metric "$tmp/$1" loss)" = "$(metric "$tmp/$2" loss)" ] \
    && [ "$(metric "$tmp/$1" grad_norm)" = "$(metric "$tmp/$2" grad_norm)" ]
}

# ---------------------------------------------------------------- 1. one lane
run fsdp_new 2 finetune_emu
[ $rc -eq 0 ] && [ "$(comms fsdp_new)" = 2 ] && [ "$(warned fsdp_new)" = 0 ] \
  && ok "NCCL 2.28, FSDP 2: two lanes (2 communicators), no warning" \
  || bad "NCCL 2.28 FSDP 2: rc $rc, communicators '$(comms fsdp_new)', $(grep -m1 'error\|HAZARD\|warning' "$tmp/fsdp_new.log")"
FT_EMU_NCCL_VERSION=21903 run fsdp_old 2 finetune_emu
if [ $rc -eq 0 ] && [ "$(warned fsdp_old)" = 1 ] && [ "$(comms fsdp_old)" = 1 ] && ! grep -q HAZARD "$tmp/fsdp_old.log"; then
  ok "NCCL 2.19, FSDP 2: one lane (1 communicator), one warning: $(grep -m1 -o 'warning: NCCL 2.19.3[^:]*' "$tmp/fsdp_old.err")"
else bad "NCCL 2.19 FSDP 2: rc $rc, warnings $(warned fsdp_old), communicators '$(comms fsdp_old)', $(grep -m1 'error\|HAZARD' "$tmp/fsdp_old.log")"; fi
same_run fsdp_old fsdp_new && ok "NCCL 2.19, FSDP 2: the 3 losses and gradient norms of the two-lane run, bitwise" \
  || bad "NCCL 2.19 FSDP 2 differs: $(metric "$tmp/fsdp_old" loss | tr '\n' ' ') vs $(metric "$tmp/fsdp_new" loss | tr '\n' ' ')"
NCCL_LAUNCH_ORDER_IMPLICIT=0 run fsdp_order0 2 finetune_emu
[ $rc -eq 0 ] && [ "$(warned fsdp_order0)" = 1 ] && grep -q 'with NCCL_LAUNCH_ORDER_IMPLICIT=0' "$tmp/fsdp_order0.err" \
  && [ "$(comms fsdp_order0)" = 1 ] && same_run fsdp_order0 fsdp_new \
  && ok "NCCL_LAUNCH_ORDER_IMPLICIT=0 under 2.28: one lane, one warning naming the variable, the same losses" \
  || bad "NCCL_LAUNCH_ORDER_IMPLICIT=0: rc $rc, $(grep -m1 'error\|warning' "$tmp/fsdp_order0.log")"
# another NCCL on one node: rank 1 alone has 2.19, rank 0 2.28; both must run one lane (two
# lanes on rank 0 would wait forever in a reduce-scatter lane split rank 1 never makes)
timeout 600 mpiexec -n 1 "$build/tests/finetune_emu" "${flags[@]}" --out_dir "$tmp/fsdp_mixed" : \
  -n 1 env FT_EMU_NCCL_VERSION=21903 "$build/tests/finetune_emu" "${flags[@]}" --out_dir "$tmp/fsdp_mixed" \
  >"$tmp/fsdp_mixed.out" 2>"$tmp/fsdp_mixed.err"; rc=$?
cat "$tmp/fsdp_mixed.out" "$tmp/fsdp_mixed.err" > "$tmp/fsdp_mixed.log"
[ $rc -eq 0 ] && [ "$(warned fsdp_mixed)" = 1 ] && grep -q "another rank's NCCL is older than 2.26 .*(1 of 2 ranks)" "$tmp/fsdp_mixed.err" \
  && [ "$(comms fsdp_mixed)" = 1 ] && same_run fsdp_mixed fsdp_new \
  && ok "NCCL 2.28 on rank 0, 2.19 on rank 1: both one lane, one warning (1 of 2 ranks), the same losses" \
  || bad "mixed NCCL: rc $rc, communicators '$(comms fsdp_mixed)', $(grep -m1 'error\|warning' "$tmp/fsdp_mixed.log")"
run hsdp_new 4 finetune_emu --dp_shard 2 --max_steps 2
FT_EMU_NCCL_VERSION=21903 run hsdp_old 4 finetune_emu --dp_shard 2 --max_steps 2
[ $rc -eq 0 ] && [ "$(warned hsdp_old)" = 1 ] && [ "$(comms hsdp_new)" = 4 ] && [ "$(comms hsdp_old)" = 3 ] \
  && ! grep -q HAZARD "$tmp/hsdp_old.log" && same_run hsdp_old hsdp_new \
  && ok "NCCL 2.19, HSDP 2 x 2: one lane (3 communicators, 4 with two lanes), one warning, the same losses bitwise" \
  || bad "NCCL 2.19 HSDP: rc $rc, warnings $(warned hsdp_old), communicators '$(comms hsdp_old)'/'$(comms hsdp_new)', $(grep -m1 'error\|HAZARD' "$tmp/hsdp_old.log")"

# ---------------------------------------------------------------- 2. one stream, faults caught
flags=(--device cuda --batch_size_per_device 1 --total_batch_size 2 --seq_len 64 --max_steps 1 --max_eval_docs 1
       --warmup_fraction 0)
FT_EMU_NCCL_VERSION=21903 run prefetch 2 finetune_emu_fault_prefetch
ag=$(grep -m1 -oE 'last written by ncclAllGather \([^)]*\) on stream [0-9]+' "$tmp/prefetch.log" | grep -oE '[0-9]+$')
[ $rc -eq 86 ] && [ -n "$ag" ] && ok "one lane, gather without its wait: caught (exit 86)" \
  || bad "one lane, prefetch fault: rc $rc, $(grep -m1 'HAZARD\|error' "$tmp/prefetch.log")"
FT_EMU_NCCL_VERSION=21903 run rs 2 finetune_emu_fault_rs
rs=$(grep -m1 -oE 'HAZARD read-after-write: ncclReduceScatter \([^)]*\) on stream [0-9]+' "$tmp/rs.log" | grep -oE '[0-9]+$')
[ $rc -eq 86 ] && [ -n "$rs" ] && ok "one lane, reduce-scatter without its wait: caught (exit 86)" \
  || bad "one lane, reduce-scatter fault: rc $rc, $(grep -m1 'HAZARD\|error' "$tmp/rs.log")"
[ -n "$ag" ] && [ "$ag" = "$rs" ] && ok "one lane: all-gathers and reduce-scatters on one stream ($ag)" \
  || bad "one lane: all-gather stream '$ag', reduce-scatter stream '$rs'"

# ---------------------------------------------------------------- 3. NCCL 2.17
err=$(FT_EMU_NCCL_VERSION=21703 timeout 120 mpiexec -n 2 "$emu" "${flags[@]}" --out_dir "$tmp/old17" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && [ "$(grep -c . <<<"$err")" = 1 ] && grep -q "GPU ranks need NCCL 2.18 or newer: the linked NCCL is 2.17.3" <<<"$err" \
  && [ ! -e "$tmp/old17" ] && ok "NCCL 2.17: refused in one line: $err" || bad "NCCL 2.17: rc $rc, '$err'"

# ---------------------------------------------------------------- 4. cuDNN 9.15
flags=(--device cuda --batch_size_per_device 2 --total_batch_size 2 --seq_len 64 --max_steps 2 --max_eval_docs 1
       --warmup_fraction 0 --learning_rate 5e-3)
"$emu" "${flags[@]}" --attention native --out_dir "$tmp/native" > "$tmp/native.log" 2>&1
FT_EMU_CUDNN_VERSION=91500 "$emu" "${flags[@]}" --out_dir "$tmp/cudnn915" > "$tmp/cudnn915.out" 2> "$tmp/cudnn915.err"; rc=$?
w=$(grep -c 'warning' "$tmp/cudnn915.err")
line=$(grep -m1 'libcudnn 9.15.0 at run time, its graphs here need 9.16 or newer; using the native attention kernels' "$tmp/cudnn915.err")
[ $rc -eq 0 ] && [ "$w" = 1 ] && [ -n "$line" ] && grep -q 'attention native' "$tmp/cudnn915.out" \
  && ok "cuDNN 9.15: one warning, native attention: ${line#finetune: }" \
  || bad "cuDNN 9.15: rc $rc, $w warning(s): $(head -2 "$tmp/cudnn915.err")"
same_run cudnn915 native && ok "cuDNN 9.15: bitwise the losses of --attention native" \
  || bad "cuDNN 9.15 vs native: $(metric "$tmp/cudnn915" loss | tr '\n' ' ') vs $(metric "$tmp/native" loss | tr '\n' ' ')"
out=$(FT_EMU_CUDNN_VERSION=91600 "$emu" "${flags[@]}" --max_steps 1 --out_dir "$tmp/cudnn916" 2>&1)
grep -q 'attention cudnn' <<<"$out" && ! grep -q warning <<<"$out" && ok "cuDNN 9.16: cuDNN attention, no warning" \
  || bad "cuDNN 9.16: $(grep -m1 'warning\|attention' <<<"$out")"

# ---------------------------------------------------------------- 5. NCCL from a wheel
flags=(--device cuda --batch_size_per_device 1 --total_batch_size 2 --seq_len 64 --max_steps 1 --max_eval_docs 1)
venv=$tmp/venv; sp=$venv/lib/python3.11/site-packages/nvidia/nccl/lib
mkdir -p "$venv/bin" "$sp"
printf '#!/bin/sh\nexit 0\n' > "$venv/bin/python3"; chmod +x "$venv/bin/python3"
real=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 .*x86-64/ { print $NF; exit }')
if [ -n "$real" ] && [ -r "$real" ]; then ln -s "$(readlink -f "$real")" "$sp/libnccl.so.2"
else cc -shared -o "$sp/libnccl.so.2" -x c /dev/null; fi
err=$(FT_TEST_NCCL_SONAME=libnccl_absent_here.so.2 PATH="$venv/bin:$PATH" timeout 120 mpiexec -n 2 "$bin" "${flags[@]}" \
      --out_dir "$tmp/wheel" 2>&1 >/dev/null); rc=$?
if [ -n "$real" ]; then
  n=$(grep -F "no libnccl.so.2 on the library path: loaded NCCL" <<<"$err" | grep -F "site-packages/nvidia/nccl/lib/libnccl.so.2)" \
      | grep -cF "from the nvidia-nccl wheel of $venv/bin/python3")
  [ "$n" = 1 ] && ok "NCCL from a wheel: rank 0 names the file once: $(grep -m1 'no libnccl' <<<"$err")" \
    || bad "NCCL from a wheel: rc $rc, '$err'"
else
  grep "GPU ranks need NCCL 2.18 or newer: $venv/" <<<"$err" | grep -q "site-packages/nvidia/nccl/lib/libnccl.so.2 has no ncclGetUniqueId" \
    && ok "NCCL from a wheel (an empty stub here): the error names the wheel's file" || bad "NCCL stub wheel: rc $rc, '$err'"
fi
err=$(FT_TEST_NCCL_SONAME=libnccl_absent_here.so.2 PATH=/usr/bin:/bin HOME=$tmp/nohome timeout 120 mpiexec -n 2 "$bin" \
      "${flags[@]}" --out_dir "$tmp/nowheel" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && [ "$(grep -c . <<<"$err")" = 1 ] && grep -q "no Python on PATH has the nvidia-nccl-cu12/cu13 wheel" <<<"$err" \
  && ok "no NCCL anywhere: one line: $err" || bad "no NCCL anywhere: rc $rc, '$err'"

# ---------------------------------------------------------------- 6. the CTA bound
flags=(--device cuda --batch_size_per_device 1 --total_batch_size 2 --seq_len 64 --max_steps 1 --max_eval_docs 1
       --warmup_fraction 0)
run ctas8 2 finetune_emu --nccl_max_ctas 8
run ctas0 2 finetune_emu --nccl_max_ctas 0
NCCL_MAX_CTAS=4 run ctas_env 2 finetune_emu
# ctas_case NAME RUN MIN MAX LINES BOOT: RUN's communicators (LINES lines over its ranks) all
# report minCTAs MIN and maxCTAs MAX, and rank 0's bootstrap line says BOOT
ctas_case() {
  local name=$1 r=$2 lo=$3 hi=$4 n=$5 boot=$6 all want
  all=$(grep -cE '^cuda_emu: NCCL communicator (init|split) \(rank [0-9]+ of [0-9]+\): ' "$tmp/$r.err")
  want=$(grep -cE "^cuda_emu: NCCL communicator (init|split) \(rank [0-9]+ of [0-9]+\): minCTAs $lo, maxCTAs $hi\$" "$tmp/$r.err")
  [ -s "$tmp/$r/metrics.jsonl" ] && [ "$all" = "$n" ] && [ "$want" = "$n" ] && grep -q "NCCL communicator(s) took .*, $boot\$" "$tmp/$r.out" \
    && ok "CTA bound, $name: $n communicator(s), each minCTAs $lo, maxCTAs $hi; bootstrap line: $boot" \
    || bad "CTA bound, $name: $want of $all communicator lines (want $n) with minCTAs $lo, maxCTAs $hi; $(grep -m1 'error\|CTAs per' "$tmp/$r.log")"
}
ctas_case "default, FSDP 2" fsdp_new 1 16 4 "at most 16 CTAs per collective"
ctas_case "default, HSDP 2 x 2" hsdp_new 1 16 16 "at most 16 CTAs per collective"
ctas_case "NCCL 2.19 (one lane)" fsdp_old 1 16 2 "at most 16 CTAs per collective"
ctas_case "--nccl_max_ctas 8" ctas8 1 8 4 "at most 8 CTAs per collective"
ctas_case "--nccl_max_ctas 0 (no config)" ctas0 default default 4 "CTAs per collective as NCCL chooses"
ctas_case "NCCL_MAX_CTAS=4 in the environment" ctas_env 1 16 4 "at most 16 CTAs per collective"
n=$(grep -c "NCCL_MAX_CTAS=4 in the environment: NCCL takes it over --nccl_max_ctas 16" "$tmp/ctas_env.err")
[ "$n" = 1 ] && ok "NCCL_MAX_CTAS in the environment: said once" || bad "NCCL_MAX_CTAS in the environment: said $n times"
err=$("$emu" --device cuda --nccl_max_ctas 65 --max_steps 1 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && [ "$(grep -c . <<<"$err")" = 1 ] && grep -q -- "--nccl_max_ctas" <<<"$err" \
  && ok "--nccl_max_ctas 65: refused in one line: $err" || bad "--nccl_max_ctas 65: rc $rc, '$err'"
finish
