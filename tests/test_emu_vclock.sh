#!/usr/bin/env bash
# The emulator's virtual clock (FT_EMU_VCLOCK=<device>; tests/cuda_emu/README.md, "Virtual
# clock"): every kernel, GEMM, copy and collective advances its stream's virtual time by its
# price on that device (src/plan_price.c, the estimate's rates); events, stream waits and host
# syncs carry the times; the trainer's step timer reads the host's virtual time.
#   1. build/tests/test_emu_vclock: small programs with hand-derived answers (two kernels on
#      one stream add, on two streams overlap, an event wait serialises, a launch after a host
#      sync starts after it, a GEMM costs its FLOPs at the GEMM rate; on 2 ranks an all-gather
#      that one rank joins late ends at that late start + its price on both ranks, within a
#      node and across nodes: FT_EMU_VCLOCK_GPUS_PER_NODE=1); again with another host issue
#      cost (FT_EMU_VCLOCK_ISSUE_US=3); unset, the clock answers -1
#   2. the bundled model on the emulated device, 1 rank and FSDP over 2: with the clock on the
#      losses are bitwise those of the run without it (the clock changes no data), and the
#      per-step virtual times ("ms" in metrics.jsonl) are positive and equal under two
#      FT_EMU_SEED values (other random stream delays: the virtual times do not depend on the
#      real timing); HSDP 2 x 2 (split communicators) the same under two seeds
# Runtime: 90 s wall, 30 s of CPU on the 2-core development machine (2026-11-28; the GEMM
# case alone is a few s).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_emu_vclock
prog=$build/tests/test_emu_vclock
emu=$build/tests/finetune_emu
if [ ! -x "$prog" ] || [ ! -x "$emu" ]; then skip_or_fail "$prog or $emu not built (make CUDA=1 MPI=1)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# 1. the rules (the A100's prices: the test kernel's bytes then cost more than an issue)
FT_EMU_VCLOCK=a100 "$prog" >"$tmp/one.log" 2>&1 && ok "one process: $(tail -1 "$tmp/one.log")" \
  || bad "one process: $(grep -m3 FAIL "$tmp/one.log" | tr '\n' ' ')$(tail -1 "$tmp/one.log")"
FT_EMU_VCLOCK=a100 FT_EMU_VCLOCK_ISSUE_US=3 "$prog" >"$tmp/issue3.log" 2>&1 \
  && ok "one process, 3 us per issued operation: $(tail -1 "$tmp/issue3.log")" || bad "issue cost 3 us: $(grep -m3 FAIL "$tmp/issue3.log" | tr '\n' ' ')"
"$prog" off >"$tmp/off.log" 2>&1 && ok "clock off: $(tail -1 "$tmp/off.log")" || bad "clock off: $(grep -m2 FAIL "$tmp/off.log")"
if command -v mpiexec >/dev/null; then
  for g in 8 1; do
    if FT_EMU_VCLOCK=a100 FT_EMU_VCLOCK_GPUS_PER_NODE=$g timeout 120 mpiexec -n 2 "$prog" >"$tmp/two$g.log" 2>&1; then
      ok "2 ranks, $g GPUs per node: $(grep -m1 'passed' "$tmp/two$g.log")"
    else bad "2 ranks, $g GPUs per node: $(grep -m3 FAIL "$tmp/two$g.log" | tr '\n' ' ')$(tail -1 "$tmp/two$g.log")"; fi
  done
else skip_or_fail "the 2-rank collective case (needs mpiexec)"; fi

# 2. training: the clock changes no result, and its step times are deterministic
flags=(--device cuda --batch_size_per_device 2 --total_batch_size 4 --seq_len 64 --max_steps 2 --learning_rate 5e-3
       --max_eval_docs 2 --warmup_fraction 0 --collective_timeout 0)
run() {  # run NAME RANKS SEED VCLOCK: the trainer's log in $tmp/NAME.log, metrics in $tmp/NAME/
  local name=$1 n=$2 seed=$3 vc=$4 launch=()
  [ "$n" -gt 1 ] && launch=(timeout 300 mpiexec -n "$n")
  FT_EMU_SEED=$seed FT_EMU_VCLOCK=$vc "${launch[@]}" "$emu" "${flags[@]}" --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1 \
    || { bad "$name: the run failed: $(grep -m1 'error\|HAZARD' "$tmp/$name.log" || tail -1 "$tmp/$name.log")"; return 1; }
}
times() { metric "$tmp/$1" ms | tr '\n' ' '; }
for n in 1 2; do
  [ "$n" = 2 ] && ! command -v mpiexec >/dev/null && { skip_or_fail "2-rank training (needs mpiexec)"; continue; }
  run off$n "$n" 1 "" && run on$n "$n" 1 h100 && run on${n}b "$n" 2 h100 || continue
  grep -q "virtual clock on (FT_EMU_VCLOCK): H100" "$tmp/on$n.log" && ok "$n rank(s): the clock announces itself" \
    || bad "$n rank(s): no virtual clock line"
  [ -n "$(metric "$tmp/off$n" loss)" ] && [ "$(metric "$tmp/on$n" loss)" = "$(metric "$tmp/off$n" loss)" ] \
    && [ "$(metric "$tmp/on$n" grad_norm)" = "$(metric "$tmp/off$n" grad_norm)" ] \
    && ok "$n rank(s): losses and gradient norms bitwise equal with the clock on and off" \
    || bad "$n rank(s): the clock changed results: $(metric "$tmp/on$n" loss | tr '\n' ' ') vs $(metric "$tmp/off$n" loss | tr '\n' ' ')"
  t1=$(times on$n); t2=$(times on${n}b)
  positive=$(metric "$tmp/on$n" ms | awk '$1 > 0 { n++ } END { print n + 0 }')
  [ "$positive" = 2 ] && [ "$t1" = "$t2" ] && ok "$n rank(s): per-step virtual ms on an H100 $t1, the same under another seed" \
    || bad "$n rank(s): per-step virtual ms '$t1' (seed 1) vs '$t2' (seed 2)"
done
if command -v mpiexec >/dev/null; then
  flags+=(--dp_shard 2 --batch_size_per_device 1)
  if run hsdp 4 1 h100 && run hsdpb 4 2 h100; then
    t1=$(times hsdp); t2=$(times hsdpb)
    [ -n "$t1" ] && [ "$t1" = "$t2" ] && ok "HSDP 2 x 2: per-step virtual ms $t1, the same under another seed"       || bad "HSDP 2 x 2: per-step virtual ms '$t1' (seed 1) vs '$t2' (seed 2)"
  fi
fi
finish
