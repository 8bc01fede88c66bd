#!/usr/bin/env bash
# tests/test_host_waits.sh: how often the host waits for the emulated GPU per optimizer step.
# FT_EMU_STATS=1 makes the emulator count each host wait that ended ("host wait: stream": a
# cudaStreamSynchronize, or the watchdog's cudaStreamQuery poll that found the stream done;
# "host wait: event" the same for events). Runs of 1 and 2 steps at 4 and at 2 micro-batches
# per step give the stream waits per step and per micro-batch (the 1-step run's startup
# checks, evals and final save cancel).
#   Before (measured 2026-11-28, commit 238c5db): every copy_h2d drained the compute stream
#   twice (before and after the copy) and the micro-batch uploads 2 (targets, tokens; 3 with
#   --pack_attention per_game), so with the loss read that was 6 stream waits per
#   micro-batch: 24 + 3 per step at 4 micro-batches (27), 12 + 3 at 2 (15).
#   Now the uploads go through pinned staging slots (src/backend_cuda.c, cu_copy_h2d) and wait
#   at most for the slot's own earlier copy (an event); what is left per micro-batch is the
#   loss read (a drain before the copy to the host and a wait for the copy: 2).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_host_waits
emu=$build/tests/finetune_emu
if [ ! -x "$emu" ]; then skip_or_fail "$emu not built (needs the CUDA toolkit's headers: make CUDA=1)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

waits() {  # waits ACCUM STEPS: the stream waits of the whole run
  FT_EMU_STATS=1 "$emu" --device cuda --batch_size_per_device 2 --total_batch_size $((2 * $1)) --seq_len 32 \
    --max_steps "$2" --max_eval_docs 2 --out_dir "$tmp/run" --overwrite_out_dir > "$tmp/run.log" 2>&1 \
    || { echo "run failed: $(tail -1 "$tmp/run.log")" >&2; echo -1; return; }
  awk '/^cuda_emu: issued host wait: stream / { n += $NF } END { print n + 0 }' "$tmp/run.log"
}
a1=$(waits 4 1); a2=$(waits 4 2); b1=$(waits 2 1); b2=$(waits 2 2)
per_step4=$((a2 - a1)); per_step2=$((b2 - b1)); per_mb=$(( (per_step4 - per_step2) / 2 ))
echo "stream waits per step: $per_step4 at 4 micro-batches, $per_step2 at 2 (runs: $a1 $a2 $b1 $b2)"
[ "$a1" -gt 0 ] && [ "$b1" -gt 0 ] && ok "the emulator counted host waits ($a1 in a 1-step run)" \
  || bad "no host waits counted (FT_EMU_STATS): $a1 $b1"
[ "$per_mb" -ge 0 ] && [ "$per_mb" -le 2 ] \
  && ok "stream waits per micro-batch: $per_mb (at most 2: the loss read; 6 before the staged uploads)" \
  || bad "stream waits per micro-batch: $per_mb (wanted at most 2)"
[ "$per_step4" -gt 0 ] && [ "$per_step4" -le $((4 * 2 + 3)) ] \
  && ok "stream waits per step at 4 micro-batches: $per_step4 (at most 4 x 2 + 3)" \
  || bad "stream waits per step at 4 micro-batches: $per_step4 (wanted at most 11)"
finish
