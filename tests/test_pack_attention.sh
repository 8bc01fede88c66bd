#!/usr/bin/env bash
# test_pack_attention.sh BUILD_DIR: --pack --pack_attention per_game (TRL's padding-free
# packing: each packed game attends to itself only, RoPE positions restart at its BOS, the
# token before a BOS predicts nothing) end to end on the bundled model and chess shards
# (seq 64, 8 sequences per step, 6 steps):
#   1. CPU: the flag is echoed in the config line; per_game trains on fewer target tokens than
#      row (one per game start in a row: the BOS targets are ignored) and its step losses
#      differ from row's (the default, unchanged); --gradient_checkpointing gives bitwise the
#      same step logs and weights; 2 micro-batches of 2 (with checkpointing) the losses of 1
#      of 4 within fp32 rounding (loss rel 1e-5: another summation order); refused without
#      --pack and without a bos_token_id.
#      With LoRA on q,k,v,o (B = 0 at the start) step 1 has the full model's loss. The mode is
#      recorded in trainer_state.json; a resume with the other one warns once.
#   2. FSDP 2 over mpiexec (CPU ranks): the single process's per_game losses within
#      test_dist.sh's tolerance (loss rel 1e-5).
#   3. the emulated GPU (build/tests/finetune_emu: the CUDA backend's host code and the
#      kernels under the CPU emulator, bf16): per_game losses follow the CPU's within
#      test_cuda_emu_train.sh's bf16 tolerances (loss rel 5e-3, step-1 grad norm rel 2e-3),
#      with --gradient_checkpointing bitwise the same as without, the startup note that
#      attention runs on the native kernels under --attention cudnn; and FSDP 2 over 2
#      emulated GPUs against the single emulated device.
# The equivalence of a game packed after another with the game alone, and the match with
# transformers, are in test_golden (C); the ops in test_ops and test_kernels.
# Runtime, measured on the shared 2-core machine: 1m45 wall, 1m05 of CPU (most of it the
# emulated runs).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_pack_attention
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
small=(--seq_len 64 --batch_size_per_device 4 --total_batch_size 8 --max_eval_docs 16 --learning_rate 3e-3 --max_steps 6
       --warmup_fraction 0)
targets() { sed -nE 's/.*trained steps [0-9-]+ of [0-9]+: ([0-9]+) target tokens.*/\1/p' "$1"; }

# ---------------------------------------------------------------- 1. CPU
run() { local name=$1; shift; "$bin" "${small[@]}" "$@" --out_dir "$tmp/$name" > "$tmp/$name.log" 2>&1 \
          || bad "$name: $(tail -1 "$tmp/$name.log")"; }
run row --pack
run game --pack --pack_attention per_game
run game_ckpt --pack --pack_attention per_game --gradient_checkpointing
run game_accum --pack --pack_attention per_game --gradient_checkpointing --batch_size_per_device 2
grep -q "^finetune: config:.* pack=true pack_attention=per_game " "$tmp/game.log" \
  && ok "the resolved config line shows pack_attention=per_game" || bad "config line: $(grep -m1 'config:' "$tmp/game.log")"
rt=$(targets "$tmp/row.log") gt=$(targets "$tmp/game.log")
[ -n "$rt" ] && [ -n "$gt" ] && [ "$gt" -lt "$rt" ] \
  && ok "per_game ignores the BOS targets: $gt target tokens vs $rt with row attention" || bad "target tokens: per_game '$gt', row '$rt'"
w=$(worst_rel "$(metric "$tmp/row" loss)" "$(metric "$tmp/game" loss)")
[ "$(metric "$tmp/game" loss | wc -l)" = 6 ] && ! le "$w" 1e-4 \
  && ok "per_game's step losses differ from row's (worst rel $w)" || bad "per_game vs row: worst rel '$w'"
[ "$(step_logs "$tmp/game")" = "$(step_logs "$tmp/game_ckpt")" ] \
  && cmp -s "$tmp/game/checkpoints/step_00000006/model.safetensors" "$tmp/game_ckpt/checkpoints/step_00000006/model.safetensors" \
  && ok "per_game with --gradient_checkpointing: bitwise the same step logs and weights" || bad "per_game checkpointing differs"
w=$(worst_rel "$(metric "$tmp/game" loss)" "$(metric "$tmp/game_accum" loss)")
le "$w" 1e-5 && ok "per_game in 2 micro-batches of 2 per step: the losses of 1 micro-batch of 4 (worst rel $w)" \
  || bad "per_game accumulation: worst rel $w"
# LoRA (adapters on q, k and v: the split, the adapters, then RoPE in place; B = 0 at the
# start): step 1's loss is the full model's, so RoPE there takes the segments too
run lora_game --pack --pack_attention per_game --lora_rank 4 --lora_targets q,k,v,o --max_steps 1
w=$(worst_rel "$(metric "$tmp/game" loss | head -1)" "$(metric "$tmp/lora_game" loss | head -1)")
le "$w" 1e-6 && ok "per_game with LoRA on q,k,v,o: step 1's loss is the full model's (rel $w)" || bad "per_game LoRA step 1: rel '$w'"
expect_error "flag --pack_attention per_game needs --pack" "${small[@]}" --pack_attention per_game --out_dir "$tmp/x"
mkdir -p "$tmp/nobos" && cp data/model/* "$tmp/nobos/" 2>/dev/null
sed -i -E 's/"bos_token_id": *[0-9]+/"bos_token_id": null/' "$tmp/nobos/config.json"
expect_error "flag --pack_attention per_game: $tmp/nobos/config.json has no bos_token_id" \
  "${small[@]}" --pack --pack_attention per_game --model_dir "$tmp/nobos" --out_dir "$tmp/x"
# shards whose games do not start with the config's BOS (another tokenizer's id): refused, not
# trained as `row` silently (no segment would ever start)
mkdir -p "$tmp/otherbos" && cp data/model/* "$tmp/otherbos/" 2>/dev/null
bos=$(sed -nE 's/.*"bos_token_id": *([0-9]+).*/\1/p' data/model/config.json)
sed -i -E "s/\"bos_token_id\": *[0-9]+/\"bos_token_id\": $((bos + 7))/" "$tmp/otherbos/config.json"
expect_error "flag --pack_attention per_game: training game 0 of data/chess starts with token $bos, not $tmp/otherbos/config.json's bos_token_id $((bos + 7))" \
  "${small[@]}" --pack --pack_attention per_game --model_dir "$tmp/otherbos" --out_dir "$tmp/x"

# checkpoints record the mode; a resume with the other one trains on (same rows) with one
# warning naming both; with the same one, none
run stop3 --pack --pack_attention per_game --stop_at_step 3
grep -q '"pack_attention": *"per_game"' "$tmp/stop3/checkpoints/step_00000003/trainer_state.json" \
  && ok "trainer_state.json records pack_attention per_game" || bad "trainer_state.json: $(cat "$tmp/stop3/checkpoints/step_00000003/trainer_state.json")"
cp -r "$tmp/stop3" "$tmp/stop3b"
"$bin" "${small[@]}" --pack --pack_attention row --resume latest --max_steps 4 --out_dir "$tmp/stop3" > "$tmp/r1.log" 2> "$tmp/r1.err" \
  && [ "$(grep -c "changes --pack_attention to row (the checkpoint's: per_game)" "$tmp/r1.err")" = 1 ] \
  && ok "resume with --pack_attention row: one warning: $(grep -o 'warning: .*' "$tmp/r1.err")" || bad "resume row: $(cat "$tmp/r1.err")"
"$bin" "${small[@]}" --pack --pack_attention per_game --resume latest --max_steps 4 --out_dir "$tmp/stop3b" > "$tmp/r2.log" 2>&1 \
  && ! grep -q "pack_attention to" "$tmp/r2.log" && ok "resume with the same mode: no warning" || bad "resume per_game: $(tail -2 "$tmp/r2.log")"

# ---------------------------------------------------------------- 2. FSDP 2 on CPU ranks
if have_mpi; then
  if timeout 300 mpiexec -n 2 "$bin" "${small[@]}" --pack --pack_attention per_game --out_dir "$tmp/fsdp2" \
       > "$tmp/fsdp2.log" 2>&1; then
    w=$(worst_rel "$(metric "$tmp/game" loss)" "$(metric "$tmp/fsdp2" loss)")
    [ "$(metric "$tmp/fsdp2" loss | wc -l)" = 6 ] && le "$w" 1e-5 \
      && ok "per_game FSDP 2 (CPU ranks) = one process: worst loss rel $w" || bad "per_game FSDP 2: worst rel $w"
  else bad "per_game FSDP 2: $(tail -1 "$tmp/fsdp2.log")"; fi
else skip_or_fail "per_game FSDP 2 on CPU ranks (needs mpiexec)"; fi

# ---------------------------------------------------------------- 3. the emulated GPU
emu=$build/tests/finetune_emu
if [ -x "$emu" ]; then
  export FT_EMU_SEED=1 FT_TEST_POISON_FRESH_GRADS=1
  eflags=(--pack --pack_attention per_game --device cuda)
  if "$emu" "${small[@]}" "${eflags[@]}" --out_dir "$tmp/emu" > "$tmp/emu.log" 2>&1; then
    w=$(worst_rel "$(metric "$tmp/game" loss)" "$(metric "$tmp/emu" loss)")
    g=$(worst_rel "$(metric "$tmp/game" grad_norm | head -1)" "$(metric "$tmp/emu" grad_norm | head -1)")
    [ "$(metric "$tmp/emu" loss | wc -l)" = 6 ] && le "$w" 5e-3 && le "$g" 2e-3 \
      && ok "per_game on the emulated GPU (bf16) vs CPU: losses worst rel $w, step-1 grad norm rel $g" \
      || bad "per_game emulated GPU vs CPU: losses rel $w, step-1 norm rel $g"
    grep -q "^finetune: note: --pack_attention per_game: attention in training and evaluation runs on the native kernels" \
      "$tmp/emu.log" && ok "under --attention cudnn: the note that per_game attention runs on the native kernels" \
      || bad "no native-kernels note: $(grep -m1 'attention' "$tmp/emu.log")"
  else bad "per_game emulated GPU: $(grep -m1 'error\|HAZARD' "$tmp/emu.log" || tail -1 "$tmp/emu.log")"; fi
  if "$emu" "${small[@]}" "${eflags[@]}" --gradient_checkpointing --out_dir "$tmp/emu_ckpt" > "$tmp/emu_ckpt.log" 2>&1; then
    [ "$(metric "$tmp/emu_ckpt" loss)" = "$(metric "$tmp/emu" loss)" ] \
      && [ "$(metric "$tmp/emu_ckpt" grad_norm)" = "$(metric "$tmp/emu" grad_norm)" ] \
      && ok "per_game on the emulated GPU with --gradient_checkpointing: identical losses and gradient norms" \
      || bad "per_game emulated checkpointing changes the losses"
  else bad "per_game emulated checkpointing: $(tail -1 "$tmp/emu_ckpt.log")"; fi
  if have_mpi; then
    if timeout 300 mpiexec -n 2 "$emu" "${small[@]}" "${eflags[@]}" --out_dir "$tmp/emu_fsdp2" > "$tmp/emu_fsdp2.log" 2>&1; then
      w=$(worst_rel "$(metric "$tmp/emu" loss)" "$(metric "$tmp/emu_fsdp2" loss)")
      [ "$(metric "$tmp/emu_fsdp2" loss | wc -l)" = 6 ] && le "$w" 5e-3 \
        && ok "per_game FSDP 2 over emulated GPUs vs one emulated GPU: losses worst rel $w" || bad "per_game emulated FSDP 2: rel $w"
    else bad "per_game emulated FSDP 2: $(grep -m1 'error\|HAZARD' "$tmp/emu_fsdp2.log" || tail -1 "$tmp/emu_fsdp2.log")"; fi
  else skip_or_fail "per_game FSDP 2 over emulated GPUs (needs mpiexec)"; fi
else skip_or_fail "$emu not built (needs the CUDA toolkit's headers: make CUDA=1)"; fi
finish
