#!/usr/bin/env bash
# tests/test_host_waits.sh: how often the host waits for the emulated GPU per optimizer step,
# and how many copies come back to the host. FT_EMU_STATS=1 makes the emulator count what it
# was issued ("cudaMemcpyAsync device-to-host") and each host wait that ended ("host wait:
# stream": a cudaStreamSynchronize, or the watchdog's cudaStreamQuery poll that found the
# stream done). Runs of 1 and 2 steps at 4 and at 2 micro-batches per step give the counts
# per step and per micro-batch (the 1-step run's startup checks, evaluations and final save
# cancel).
#   Before (measured 2026-11-28 on 05459b8): the loss came back per micro-batch (a copy of
#   the losses to the host, the stream drained before it and waited for after it), so the
#   device-to-host copies per step grew by 1 per micro-batch and there were 6 stream waits
#   per micro-batch (the loss read 2, the targets' and tokens' uploads 2 each).
#   Then the losses added up on the device (backend.h loss_accumulate) and the step read them
#   once (src/train.c): device-to-host copies per step do not depend on the micro-batches,
#   and 4 stream waits per micro-batch were left (the two uploads, which drained).
#   Now the micro-batch's rows go up from pinned staging slots on the compute stream
#   (backend.upload, src/model.c inputs_upload): 0 stream waits per micro-batch, and exactly
#   one more event wait per micro-batch than the pacing's 2 per layer (backend.pace after each
#   layer's forward and backward): the copy_wait before a slot is refilled, for the uploads of
#   two micro-batches back (long done). The build before this change fails here (4 stream
#   waits and 2 L event waits per micro-batch).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_host_waits
emu=$build/tests/finetune_emu
if [ ! -x "$emu" ]; then skip_or_fail "$emu not built (needs the CUDA toolkit's headers: make CUDA=1)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# count ACCUM STEPS: "STREAM_WAITS D2H_COPIES EVENT_WAITS" of the whole run
count() {
  FT_EMU_STATS=1 "$emu" --device cuda --batch_size_per_device 2 --total_batch_size $((2 * $1)) --seq_len 32 \
    --max_steps "$2" --max_eval_docs 2 --out_dir "$tmp/run" --overwrite_out_dir > "$tmp/run.log" 2>&1 \
    || { echo "run failed: $(tail -1 "$tmp/run.log")" >&2; echo "-1 -1 -1"; return; }
  awk '/^cuda_emu: issued host wait: stream / { w += $NF }
       /^cuda_emu: issued cudaMemcpyAsync device-to-host / { d += $NF }
       /^cuda_emu: issued host wait: event / { e += $NF }
       END { print w + 0, d + 0, e + 0 }' "$tmp/run.log"
}
read -r w41 d41 e41 <<< "$(count 4 1)"; read -r w42 d42 e42 <<< "$(count 4 2)"
read -r w21 d21 e21 <<< "$(count 2 1)"; read -r w22 d22 e22 <<< "$(count 2 2)"
waits4=$((w42 - w41)) waits2=$((w22 - w21)) d2h4=$((d42 - d41)) d2h2=$((d22 - d21))
waits_mb=$(( (waits4 - waits2) / 2 )) events_mb=$(( (e42 - e41 - e22 + e21) / 2 ))
layers=$(grep -o '"num_hidden_layers": *[0-9]*' data/model/config.json | grep -oE '[0-9]+$')
echo "per step: stream waits $waits4 at 4 micro-batches, $waits2 at 2; device-to-host copies $d2h4 and $d2h2"
[ "$w21" -gt 0 ] && [ "$d21" -gt 0 ] && ok "the emulator counted host waits and copies ($w21, $d21 in a 1-step run)" \
  || bad "no host waits or copies counted (FT_EMU_STATS): $w21 $d21"
[ "$d2h4" -gt 0 ] && [ "$d2h4" -eq "$d2h2" ] \
  && ok "device-to-host copies per step: $d2h4 at 4 micro-batches and at 2 (the loss read once per step)" \
  || bad "device-to-host copies per step: $d2h4 at 4 micro-batches, $d2h2 at 2 (wanted equal: one loss read per step)"
[ "$waits4" -eq "$waits2" ] && [ "$waits_mb" -eq 0 ] \
  && ok "stream waits per micro-batch: 0 ($waits4 per step at 4 micro-batches and at 2: the uploads do not drain)" \
  || bad "stream waits per micro-batch: $waits_mb ($waits4 per step at 4, $waits2 at 2; wanted 0: 4 when the uploads drain)"
[ -n "$layers" ] && [ "$events_mb" -eq $((2 * layers + 1)) ] \
  && ok "event waits per micro-batch: $events_mb (2 per layer of pacing + 1 staging slot's copy_wait; $layers layers)" \
  || bad "event waits per micro-batch: $events_mb (wanted 2 x $layers layers + 1)"
finish
