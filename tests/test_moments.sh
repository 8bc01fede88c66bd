#!/usr/bin/env bash
# test_moments.sh BUILD_DIR: --optimizer_moments bf16 (AdamW's exp_avg and exp_avg_sq stored in
# bf16) on the CPU, with the bundled model and chess shards (seq 64, 8 sequences a step, lr 3e-3):
#   1. training: 20 steps with fp32 and with bf16 moments. Steps 1 and 2 are bitwise the same
#      (step 1's loss comes before any update; step 1's update uses the unrounded fp32 moments
#      inside the op, so step 2's loss is the same too); later steps differ (the setting takes
#      effect), within a tolerance derived below. The checkpoint's optimizer.safetensors holds
#      BF16 tensors, half the bytes of the fp32 run's (within the header).
#   2. checkpoints: bf16 straight == bf16 stopped at 10 + resumed (bitwise: the moments are saved
#      as stored); a resume with the other setting converts, saying so in one line, both ways,
#      and saves in its own dtype.
#   3. --offload_optimizer with bf16 moments: one clear line, non-zero exit.
#
# Tolerance (1): RNE storage changes a moment by at most half a bf16 ulp, 2^-9 relative; the
# update m / sqrt(v) moves by at most 2^-9 + 2^-10 = 0.3% per step. To first order the loss
# then moves by at most 0.3% of what the updates moved it: |loss16 - loss32| at step k <=
# 0.003 x max_j |loss32_j - loss32_1| (the same rows in the same order: no other noise). We
# allow about 3x that for the compounding over 20 steps (a first-order bound), 1% of the loss's
# travel; a bf16 run that does not train (moments read as fp32 garbage) is far outside.
# Measured 2026-11-28: 1.1e-5 of the travel (1.1e-5 in loss over a travel of 1.02): the
# roundings are random in sign and mostly cancel, 270x below the worst case.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_moments
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small=(--seq_len 64 --batch_size_per_device 4 --total_batch_size 8 --max_eval_docs 16 --learning_rate 3e-3
       --max_steps 20)
dtypes() {   # the set of tensor dtypes in safetensors file $1
  python3 -c 'import json,struct,sys
f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; h=json.loads(f.read(n))
print(" ".join(sorted({v["dtype"] for k,v in h.items() if k!="__metadata__"})))' "$1"
}
run() {   # run NAME flags...: 0 when it succeeded (log in $tmp/NAME.log)
  local name=$1; shift
  "$bin" "${small[@]}" "$@" --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1 && return 0
  bad "$name: run failed: $(grep -m1 -i error "$tmp/$name.log")"; return 1
}

# ---------------------------------------------------------------- 1. training
run f32 --save_every 10 && run b16 --save_every 10 --optimizer_moments bf16 || finish
l32=$(metric "$tmp/f32" loss) l16=$(metric "$tmp/b16" loss)
[ "$(printf '%s\n' "$l32" | head -2)" = "$(printf '%s\n' "$l16" | head -2)" ] \
  && ok "steps 1-2: losses bitwise equal (no rounded moment used yet)" \
  || bad "steps 1-2 differ: $(paste <(echo "$l32") <(echo "$l16") | head -2)"
[ "$(printf '%s\n' "$l32" | tail -n +3)" != "$(printf '%s\n' "$l16" | tail -n +3)" ] \
  && ok "steps 3-20: bf16 moments change the losses (the setting takes effect)" || bad "bf16 moments changed nothing"
res=$(paste <(echo "$l32") <(echo "$l16") | awk 'NR == 1 { l1 = $1 } { t = $1 - l1; if (t < 0) t = -t; if (t > tr) tr = t
  d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.3e %.3e %.2e", w, tr, w / tr }')
read -r worst travel frac <<<"$res"
le "$frac" 0.01 && ok "20 steps: worst |loss16 - loss32| $worst = $frac of the loss's travel $travel (max 0.01)" \
  || bad "20 steps: worst |loss16 - loss32| $worst = $frac of the loss's travel $travel (max 0.01)"
o32="$tmp/f32/checkpoints/step_00000020/optimizer.safetensors" o16="$tmp/b16/checkpoints/step_00000020/optimizer.safetensors"
s32=$(stat -c %s "$o32") s16=$(stat -c %s "$o16")
[ "$(dtypes "$o16")" = BF16 ] && [ "$(dtypes "$o32")" = F32 ] && [ $((s32 - 2 * s16)) -lt 0 ] && [ $((2 * s16 - s32)) -lt 65536 ] \
  && ok "checkpoint moments: BF16 ($s16 bytes) vs F32 ($s32 bytes)" \
  || bad "checkpoint moments: $(dtypes "$o16") $s16 bytes vs $(dtypes "$o32") $s32 bytes (want BF16, half)"

# ---------------------------------------------------------------- 2. checkpoints
if run b16r --optimizer_moments bf16 --stop_at_step 10 && run b16r --optimizer_moments bf16 --resume latest; then
  cmp -s "$o16" "$tmp/b16r/checkpoints/step_00000020/optimizer.safetensors" \
    && cmp -s "$tmp/b16/checkpoints/step_00000020/model.safetensors" "$tmp/b16r/checkpoints/step_00000020/model.safetensors" \
    && [ "$(metric "$tmp/b16r" loss)" = "$l16" ] \
    && ok "bf16: 10 + resume + 10 == 20 straight (weights, moments, losses bitwise)" || bad "bf16: the resumed run differs"
fi
# resume_other NAME FROM_DTYPE TO_DTYPE: the FROM run's step-10 checkpoint resumed with TO moments
resume_other() {
  local from=$1 to=$2 name="$1_to_$2" want
  want=$([ "$to" = bf16 ] && echo BF16 || echo F32)
  run "$name" --optimizer_moments "$to" --resume "$tmp/$([ "$from" = bf16 ] && echo b16 || echo f32)/checkpoints/step_00000010" \
    || return
  grep -q "holds $([ "$from" = bf16 ] && echo BF16 || echo F32) moments; this run stores them in $want (--optimizer_moments $to): converted" \
    "$tmp/$name.log" && ok "$name: resumed, one note line: $(grep -m1 'moments; this run' "$tmp/$name.log")" \
    || bad "$name: no conversion note"
  [ "$(dtypes "$tmp/$name/checkpoints/step_00000020/optimizer.safetensors")" = "$want" ] \
    && ok "$name: saves $want moments" || bad "$name: saves $(dtypes "$tmp/$name/checkpoints/step_00000020/optimizer.safetensors")"
  local w; w=$(metric "$tmp/$name" loss | tail -1)
  le "$(awk -v a="$w" -v b="$(echo "$l32" | tail -1)" -v t="$travel" 'BEGIN { d = a - b; if (d < 0) d = -d; print d / t }')" 0.01 \
    && ok "$name: step 20 loss $w within 1% of the travel of fp32's" || bad "$name: step 20 loss $w, fp32 $(echo "$l32" | tail -1)"
}
resume_other bf16 fp32
resume_other fp32 bf16
grep -q "moments; this run" "$tmp/b16r.log" && bad "a same-setting resume printed a conversion note" \
  || ok "a same-setting resume prints no conversion note"

# ---------------------------------------------------------------- 3. bad input
expect_error "--offload_optimizer and --optimizer_moments bf16 do not combine" "${small[@]}" --out_dir "$tmp/off" \
  --offload_optimizer --optimizer_moments bf16
expect_error "flag --optimizer_moments: 'fp16' is not one of fp32|bf16" "${small[@]}" --out_dir "$tmp/bad" \
  --optimizer_moments fp16
finish
