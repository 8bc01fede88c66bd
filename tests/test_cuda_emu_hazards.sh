#!/usr/bin/env bash
# The asynchronous emulated runtime catches real stream-ordering bugs of the GPU path.
# Two builds of the trainer on the emulated device (kernels/kernels.mk) each leave out one
# event wait, through a TEST-ONLY macro:
#   finetune_emu_fault_prefetch  (-DFT_FAULT_SKIP_PREFETCH_WAIT, src/fsdp.c gather_finish):
#       FSDP computes with a prefetched layer without waiting for its all-gather
#   finetune_emu_fault_rs        (-DFT_FAULT_SKIP_RS_WAIT, src/comm_nccl.c ireduce_scatter):
#       the overlapped reduce-scatter starts without waiting for the backward that produces
#       the gradients it reads
# The same one-step FSDP job over 2 emulated GPUs must
#   1. pass with the unfaulted build (no HAZARD line, exit 0), and
#   2. fail with each faulted build: exit status 86 (CUEMU_HAZARD_EXIT) and a report naming
#      both operations: a compute-stream kernel or cublasLtMatmul reading data last written
#      by ncclAllGather (prefetch); ncclReduceScatter reading data last written by a compute
#      kernel or cublasLtMatmul (reduce-scatter).
#   3. the two reports name different streams for ncclAllGather and ncclReduceScatter: the
#      shard group's reduce-scatters have their own communicator and stream.
# The verdict does not depend on timing (vector clocks at issue time), so one seed is enough.
#   4. with --keep_params_gathered (every unit kept gathered in one buffer) the unfaulted
#      build passes and the prefetch fault is reported likewise.
#   5. the sums across replicas (src/fsdp.c grad_final: each unit's fp32 gradient slice
#      all-reduced as soon as it is final, overlapping the rest of the backward): HSDP 2 x 2
#      passes with the unfaulted build; finetune_emu_fault_ar (-DFT_FAULT_SKIP_AR_WAIT: the
#      gradient norm does not wait for them) is caught (exit 86), the report naming a compute
#      kernel that reads what an ncclAllReduce of ONE layer's slice wrote (the per-unit
#      all-reduces, not one of the whole gradient) on a stream of its own (the replica
#      group's); likewise DDP 2 (one shard: each slice final right after its backward).
#   6. --max_grad_norm 0 (src/fsdp.c early_update: each layer's AdamW on the compute stream as
#      its slice is final in the last micro-batch, writing its working parameters while the
#      all-gather of a lower layer reads another slice of the same buffer; each unit's norm
#      taken then too): FSDP 2 with 2 micro-batches, kept gathered, passes unfaulted.
#   7. the micro-batch uploads from pinned staging (src/model.c inputs_upload: two slots in
#      turn, a slot refilled only after copy_wait of its last uploads) on one emulated GPU,
#      4 micro-batches, packed rows with per-game segments (all three arrays staged): the
#      unfaulted build passes; finetune_emu_fault_upload (-DFT_FAULT_UPLOAD_NO_WAIT: one slot,
#      refilled without the wait) is caught (exit 86), the report naming the host's write to
#      the source of a pending cudaMemcpyAsync host-to-device. On a copy of the model cut to
#      ONE layer: with more, the pacing (backend.pace, a host wait for the work of 2 layers
#      back) happens to order the host after the previous micro-batch's uploads before the
#      refill, and the faulted build is not caught (correctly: its write then comes after
#      the copy).
# Runtime: nine 2-rank and two 4-rank runs of one step, two 1-rank ones: about 20 s wall (the
# 2-core machine).
set -u
build=${1:-build}
. "$(dirname "$0")/lib.sh" test_cuda_emu_hazards
missing=""
for b in finetune_emu finetune_emu_fault_prefetch finetune_emu_fault_rs finetune_emu_fault_ar finetune_emu_fault_upload; do
  [ -x "$build/tests/$b" ] || missing="$missing $b"
done
command -v mpiexec >/dev/null || missing="$missing mpiexec"
if [ -n "$missing" ]; then skip_or_fail "not built or missing:$missing (needs the CUDA headers, CUDA=1, and MPICH)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
flags=(--device cuda --batch_size_per_device 1 --total_batch_size 2 --seq_len 64 --max_steps 1 --max_eval_docs 1
       --warmup_fraction 0)
run() {  # run NAME BINARY [FLAGS...]: 2 ranks (RANKS=n: n), FSDP; sets rc
  local name=$1 b=$2; shift 2
  FT_EMU_SEED=1 timeout 300 mpiexec -n "${RANKS:-2}" "$build/tests/$b" "${flags[@]}" "$@" --out_dir "$tmp/$name" \
    >"$tmp/$name.log" 2>&1
  rc=$?
}
clean() {  # clean NAME WHAT: run NAME passed with no hazard
  [ $rc -eq 0 ] && ! grep -q HAZARD "$tmp/$1.log" && ok "$2: no hazard" \
    || bad "$2: rc $rc, $(grep -m1 'HAZARD\|error' "$tmp/$1.log")"
}
caught() {  # caught NAME WHAT REGEX: run NAME exited 86 with a report matching REGEX
  local line
  line=$(grep -m1 -E "$3" "$tmp/$1.log")
  [ $rc -eq 86 ] && [ -n "$line" ] && ok "$2: exit 86, ${line#cuda_emu: }" \
    || bad "$2 not reported: rc $rc, $(grep -m1 'HAZARD\|error' "$tmp/$1.log")"
}

run clean finetune_emu
clean clean "unfaulted FSDP over 2 emulated GPUs"

# compute-stream op reads what ncclAllGather wrote, unordered
run prefetch finetune_emu_fault_prefetch
caught prefetch "prefetch without its wait" 'HAZARD read-after-write: (kernel [a-z_0-9]+ \([^)]*\)|cublasLtMatmul \([^)]*\)) on stream [0-9]+ \(op #[0-9]+\) reads .* last written by ncclAllGather \([^)]*\) on stream [0-9]+'

# the same with every unit kept gathered (--keep_params_gathered: one buffer of all units,
# its prefetches go through the same wait): the clean build passes, the faulted one is caught
run keep_clean finetune_emu --keep_params_gathered
clean keep_clean "--keep_params_gathered, unfaulted"
run keep_prefetch finetune_emu_fault_prefetch --keep_params_gathered
caught keep_prefetch "--keep_params_gathered, prefetch without its wait" \
  'HAZARD read-after-write: .* last written by ncclAllGather'

# ncclReduceScatter reads what the compute stream wrote, unordered
run rs finetune_emu_fault_rs
caught rs "reduce-scatter without its wait" 'HAZARD read-after-write: ncclReduceScatter \([^)]*\) on stream [0-9]+ \(op #[0-9]+\) reads .* last written by (kernel [a-z_0-9]+|cublasLtMatmul) .* on stream [0-9]+'
grep -q "ordering hazard(s) reported" "$tmp/rs.log" && ok "the run ends with the hazard count" \
  || bad "no closing hazard count line"
# the shard group's reduce-scatters run on their own NCCL communicator and stream (review M6):
# the stream the reports name for ncclReduceScatter is not the one they name for ncclAllGather
ag=$(grep -m1 -oE 'ncclAllGather \([^)]*\) on stream [0-9]+' "$tmp/prefetch.log" | grep -oE '[0-9]+$')
rs=$(grep -m1 -oE 'ncclReduceScatter \([^)]*\) on stream [0-9]+' "$tmp/rs.log" | grep -oE '[0-9]+$')
[ -n "$ag" ] && [ -n "$rs" ] && [ "$ag" != "$rs" ] && ok "reduce-scatters on their own stream ($rs), all-gathers on stream $ag" \
  || bad "reduce-scatter and all-gather streams: '$rs' / '$ag'"

# the all-reduces across replicas, one per unit, waited for before the norm reads the slices.
# Default model: a layer unit holds 184,576 parameters: a slice of 92,288 over 2 shards.
RANKS=4 run hsdp_clean finetune_emu --dp_shard 2 --total_batch_size 4
clean hsdp_clean "unfaulted HSDP 2 x 2 over 4 emulated GPUs"
ar_caught() {  # ar_caught NAME SLICE: exit 86, a compute op reading what a per-unit all-reduce wrote
  local line
  line=$(grep -m1 -E "HAZARD read-after-write: (kernel [a-z_0-9]+ \([^)]*\)|cublasLtMatmul \([^)]*\)) on stream [0-9]+ \(op #[0-9]+\) reads .* last written by ncclAllReduce \($2 x f32\) on stream [0-9]+" "$tmp/$1.log")
  local rd wr
  rd=$(grep -oE '\) on stream [0-9]+ \(op' <<<"$line" | head -1 | grep -oE '[0-9]+')
  wr=$(grep -oE 'ncclAllReduce \([^)]*\) on stream [0-9]+' <<<"$line" | grep -oE '[0-9]+$')
  [ $rc -eq 86 ] && [ -n "$line" ] && [ -n "$rd" ] && [ "$rd" != "$wr" ] \
    && ok "$1: the norm without the all-reduces' waits: exit 86, ${line#cuda_emu: }" \
    || bad "$1: all-reduce fault not reported: rc $rc, $(grep -m1 'HAZARD\|error' "$tmp/$1.log")"
}
RANKS=4 run hsdp_ar finetune_emu_fault_ar --dp_shard 2 --total_batch_size 4
ar_caught hsdp_ar 92288
run ddp_ar finetune_emu_fault_ar --no_fsdp
ar_caught ddp_ar 184576

# the layers' AdamW in the last backward (no clipping), with every unit kept gathered
run early_clean finetune_emu --max_grad_norm 0 --keep_params_gathered --total_batch_size 4
[ $rc -eq 0 ] && ! grep -q HAZARD "$tmp/early_clean.log" && ok "--max_grad_norm 0 (early AdamW), kept gathered, 2 micro-batches: no hazard" \
  || bad "--max_grad_norm 0: rc $rc, $(grep -m1 'HAZARD\|error' "$tmp/early_clean.log")"
# 6. the uploads' staging slots, on a 1-layer cut of the default model (its layer 0 and root)
mkdir -p "$tmp/one_layer"
python3 - data/model "$tmp/one_layer" <<'PY'
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for f in os.listdir(src):
    if f not in ("model.safetensors", "config.json"): shutil.copy(os.path.join(src, f), dst)
c = json.load(open(src + "/config.json"))
c["num_hidden_layers"] = 1
json.dump(c, open(dst + "/config.json", "w"), indent=2)
raw = open(src + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, body = json.loads(raw[8:8 + n]), raw[8 + n:]
out, blobs, off = {}, [], 0
for k, v in head.items():
    if k == "__metadata__" or (k.startswith("model.layers.") and not k.startswith("model.layers.0.")): continue
    a, b = v["data_offsets"]
    blobs.append(body[a:b])
    out[k] = dict(v, data_offsets=[off, off + b - a])
    off += b - a
h = json.dumps(out).encode()
open(dst + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
up=(--model_dir "$tmp/one_layer" --total_batch_size 4 --pack --pack_attention per_game)
RANKS=1 run up_clean finetune_emu "${up[@]}"
clean up_clean "pinned upload slots, 1 layer, 4 micro-batches"
RANKS=1 run up_fault finetune_emu_fault_upload "${up[@]}"
caught up_fault "upload slot refilled without its wait" \
  'HAZARD host-write-before-complete: the host (touched|changed) the source.* of cudaMemcpyAsync host-to-device'
# Runtime: nine 2-rank and two 4-rank runs of one step, two 1-rank ones: about 20 s wall (the
# 2-core machine).

finish
