#!/usr/bin/env bash
# The step-time timeline (src/plan_timeline.c) against the program's own schedule: the bundled
# model trained on emulated H100s with the virtual clock (FT_EMU_VCLOCK=h100,
# tests/cuda_emu/README.md "Virtual clock"), whose per-step virtual ms come from the events,
# stream waits, host syncs and collectives the program really makes, beside the timeline's H100
# prediction for the same job (--dry_run with the same flags and --world_size). Both price
# work with the same functions (src/plan_price.h) over the same fabric: a slow one (FABRIC GB/s
# of bus bandwidth, --fabric_intra_gbps for the estimate, FT_EMU_VCLOCK_INTRA_GBPS for the
# clock) so that at this tiny model's size a layer's gather outlasts its compute and the order
# of events decides the step time. What is checked is the timeline's
# logic: its dependencies (prefetch, buffer reuse, the reduce-scatter lane, accumulation,
# offload, the host's issue and waits), not its constants.
#   For each shape (1 rank; FSDP 2; FSDP 2 with 2 micro-batches; FSDP 2 --keep_params_gathered;
#   HSDP 2 x 2; HSDP 2 x 2 on 2 nodes of 2 GPUs, its replica all-reduces across nodes
#   (--dry_run_gpus_per_node 2, FT_EMU_VCLOCK_GPUS_PER_NODE=2); FSDP 2 --offload_optimizer;
#   FSDP 2 --accumulate_grads_locally): the mean
#   virtual ms of steps 2-3 (the first step's gathers and warm-up excluded) and the prediction
#   agree within TOL (15%, issue 36) and within TIGHT (8%, what they reach today: a change to
#   either schedule, the program's or src/plan_timeline.c's plan_tl_program_schedule, that is
#   not made in the other shows here); both figures and the ratio are printed.
# Usage: tests/test_plan_vclock.sh [build] (needs build/tests/finetune_emu and mpiexec);
# PLAN_VCLOCK_SHAPES="name ..." runs some of them; PLAN_VCLOCK_TABLE=FILE appends a Markdown row
# per shape (docs/results/2026-11-28-timeline-vs-vclock.md).
# Runtime: 90 s wall, 35 s of CPU at load 10 on the 2-core development machine (8 emulated jobs).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_plan_vclock
emu=$build/tests/finetune_emu
if [ ! -x "$emu" ]; then skip_or_fail "$emu not built (make CUDA=1)"; finish; fi
if ! command -v mpiexec >/dev/null; then skip_or_fail "mpiexec (the multi-rank shapes)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
FABRIC=${PLAN_VCLOCK_GBPS:-0.25}   # GB/s of bus bandwidth within a node and across, both sides
TOL=0.15     # issue 36's bound
TIGHT=0.08   # the regression guard: every shape agreed within 6.2% on 2026-11-28 (the one-rank
             # shape's host issue of copies and memsets, which the timeline does not charge;
             # the sharded ones within 1.5%); prefetching 2 layers instead of 1 in the
             # timeline reads 0.88-0.96 on five shapes, within TOL, two beyond this

base=(--device cuda --seq_len 64 --learning_rate 5e-3 --max_eval_docs 2 --warmup_fraction 0 --collective_timeout 0
      --eval_every 0)
# name ranks gpus-per-node flags...
shapes=(
  "one 1 8 --batch_size_per_device 2 --total_batch_size 2"
  "fsdp2 2 8 --batch_size_per_device 2 --total_batch_size 4"
  "fsdp2_accum2 2 8 --batch_size_per_device 1 --total_batch_size 4"
  "fsdp2_keep 2 8 --batch_size_per_device 1 --total_batch_size 4 --keep_params_gathered"
  "hsdp2x2 4 8 --batch_size_per_device 1 --total_batch_size 4 --dp_shard 2"
  "hsdp2x2_nodes 4 2 --batch_size_per_device 1 --total_batch_size 4 --dp_shard 2"
  "fsdp2_offload 2 8 --batch_size_per_device 2 --total_batch_size 4 --offload_optimizer"
  "fsdp2_local 2 8 --batch_size_per_device 1 --total_batch_size 4 --accumulate_grads_locally"
)
want=${PLAN_VCLOCK_SHAPES:-}

# the H100 row's "step ms" of the timeline table in a --dry_run's output
predicted_ms() { awk '/program.s schedule \(timeline/ { on = 1 } on && $1 == "H100-SXM5-80GB" { print $2; exit }' "$1"; }

for shape in "${shapes[@]}"; do
  read -r name n per_node flags <<<"$shape"
  [ -n "$want" ] && [[ " $want " != *" $name "* ]] && continue
  # shellcheck disable=SC2206
  f=("${base[@]}" $flags)
  "$emu" "${f[@]}" --dry_run --world_size "$n" --fabric_intra_gbps "$FABRIC" --fabric_inter_gbps "$FABRIC" \
    --dry_run_gpus_per_node "$per_node" >"$tmp/$name.plan" 2>&1 \
    || { bad "$name: --dry_run failed: $(tail -1 "$tmp/$name.plan")"; continue; }
  pred=$(predicted_ms "$tmp/$name.plan")
  launch=(); [ "$n" -gt 1 ] && launch=(timeout 600 mpiexec -n "$n")
  FT_EMU_VCLOCK=h100 FT_EMU_VCLOCK_INTRA_GBPS=$FABRIC FT_EMU_VCLOCK_INTER_GBPS=$FABRIC \
    FT_EMU_VCLOCK_GPUS_PER_NODE=$per_node "${launch[@]}" "$emu" "${f[@]}" --max_steps 3 \
    --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1 \
    || { bad "$name: the emulated run failed: $(grep -m1 'error\|HAZARD' "$tmp/$name.log" || tail -1 "$tmp/$name.log")"; continue; }
  meas=$(metric "$tmp/$name" ms | awk 'NR > 1 { s += $1; k++ } END { if (k) printf "%.4f", s / k }')
  if [ -z "$pred" ] || [ -z "$meas" ]; then bad "$name: no figures (predicted '$pred', virtual '$meas')"; continue; fi
  ratio=$(awk -v p="$pred" -v m="$meas" 'BEGIN { printf "%.3f", p / m }')
  line="$name ($n rank(s), $per_node per node, $flags): predicted $pred ms, virtual $meas ms, ratio $ratio"
  within() { awk -v r="$ratio" -v t="$1" 'BEGIN { d = r - 1; exit !(d <= t && -d <= t) }'; }
  if within "$TOL" && within "$TIGHT"; then ok "$line"
  elif within "$TOL"; then bad "$line (within issue 36's $TOL, beyond the regression guard $TIGHT)"
  else bad "$line (beyond $TOL)"; fi
  [ -n "${PLAN_VCLOCK_TABLE:-}" ] && echo "| $name | $n | $per_node | \`$flags\` | $pred | $meas | $ratio |" >>"$PLAN_VCLOCK_TABLE"
done
finish
