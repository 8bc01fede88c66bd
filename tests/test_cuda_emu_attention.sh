#!/usr/bin/env bash
# test_cuda_emu_attention.sh BUILD_DIR: `--attention cudnn|native` on the emulated device
# (issue 12 item 2). build/tests/finetune_emu links tests/cuda_emu/attention_cudnn_emu.cpp, a CPU
# stand-in of the cuDNN attention engine (src/attn_engine.h) with the real one's signatures
# and layouts, so everything around it runs here: the flag, the plan cache and per-call
# workspace (src/attention_cudnn.c), the startup check against the native kernels, the fall
# back to native with one warning, and the workspace in the memory plan. The real cuDNN graphs
# (src/attention_cudnn_graph.c) are unverified on GPU: `make test-gpu` checks them there.
#
#   1. 3 steps of the default model: --attention cudnn (the default) and --attention native vs
#      --device cpu: the bootstrap line names the attention in use, no warning; losses within
#      rel 5e-3 and the step-1 gradient norm within rel 2e-3 of the fp32 CPU run (the bf16
#      tolerances of tests/test_cuda_emu_train.sh, derived there); cudnn vs native likewise
#   2. the fallback, forced through the stand-in's TEST-ONLY FT_TEST_CUDNN_FAULT: `plan` (no
#      engine builds a plan) and `mismatch` (a wrong scale, caught by the startup check): ONE
#      warning line naming the reason, attention native, and the losses bitwise those of
#      --attention native
#   3. --attention bogus: one error line naming the flag, non-zero exit, no output directory;
#      --help lists the flag with its choices
#   2b. a cuDNN failure at run time (TEST-ONLY late_fwd / late_bwd: a later plan fails): one
#      warning naming the pass, native from then on, losses within tolerance (late_fwd bitwise
#      native; late_bwd: a native backward after a cuDNN forward)
#   1b. --deterministic: cudnn, no warning, the losses of the default cudnn run (the stand-in's
#      sums are the same; the real deterministic graph is planned by test_cudnn_plan)
#   1c. tests/gpu/deterministic_gpu.sh (first light's check) passes here and reports a second
#      run that differs
#   5. every attention plan built before step 1 (issue 35 item 5): none built or evicted
#      after step 1 at --seq_len 256 with unpacked rows of several buckets; the lazy path's
#      late builds are reported (meta-check)
#   4. --dry_run of CodeLlama-7b on a GPU: with cudnn the workspace holds exactly
#      attn_cudnn_workspace_bound (2 B H T D 4 + B H T 4 + 16 MiB) in place of the native
#      backward's 16 MiB dS^T workspace, on a line of its own; --deterministic adds B H T^2 x 2
#
# Each check can fail; mutants run against this test (and test_backend_emu), each caught:
#   the stand-in's GQA head mapping h % KVH            -> "runs cudnn, no warning" (dq NMSE 1.39)
#   attention_select keeps cuDNN after a failed check  -> 5 failures (fault runs: no warning,
#                                                         cudnn in use, plan fault aborts)
#   --attention without its choices in the flag table  -> the --help check
#   the planner skips the workspace on bf16            -> the --dry_run check
#   the startup check's threshold 1e-4 -> 1.0           -> the mismatch fault (no warning)
#   the plan cache never counts a plan (test_backend_emu) -> "cudnn cache: 0 plans kept"
#
# Runtime, measured on the 2-core development machine (load ~2): 40 s wall, 58 s of CPU
# (seven 3-step emulated runs, one CPU run, three dry runs), plus section 5's two 4-step runs
# at seq 256: ~25 s wall and ~11 s of CPU each. A mutant that returns the
# cuDNN error instead of falling back at run time fails both late_* runs (run aborted).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_cuda_emu_attention
emu=$build/tests/finetune_emu
if [ ! -x "$emu" ]; then skip_or_fail "$emu not built (needs the CUDA toolkit's headers: make CUDA=1)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export FT_EMU_SEED=1
flags=(--batch_size_per_device 2 --total_batch_size 4 --seq_len 64 --max_steps 3 --learning_rate 5e-3
       --max_eval_docs 8 --warmup_fraction 0)

OMP_NUM_THREADS=2 "$build/finetune" --device cpu "${flags[@]}" --out_dir "$tmp/cpu" >"$tmp/cpu.log" 2>&1 || bad "CPU run: $(tail -1 "$tmp/cpu.log")"
run() {  # run NAME [ENV=VALUE...] -- FLAGS...: an emulated run into $tmp/NAME
  local name=$1; shift
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" "$emu" --device cuda "${flags[@]}" "$@" --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1 \
    || bad "$name: emulated run failed: $(grep -m1 HAZARD "$tmp/$name.log" || tail -1 "$tmp/$name.log")"
}
uses() {   # the bootstrap line; cudnn's also gives its startup check's time and worst NMSE
  if [ "$2" = cudnn ]; then grep -qE "\), attention cudnn \(startup check [0-9.]+ s, worst NMSE [0-9.]+e[+-][0-9]+\)\)" "$1"
  else grep -q "), attention $2)" "$1"; fi
}
warnings() { grep -c "warning" "$1"; }

# 1. cudnn (default) and native against the CPU
run cudnn FT_EMU_SEED=1 --
run native FT_EMU_SEED=1 -- --attention native
for a in cudnn native; do
  uses "$tmp/$a.log" "$a" && [ "$(warnings "$tmp/$a.log")" = 0 ] && ok "--attention $a: runs $a, no warning" \
    || bad "--attention $a: $(grep -E 'warning|bootstrap' "$tmp/$a.log")"
  w=$(worst_rel "$(metric "$tmp/cpu" loss)" "$(metric "$tmp/$a" loss)")
  [ "$(metric "$tmp/$a" loss | wc -l)" = 3 ] && le "$w" 5e-3 && ok "$a: 3 step losses vs fp32 CPU: worst rel $w" || bad "$a losses: worst rel $w"
  w=$(worst_rel "$(metric "$tmp/cpu" grad_norm | head -1)" "$(metric "$tmp/$a" grad_norm | head -1)")
  le "$w" 2e-3 && ok "$a: step-1 gradient norm vs CPU: rel $w" || bad "$a step-1 gradient norm: rel $w"
done
w=$(worst_rel "$(metric "$tmp/native" loss)" "$(metric "$tmp/cudnn" loss)")
le "$w" 5e-3 && ok "cudnn vs native: 3 step losses, worst rel $w" || bad "cudnn vs native losses: worst rel $w"

# 1b. --deterministic: the backward plans use the deterministic graph (the stand-in computes
# the same sums either way, so the losses are bitwise the default cudnn run's; the real
# graphs differ, test_cudnn_plan plans both) and reserve its dP (B H T^2 x 2) in the workspace
run cudnn_det FT_EMU_SEED=1 -- --deterministic
grep -qE "\), attention cudnn \(deterministic backward; startup check [0-9.]+ s, worst NMSE [0-9.]+e[+-][0-9]+\)\)" "$tmp/cudnn_det.log" && [ "$(warnings "$tmp/cudnn_det.log")" = 0 ] \
  && [ "$(metric "$tmp/cudnn_det" loss)" = "$(metric "$tmp/cudnn" loss)" ] \
  && ok "--deterministic: cudnn with the deterministic backward, no warning, losses bitwise the default run's (the stand-in's arithmetic is the same)" \
  || bad "--deterministic: $(grep -E 'warning|bootstrap' "$tmp/cudnn_det.log"); losses $(metric "$tmp/cudnn_det" loss | tr '\n' ' ')"

# 1c. tests/gpu/deterministic_gpu.sh (first light's reproducibility check) on the emulated
# device, where every run is deterministic: it passes; with its second --deterministic run
# changed (TEST-ONLY FT_TEST_DET_RUN2_FLAGS: another learning rate) it fails
out=$(bash tests/gpu/deterministic_gpu.sh "$emu" cuda 2>&1)
[[ "$out" == *"deterministic_gpu: 1 passed, 0 failed"* ]] && ok "deterministic_gpu.sh on the emulated device: passes" \
  || bad "deterministic_gpu.sh: $(tail -3 <<<"$out")"
out=$(FT_TEST_DET_RUN2_FLAGS="--learning_rate 4e-3" bash tests/gpu/deterministic_gpu.sh "$emu" cuda 2>&1); rc=$?
[ $rc != 0 ] && [[ "$out" == *"FAIL --deterministic: two runs differ"* ]] && ok "deterministic_gpu.sh: a second run that differs is reported" \
  || bad "deterministic_gpu.sh missed a differing run: rc $rc, $(tail -3 <<<"$out")"

# 2. the fallback: one warning naming the reason, then native (bitwise the native run)
for fault in plan:"no engine supports the forward graph" mismatch:"disagrees with the native kernels on out"; do
  f=${fault%%:*}; why=${fault#*:}
  run "fault_$f" FT_TEST_CUDNN_FAULT="$f" --
  line=$(grep "warning" "$tmp/fault_$f.log")
  [ "$(warnings "$tmp/fault_$f.log")" = 1 ] && [[ "$line" == *"--attention cudnn: "*"$why"*"using the native attention kernels" ]] \
    && ok "fault $f: one warning: $line" || bad "fault $f: warnings '$line'"
  uses "$tmp/fault_$f.log" native && [ "$(metric "$tmp/fault_$f" loss)" = "$(metric "$tmp/native" loss)" ] \
    && ok "fault $f: trains with native attention (losses bitwise those of --attention native)" \
    || bad "fault $f: $(grep bootstrap "$tmp/fault_$f.log"); losses $(metric "$tmp/fault_$f" loss | tr '\n' ' ')"
done

# 2b. a failure at run time, on a shape the startup check did not build (TEST-ONLY faults
# late_fwd / late_bwd: the check's plans build, later ones fail): ONE warning naming the pass,
# then native for the rest of the run. late_fwd: every training forward is native, so the
# losses are bitwise those of --attention native; late_bwd: the first micro-batch's forward ran
# on cuDNN and its logsumexp feeds the native backward (the second micro-batch of step 1 is
# native already), so the losses are within the bf16 tolerance of the CPU (section 1) and
# step 1's is not bitwise the native run's
for f in late_fwd late_bwd; do
  which=forward; [ $f = late_bwd ] && which=backward
  # (TEST-ONLY FT_TEST_LAZY_ATTN_PLANS: the plans build on first use, as before issue 35, so the
  # fault hits the step loop's call and not the build ahead of step 1)
  run "fault_$f" FT_TEST_CUDNN_FAULT="$f" FT_TEST_LAZY_ATTN_PLANS=1 --
  line=$(grep "warning" "$tmp/fault_$f.log")
  [ "$(warnings "$tmp/fault_$f.log")" = 1 ] && [[ "$line" == *"--attention cudnn: the $which failed at run time: "*"using the native attention kernels from now on" ]] \
    && ok "fault $f: one warning: $line" || bad "fault $f: warnings '$line'"
  w=$(worst_rel "$(metric "$tmp/cpu" loss)" "$(metric "$tmp/fault_$f" loss)")
  [ "$(metric "$tmp/fault_$f" loss | wc -l)" = 3 ] && le "$w" 5e-3 && ok "fault $f: 3 step losses vs fp32 CPU: worst rel $w" || bad "fault $f losses: worst rel $w"
done
[ "$(metric "$tmp/fault_late_fwd" loss)" = "$(metric "$tmp/native" loss)" ] && ok "fault late_fwd: losses bitwise those of --attention native" \
  || bad "fault late_fwd: losses $(metric "$tmp/fault_late_fwd" loss | tr '\n' ' ') vs native $(metric "$tmp/native" loss | tr '\n' ' ')"
[ "$(metric "$tmp/fault_late_bwd" loss | head -1)" != "$(metric "$tmp/native" loss | head -1)" ] \
  && ok "fault late_bwd: step 1 loss not the native run's (its first micro-batch's forward ran on cuDNN)" \
  || bad "fault late_bwd: step 1 loss equals the native run's: the cuDNN forward never ran"

# 5. nothing compiled inside the step loop (issue 35 item 5): unpacked rows of different games
# at --seq_len 256 (buckets 64, 128, 192, 256), 4 steps of 2 rows. Every plan is built before
# step 1 (one line: 8 plans, forward and backward, and the time) and none is built or evicted
# after step 1 (the counts printed at the end of the step loop); the TEST-ONLY lazy path
# (FT_TEST_LAZY_ATTN_PLANS=1: plans built on first use) reports the builds it makes after step 1
# (2 here: a bucket first met in step 2 or later), so the check can fail. Both train the same
# losses (building ahead changes no arithmetic).
flags=(--batch_size_per_device 2 --total_batch_size 2 --seq_len 256 --max_steps 4 --learning_rate 5e-3
       --max_eval_docs 4 --warmup_fraction 0)
run ahead FT_EMU_SEED=1 --
run lazy FT_EMU_SEED=1 FT_TEST_LAZY_ATTN_PLANS=1 --
after() { sed -nE 's/^finetune: attention plans after step 1: ([0-9]+) built, ([0-9]+) evicted$/\1 \2/p' "$1"; }
grep -qE "^finetune: built 8 attention plans \(every sequence bucket up to 256, forward and backward\) in [0-9.]+ s$" "$tmp/ahead.log" \
  && [ "$(after "$tmp/ahead.log")" = "0 0" ] \
  && ok "plans built ahead: $(grep -m1 'attention plans (' "$tmp/ahead.log" | cut -c11-); after step 1: 0 built, 0 evicted" \
  || bad "plans built ahead: $(grep 'attention plans' "$tmp/ahead.log" | tr '\n' ' ')"
lazy_after=$(after "$tmp/lazy.log")
! grep -q "^finetune: built [0-9]* attention plans" "$tmp/lazy.log" && [ -n "$lazy_after" ] && [ "${lazy_after% *}" -gt 0 ] \
  && ok "meta: the lazy path (FT_TEST_LAZY_ATTN_PLANS) reports ${lazy_after% *} plan(s) built after step 1" \
  || bad "meta: the lazy path reports '$lazy_after' after step 1: the check cannot fail"
[ "$(metric "$tmp/ahead" loss | wc -l)" = 4 ] && [ "$(metric "$tmp/ahead" loss)" = "$(metric "$tmp/lazy" loss)" ] \
  && ok "plans built ahead or lazily: the same 4 losses" || bad "ahead vs lazy losses differ: $(metric "$tmp/ahead" loss | tr '\n' ' ') vs $(metric "$tmp/lazy" loss | tr '\n' ' ')"

# 3. flag handling
err=$("$emu" --device cuda --attention bogus --out_dir "$tmp/bogus" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c .)" = 1 ] && [[ "$err" == *"flag --attention: 'bogus'"* ]] && [ ! -e "$tmp/bogus" ] \
  && ok "bad value: $err" || bad "bad value: rc $rc '$err'"
"$build/finetune" --help | grep -q -- "--attention .*\[cudnn|native\] (default: cudnn)" && ok "--help lists --attention [cudnn|native]" \
  || bad "--help: $("$build/finetune" --help | grep -- --attention)"

# 4. the workspace in the memory plan (B 1, T 512, H 32, D 128)
m7=data/configs/codellama-7b
ws() { "$build/finetune" --dry_run --model_dir $m7 --device cuda --world_size 4 "$@" | awk '$1 == "workspace" { print $2 }'; }
# (native plans its dS^T workspace instead: 32 heads x 512^2 x 2 bytes = 16 MiB, src/attention_ws.h)
a=$(ws); b=$(ws --attention native); want=$(( 2 * 32 * 512 * 128 * 4 + 32 * 512 * 4 + 16 * 1048576 - 16777216 ))
[ -n "$a" ] && [ $((a - b)) = $want ] && "$build/finetune" --dry_run --model_dir $m7 --device cuda --world_size 4 | grep -q "cuDNN attention workspace" \
  && ok "--dry_run 7B: cuDNN attention workspace planned: $((a - b)) bytes (bound $want)" || bad "--dry_run workspace: cudnn $a, native $b, want +$want"
# --deterministic adds cuDNN's bf16 dP, 32 heads x 512^2 x 2 bytes, on its own line's label
d=$(ws --deterministic)
[ -n "$d" ] && [ $((d - a)) = $(( 32 * 512 * 512 * 2 )) ] \
  && "$build/finetune" --dry_run --model_dir $m7 --device cuda --world_size 4 --deterministic | grep -q "bf16 dP for --deterministic" \
  && ok "--dry_run 7B --deterministic: + $((d - a)) bytes of dP (32 x 512^2 x 2)" || bad "--dry_run --deterministic: workspace $d vs $a"
# and its step-time estimate the dP's round trip through HBM: written and read once per layer
# and micro-batch, 16 micro-batches x 32 layers x 2 x 32 x 512^2 x 2 bytes = 17.18 GB per rank
gb=$("$build/finetune" --dry_run --model_dir $m7 --device cuda --world_size 4 --deterministic \
     | awk '/attention dP through HBM/ { print $(NF - 3) }')
nodp=$("$build/finetune" --dry_run --model_dir $m7 --device cuda --world_size 4 | grep -c "attention dP through HBM")
[ "$gb" = "$(awk 'BEGIN { printf "%.2f", 16 * 32 * 2 * 32 * 512 * 512 * 2 / 1e9 }')" ] && [ "$nodp" = 0 ] \
  && ok "--dry_run 7B --deterministic: the dP round trip, $gb GB per step, in the memory-bound time" \
  || bad "--dry_run --deterministic dP bytes: '$gb' GB (want 17.18), without the flag $nodp line(s)"
# with a GQA group of 4 at seq 8192 the native backward's dS^T (4 x 8192^2 x 2 = 512 MiB for one
# kv head, past the 32 MiB cap: one launch) outgrows cuDNN's bound (~285 MB); a cudnn job plans
# the larger, because a failed startup check or call falls back to the native kernels
mkdir -p "$tmp/gqa7b" && sed 's/"num_key_value_heads": 32/"num_key_value_heads": 8/' $m7/config.json > "$tmp/gqa7b/config.json"
gq() { "$build/finetune" --dry_run --model_dir "$tmp/gqa7b" --device cuda --world_size 4 --seq_len 8192 "$@" | awk '$1 == "workspace" { print $2 }'; }
a=$(gq); b=$(gq --attention native); ds=$(( 4 * 8192 * 8192 * 2 ))
# both plans hold the same dS^T bytes (the cudnn one as its workspace, the native one as its own)
[ -n "$a" ] && [ "$a" = "$b" ] && "$build/finetune" --dry_run --model_dir "$tmp/gqa7b" --device cuda --world_size 4 --seq_len 8192 \
  | grep -q "cuDNN attention workspace, sized for the native backward's dS^T" \
  && ok "--dry_run GQA 4 at seq 8192: the cudnn plan reserves the native fallback's $ds-byte dS^T workspace" \
  || bad "--dry_run GQA seq 8192: workspace cudnn $a, native $b (want equal, dS^T $ds)"
finish
