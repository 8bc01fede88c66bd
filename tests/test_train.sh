#!/usr/bin/env bash
# test_train.sh BUILD_DIR: the training job end to end on the bundled model and chess shards,
# with small settings (seq 64, 8 sequences per step):
#   1. resume equivalence: 6 steps straight == 3 steps + stop + resume + 3 steps, bitwise
#      (weights, AdamW moments, per-step losses), in game mode and in pack mode with
#      gradient checkpointing and gradient accumulation; a checkpoint without checksums (an
#      older build's) resumes the same;
#      --eval_only: of a checkpoint and of --model_dir, the val loss bitwise the run's (%a),
#      no gradient or optimizer byte allocated; a checkpoint's damaged moments are refused by a
#      resume that trains and not read by --eval_only;
#   2. the checkpoint line (size, seconds, rate) and, under Slurm, the warning when a step and
#      a checkpoint exceed the stop signal's margin; SIGTERM mid-run saves a checkpoint and
#      exits 0; the resumed run finishes; a second job
#      into a running job's --out_dir is refused; SIGTERM while sampling stops there; Ctrl-C
#      twice exits at once; an --out_dir removed or replaced under a running job stops it, and so
#      does its .lock or metrics.jsonl removed;
#   3. the Hugging Face export: layout, dtype, tokenizer files, our loss on it; and when a
#      Python with transformers is available (FT_ORACLE_PYTHON, or /opt/oracle-venv), that
#      transformers loads it and computes the same validation loss;
#   4. bad input: one clear line, non-zero exit, nothing half-written (among it a checkpoint
#      with one bit flipped in model.safetensors or optimizer.safetensors: its checksum; a
#      checkpoint the disk cannot take, CPU, offload and the emulated GPU);
#      shards of another tokenizer than --model_dir's (shards.json's sha256): one warning.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_train
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
small=(--seq_len 64 --batch_size_per_device 4 --total_batch_size 8 --max_eval_docs 16 --learning_rate 3e-3)

# train lines of metrics.jsonl without the timing fields

# ---------------------------------------------------------------- 1. resume equivalence
resume_case() {
  local name="$1"; shift
  local a="$tmp/$name-a" b="$tmp/$name-b"
  "$bin" "${small[@]}" "$@" --max_steps 6 --out_dir "$a" > "$a.log" 2>&1 || { bad "$name: straight run failed: $(tail -1 "$a.log")"; return; }
  "$bin" "${small[@]}" "$@" --max_steps 6 --stop_at_step 3 --out_dir "$b" > "$b.log" 2>&1 || { bad "$name: first half failed"; return; }
  [ "$(cat "$b/checkpoints/latest")" = "step_00000003" ] && ok "$name: stop at step 3 left checkpoint step_00000003" || bad "$name: latest = $(cat "$b/checkpoints/latest")"
  [ ! -e "$b/final" ] && ok "$name: no export after a stop" || bad "$name: export written after a stop"
  "$bin" "${small[@]}" "$@" --max_steps 6 --resume latest --out_dir "$b" > "$b.log2" 2>&1 || { bad "$name: resume failed: $(tail -1 "$b.log2")"; return; }
  grep -q "resumed from .*step_00000003 at step 3" "$b.log2" && ok "$name: resumed at step 3" || bad "$name: resume message missing"
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "$a/checkpoints/step_00000006/$f" "$b/checkpoints/step_00000006/$f" \
      && ok "$name: $f after 6 steps bitwise equal (straight vs 3 + resume + 3)" \
      || bad "$name: $f differs between straight and resumed runs"
  done
  if [ "$(step_logs "$a")" = "$(step_logs "$b")" ] && [ "$(step_logs "$a" | wc -l)" -eq 6 ]; then
    ok "$name: the 6 step losses, lrs and grad norms are identical"
  else bad "$name: step logs differ"; diff <(step_logs "$a") <(step_logs "$b") >&2; fi
}
resume_case games
resume_case packed --pack --gradient_checkpointing --batch_size_per_device 2

# the checkpoint line names its size, seconds and rate; under Slurm (SLURM_JOB_ID), a step and a
# checkpoint longer than the stop signal's margin (FT_SIGNAL_MARGIN_S, here 1 us) warn once
# (two checkpoints here), naming the sbatch margin to use; outside Slurm, no warning
m="$tmp/margin"
env SLURM_JOB_ID=1 FT_SIGNAL_MARGIN_S=0.000001 "$bin" "${small[@]}" --max_steps 2 --save_every 1 --out_dir "$m" \
  > "$m.log" 2> "$m.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -cE "^checkpoint: $m/checkpoints/step_0000000[12] \([0-9.]+ MiB in [0-9.]+ s, [0-9]+ MB/s\)$" "$m.log")" = 2 ] \
  && [ "$(grep -c "warning: a step" "$m.err")" = 1 ] \
  && grep -q "than the 1e-06 s a stop signal leaves before Slurm's time limit (FT_SIGNAL_MARGIN_S).*sbatch --signal=TERM@60 " "$m.err" \
  && ok "checkpoint lines with size, seconds and rate; under Slurm one margin warning: $(grep -o 'warning: a step.*limit' "$m.err")" \
  || bad "checkpoint line / margin warning: rc $rc: $(grep checkpoint: "$m.log") $(cat "$m.err")"
env -u SLURM_JOB_ID FT_SIGNAL_MARGIN_S=0.000001 "$bin" "${small[@]}" --max_steps 1 --out_dir "$m-2" > "$m-2.log" 2>&1 \
  && ! grep -q "warning: a step" "$m-2.log" && ok "outside Slurm: no margin warning" || bad "outside Slurm: $(cat "$m-2.log")"

# a checkpoint whose files carry no checksums (an older build's: strip_checksums) resumes as
# before, unchecked, bitwise as above; the checkpoints it saves carry them again
o="$tmp/nosum"; mkdir -p "$o/checkpoints"; cp -r "$tmp/games-b/checkpoints/step_00000003" "$o/checkpoints/"
echo step_00000003 > "$o/checkpoints/latest"
for f in model optimizer; do strip_checksums "$o/checkpoints/step_00000003/$f.safetensors"; done
if ! grep -q finetune.checksum "$o/checkpoints/step_00000003/"*.safetensors \
   && "$bin" "${small[@]}" --max_steps 6 --resume latest --out_dir "$o" > "$o.log" 2>&1 \
   && cmp -s "$tmp/games-a/checkpoints/step_00000006/model.safetensors" "$o/checkpoints/step_00000006/model.safetensors" \
   && cmp -s "$tmp/games-a/checkpoints/step_00000006/optimizer.safetensors" "$o/checkpoints/step_00000006/optimizer.safetensors" \
   && [ "$(grep -c '"finetune.checksum.exp_avg_sq.model.norm.weight":"[0-9a-f]\{16\}"' \
          "$o/checkpoints/step_00000006/optimizer.safetensors")" = 1 ]; then
  ok "a checkpoint without checksums resumes: step 6 bitwise the straight run's, saved with checksums"
else bad "resume of a checkpoint without checksums: $(tail -1 "$o.log")"; fi

# --resume auto, the one command line of a requeued job: the first run starts fresh (nothing
# saved yet), the same command again continues from the latest checkpoint, bitwise as above
c="$tmp/auto"
"$bin" "${small[@]}" --max_steps 6 --stop_at_step 3 --resume auto --out_dir "$c" > "$c.log" 2>&1 \
  && grep -q "^finetune: --resume auto: no checkpoint in .*, starting fresh" "$c.log" \
  && ok "--resume auto with nothing saved: a fresh start, said once" || bad "--resume auto, first run: $(tail -1 "$c.log")"
# the first command once more (a requeue of the job that stops at 3): it resumes at its
# --stop_at_step and trains nothing (it trained step 4 and saved step_00000004)
"$bin" "${small[@]}" --max_steps 6 --stop_at_step 3 --resume auto --out_dir "$c" > "$c.log1b" 2>&1 \
  && grep -q "^finetune: stopping at step 3 (resumed at or past --stop_at_step 3): no step to train" "$c.log1b" \
  && [ "$(cat "$c/checkpoints/latest")" = step_00000003 ] && [ ! -e "$c/checkpoints/step_00000004" ] \
  && ok "--resume auto --stop_at_step 3 at step 3: nothing trained, latest still step_00000003" \
  || bad "--resume auto --stop_at_step 3 at step 3: latest $(cat "$c/checkpoints/latest"): $(tail -1 "$c.log1b")"
"$bin" "${small[@]}" --max_steps 6 --resume auto --out_dir "$c" > "$c.log2" 2>&1 \
  && grep -q "resumed from .*step_00000003 at step 3" "$c.log2" && ok "--resume auto again: resumed at step 3" \
  || bad "--resume auto, second run: $(tail -1 "$c.log2")"
cmp -s "$tmp/games-a/checkpoints/step_00000006/model.safetensors" "$c/checkpoints/step_00000006/model.safetensors" \
  && [ "$(step_logs "$tmp/games-a")" = "$(step_logs "$c")" ] && ok "--resume auto twice = the straight run (weights, step logs)" \
  || bad "--resume auto twice differs from the straight run"

# resuming from an earlier checkpoint of the same out_dir (after a crash, or --resume DIR)
# rewinds metrics.jsonl to that step: the log ends as the straight run's, nothing twice; and
# resuming a finished run logs its final evaluation and writes its samples once, not again
d="$tmp/rewind"
"$bin" "${small[@]}" --max_steps 6 --save_every 3 --sample_tokens 4 --sample_games 2 --out_dir "$d" > "$d.log" 2>&1 \
  || bad "rewind: straight run failed: $(tail -1 "$d.log")"
"$bin" "${small[@]}" --max_steps 6 --sample_tokens 4 --sample_games 2 --resume "$d/checkpoints/step_00000003" \
  --out_dir "$d" > "$d.log2" 2>&1 || bad "rewind: resume from step 3 failed: $(tail -1 "$d.log2")"
"$bin" "${small[@]}" --max_steps 6 --sample_tokens 4 --sample_games 2 --resume latest --out_dir "$d" > "$d.log3" 2>&1 \
  || bad "rewind: resume of the finished run failed: $(tail -1 "$d.log3")"
evals=$(grep -c '"type":"eval"' "$d/metrics.jsonl"); trains=$(grep -c '"type":"train"' "$d/metrics.jsonl")
[ "$(step_logs "$d")" = "$(step_logs "$tmp/games-a")" ] && [ "$trains" = 6 ] && [ "$evals" = 2 ] \
  && ok "resume from step 3 of 6, then of the finished run: metrics.jsonl has each step once (6 train, 2 eval records)" \
  || bad "metrics.jsonl after two resumes: $trains train and $evals eval records; step logs $( [ "$(step_logs "$d")" = "$(step_logs "$tmp/games-a")" ] && echo equal || echo differ)"
# a torn last record in metrics.jsonl (the writer killed mid-line, or a full disk) is dropped
# by the resume's rewind with one warning, not kept for the next record to be glued onto
t="$tmp/torn"
"$bin" "${small[@]}" --max_steps 4 --stop_at_step 2 --out_dir "$t" > "$t.log" 2>&1 || bad "torn: first run: $(tail -1 "$t.log")"
truncate -s -40 "$t/metrics.jsonl"
"$bin" "${small[@]}" --max_steps 4 --resume latest --out_dir "$t" > "$t.log2" 2> "$t.err" \
  && grep -q "metrics.jsonl: its last record is incomplete" "$t.err" && ! grep -qv '^{.*}$' "$t/metrics.jsonl" \
  && [ "$(grep -o '"type":"[a-z]*","step":[0-9]*' "$t/metrics.jsonl" | tr '\n' ' ')" = \
       '"type":"eval","step":0 "type":"train","step":1 "type":"train","step":3 "type":"train","step":4 "type":"eval","step":4 ' ] \
  && ok "a torn last metrics record is dropped on resume (warned), every line a whole record" \
  || bad "torn metrics record: $(cat "$t.err"); $(grep -o '"type":"[a-z]*","step":[0-9]*' "$t/metrics.jsonl" | tr '\n' ' ')"
grep -q "^finetune: done: no step to train (resumed at step 6 of 6); val loss [0-9.]*$" "$d.log3" \
  && ok "resuming the finished run: the summary says no step was trained" \
  || bad "resuming the finished run: summary '$(grep '^finetune: done' "$d.log3")'"
[ "$(grep -c . "$d/samples.jsonl")" = 2 ] && ok "samples.jsonl holds the last run's 2 samples" \
  || bad "samples.jsonl has $(grep -c . "$d/samples.jsonl") lines after the resumes, want 2"
# a resume with other optimizer settings (an edited requeue line): one warning naming each
# change, and training goes on with this run's; a resume with the same ones says nothing
o="$tmp/optchange"
"$bin" "${small[@]}" --max_steps 4 --resume "$tmp/games-b/checkpoints/step_00000003" --learning_rate 1e-2 \
  --lr_schedule cosine --weight_decay 0.5 --out_dir "$o" > "$o.log" 2> "$o.err" \
  && grep -q "^finetune: warning: $tmp/games-b/checkpoints/step_00000003/trainer_state.json: this run changes the \
optimizer's settings: --lr_schedule cosine (the checkpoint's: linear), --learning_rate 0.01 (the checkpoint's: 0.003), \
--weight_decay 0.5 (the checkpoint's: 0.01); the resumed training uses this run's" "$o.err" \
  && [ "$(grep -c "optimizer's settings" "$o.err")" = 1 ] && ! grep -q "optimizer's settings" "$tmp/games-b.log2" \
  && ok "a resume with another lr, schedule and weight decay: one warning naming the three; the same settings: none" \
  || bad "optimizer settings changed on resume: $(cat "$o.err")"

# sampling flags: greedy (--sample_temperature 0) and top-k 1 at temperature 1 both take the
# most likely token (transformers' argmax / TopKLogitsWarper; tests/test_sample.c checks the
# distributions against transformers), so their samples are equal; without top-k, temperature
# 1 over the barely trained model's ~2000 ids would differ
g="$tmp/greedy"
"$bin" "${small[@]}" --max_steps 1 --sample_tokens 8 --sample_games 2 --sample_temperature 0 --out_dir "$g-a" > "$g-a.log" 2>&1 \
  && "$bin" "${small[@]}" --max_steps 1 --sample_tokens 8 --sample_games 2 --sample_temperature 1 --sample_top_k 1 \
       --out_dir "$g-b" > "$g-b.log" 2>&1 \
  && grep -q "^sample (validation game 1, 12 prompt tokens, greedy):" "$g-a.log" \
  && grep -q "^sample (validation game 1, 12 prompt tokens, temperature 1, top-k 1):" "$g-b.log" \
  && [ "$(grep -c . "$g-a/samples.jsonl")" = 2 ] && cmp -s "$g-a/samples.jsonl" "$g-b/samples.jsonl" \
  && ok "--sample_temperature 0 (greedy) and --sample_top_k 1 sample the same continuations" \
  || bad "greedy vs top-k 1: $(tail -1 "$g-a.log"); $(tail -1 "$g-b.log"); $(diff "$g-a/samples.jsonl" "$g-b/samples.jsonl" 2>&1 | head -3)"

# the validation loss falls over the 6 steps
a="$tmp/games-a"
v0=$(grep '"type":"eval","step":0' "$a/metrics.jsonl" | sed -E 's/.*"val_loss":([0-9.]+).*/\1/')
v6=$(grep '"type":"eval","step":6' "$a/metrics.jsonl" | sed -E 's/.*"val_loss":([0-9.]+).*/\1/')
awk -v a="$v0" -v b="$v6" 'BEGIN { exit !(b < a - 0.05) }' && ok "validation loss fell: $v0 -> $v6" || bad "validation loss did not fall: $v0 -> $v6"
# the closing summary: the steps, their target tokens and the val losses metrics.jsonl records
tok=$(grep '"type":"train"' "$a/metrics.jsonl" | sed -E 's/.*"tokens":([0-9]+),.*/\1/' | awk '{ s += $1 } END { print s }')
want=$(awk -v t="$tok" -v a="$v0" -v b="$v6" 'BEGIN { printf "trained steps 1-6 of 6: %d target tokens in .* val loss %.4f -> %.4f$", t, a, b }')
grep -qE "^finetune: done: $want" "$a.log" && ok "closing summary: $(grep '^finetune: done' "$a.log")" \
  || bad "closing summary '$(grep '^finetune: done' "$a.log")', want /$want/"
# --eval_only on a checkpoint: the weights of step 6, the loss the run logged after step 6
ev=$("$bin" "${small[@]}" --eval_only --resume "$a/checkpoints/step_00000006" --out_dir "$tmp/ev" 2>&1)
e6=$(sed -nE 's/^eval  step 6 \| val loss ([0-9.]+) .*/\1/p' <<<"$ev")
[ -n "$e6" ] && awk -v a="$e6" -v b="$v6" 'BEGIN { exit !(a == b) }' && ok "--eval_only --resume step 6: val loss $e6 = the run's" \
  || bad "--eval_only --resume step 6: '$e6' vs the run's $v6: $(tail -1 <<<"$ev")"
# bitwise (%a: metrics.jsonl's val_loss_exact, --eval_only's closing line), from the checkpoint
# (its fp32 weights straight into the working parameters) and from --model_dir = the run's step 0;
# what it allocates: the working parameters and the forward's buffers, no gradients or optimizer
exact() { grep "\"type\":\"eval\",\"step\":$2," "$1/metrics.jsonl" | sed -nE 's/.*"val_loss_exact":"([^"]+)".*/\1/p'; }
eval_exact() { sed -nE 's/^finetune: eval only: val loss exactly (.+)$/\1/p' <<<"$1"; }
x6=$(exact "$a" 6); ex6=$(eval_exact "$ev")
[ -n "$x6" ] && [ "$ex6" = "$x6" ] && ok "--eval_only --resume step 6: val loss bitwise the run's ($x6)" \
  || bad "--eval_only --resume step 6: exactly '$ex6', the run's '$x6'"
grep -qE "^finetune: peak bytes: params [1-9][0-9]* gathered 0 grads 0 optimizer 0 activations [1-9][0-9]* workspace [1-9][0-9]* host 0 " <<<"$ev" \
  && ok "--eval_only allocates no gradients or optimizer state: $(grep '^finetune: peak bytes' <<<"$ev")" \
  || bad "--eval_only's memory: $(grep '^finetune: peak bytes' <<<"$ev")"
ev0=$("$bin" "${small[@]}" --eval_only 2>&1); x0=$(exact "$a" 0); ex0=$(eval_exact "$ev0")
[ -n "$x0" ] && [ "$ex0" = "$x0" ] && ok "--eval_only of --model_dir: val loss bitwise the run's step 0 ($x0)" \
  || bad "--eval_only of --model_dir: exactly '$ex0', the run's step 0 '$x0': $(tail -1 <<<"$ev0")"
# an evaluation reads no training rows: another --seed, --pack or --total_batch_size (even one
# the batch does not divide) evaluates the same checkpoint (they were refused as 'incompatible')
ev=$("$bin" "${small[@]}" --eval_only --resume "$a/checkpoints/step_00000006" --seed 7 --pack --total_batch_size 6 \
     --out_dir "$tmp/ev2" 2>&1)
e6b=$(sed -nE 's/^eval  step 6 \| val loss ([0-9.]+) .*/\1/p' <<<"$ev")
[ -n "$e6b" ] && [ "$e6b" = "$e6" ] && ok "--eval_only --resume step 6 --seed 7 --pack --total_batch_size 6: val loss $e6b, the same" \
  || bad "--eval_only with another --seed/--pack/--total_batch_size: '$e6b' vs '$e6': $(tail -1 <<<"$ev")"

# ---------------------------------------------------------------- 2. SIGTERM
s="$tmp/sig"
"$bin" "${small[@]}" --max_steps 100000 --out_dir "$s" > "$s.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "^step    2/" "$s.log" 2>/dev/null && break; sleep 0.1; done
# a second job into the running job's --out_dir (a resubmission while the first still runs) is
# refused before it reads or writes anything there: both would write checkpoints/ and
# metrics.jsonl (its rewind replaced the file under the first job, whose records were lost)
expect_error "$s/.lock: --out_dir $s is in use by another finetune job (pid $pid on host " "${small[@]}" \
  --max_steps 3 --resume auto --out_dir "$s"
kill -TERM $pid; wait $pid; rc=$?
[ $rc -eq 0 ] && grep -q "signal received" "$s.log" && [ -f "$s/checkpoints/latest" ] \
  && ok "SIGTERM: checkpoint $(cat "$s/checkpoints/latest") saved, exit 0" || bad "SIGTERM: rc=$rc, log: $(tail -2 "$s.log")"
n=$(cat "$s/checkpoints/latest" 2>/dev/null | sed -E 's/step_0*//')
"$bin" "${small[@]}" --max_steps $((n + 2)) --resume latest --out_dir "$s" > "$s.log2" 2>&1 \
  && grep -q "^step *$((n + 2))/$((n + 2))" "$s.log2" && ok "resumed after SIGTERM and finished at step $((n + 2))" \
  || bad "resume after SIGTERM: $(tail -1 "$s.log2")"
ls -a "$s/checkpoints" | grep -q tmp && bad "temporary files left in checkpoints/" || ok "no temporary files left in checkpoints/"
[ ! -e "$s/.lock" ] && ok "the --out_dir lock is gone with its job" || bad "$s/.lock left behind"

# --out_dir removed (rm -rf) or replaced (rm -rf, then mkdir of the same path) under a running
# job: its records went into an unlinked metrics.jsonl and its next save recreated the path,
# and it trained on to the end saying nothing. It stops after the step that notices (checked
# once a step), exit 1, and leaves the path alone (the replacement's .lock, as a new job's, too)
gone=(--model_dir data/model --data_dir data/chess --seq_len 64 --batch_size_per_device 2 --total_batch_size 2
      --max_steps 400 --eval_every 0 --save_every 50)
out_dir_removed "out_dir gone" removed "$tmp/gone" "$bin" "${gone[@]}" --out_dir "$tmp/gone"
out_dir_removed "out_dir gone" replaced "$tmp/gone" "$bin" "${gone[@]}" --out_dir "$tmp/gone"
# only its lock file removed: the job's lock no longer kept another out (one started then created
# and locked a new .lock and wrote beside it); only metrics.jsonl removed: its records went into
# the unlinked file. Either stops the job the same way, with one line naming the file
for f in .lock metrics.jsonl; do
  out_dir_removed "out_dir's $f gone" "$f" "$tmp/gone" "$bin" "${gone[@]}" --out_dir "$tmp/gone"
done

# SIGTERM after the last step (here during sampling; also the final evaluation or the export):
# the last checkpoint is saved, so the job stops before the next sampled game (it used to
# sample every game, minutes on a large model, and be killed at the time limit), exit 0;
# --resume latest redoes the final evaluation (logged once) and all the samples
s="$tmp/sigsample"
"$bin" "${small[@]}" --max_steps 2 --sample_tokens 20 --sample_games 40 --out_dir "$s" > "$s.log" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do grep -q "prompt:" "$s.log" 2>/dev/null && break; sleep 0.05; done
kill -TERM $pid; wait $pid; rc=$?
ns=$(grep -c . "$s/samples.jsonl" 2>/dev/null)
[ $rc -eq 0 ] && grep -q "^finetune: stopping after $ns of 40 sampled games (signal received)" "$s.log" && [ "$ns" -lt 40 ] \
  && [ -f "$s/final/model.safetensors" ] && ok "SIGTERM while sampling: stopped after $ns of 40 games, exit 0, export complete" \
  || bad "SIGTERM while sampling: rc=$rc, $ns samples, log: $(tail -1 "$s.log")"
"$bin" "${small[@]}" --max_steps 2 --sample_tokens 20 --sample_games 40 --resume latest --out_dir "$s" > "$s.log2" 2>&1 \
  && [ "$(grep -c . "$s/samples.jsonl")" = 40 ] && [ "$(grep -c '"type":"eval"' "$s/metrics.jsonl")" = 2 ] \
  && ok "--resume latest after it: 40 samples, the final evaluation logged once" \
  || bad "--resume latest after SIGTERM while sampling: $(tail -1 "$s.log2")"

# SIGTERM (a scheduler's warning before its time limit) during the evaluation at step 0 of a
# job that evaluates every step: step 1 ends, its evaluation is skipped (the margin is for the
# checkpoint), the checkpoint of step 1 is saved, exit 0; metrics.jsonl has step 0's
# evaluation only
s="$tmp/termeval"
"$bin" --seq_len 256 --batch_size_per_device 8 --total_batch_size 16 --max_steps 100 --eval_every 1 --out_dir "$s" \
  > "$s.log" 2> "$s.err" &
pid=$!
for _ in $(seq 1 1200); do grep -q "^finetune: MFU denominator" "$s.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.1; kill -TERM $pid; wait $pid; rc=$?
[ $rc -eq 0 ] && grep -q "^finetune: skipping the evaluation at step 1 (signal received: the checkpoint first)" "$s.log" \
  && [ "$(grep -c '"type":"eval"' "$s/metrics.jsonl")" = 1 ] && [ "$(cat "$s/checkpoints/latest" 2>/dev/null)" = step_00000001 ] \
  && ok "SIGTERM in the evaluation at step 0, --eval_every 1: step 1's evaluation skipped, its checkpoint saved, exit 0" \
  || bad "SIGTERM with an evaluation due: rc=$rc, $(grep -c '"type":"eval"' "$s/metrics.jsonl" 2>/dev/null) evals, latest $(cat "$s/checkpoints/latest" 2>/dev/null), log: $(tail -2 "$s.log")"

# Ctrl-C twice: the second SIGINT ends the process at once (status 130) with one line (the
# first one only stops at the end of the step). Both arrive during the evaluation at step 0
# (1.5 s over every validation game), before the first step's end checks for a stop (finetune
# line-buffers stdout: the line that precedes the evaluation is seen when it is printed)
s="$tmp/sigint2"
"$bin" --seq_len 256 --batch_size_per_device 8 --total_batch_size 16 --max_steps 100000 --out_dir "$s" \
  > "$s.log" 2> "$s.err" &
pid=$!
for _ in $(seq 1 1200); do grep -q "^finetune: MFU denominator" "$s.log" 2>/dev/null && break; sleep 0.05; done
sleep 0.1; kill -INT $pid; sleep 0.2; kill -INT $pid; wait $pid; rc=$?
[ $rc -eq 130 ] && [ "$(grep -c . "$s.err")" = 1 ] && grep -q "^finetune: SIGINT again: exiting now without saving" "$s.err" \
  && ok "SIGINT twice: exit 130 at once: $(grep . "$s.err")" || bad "SIGINT twice: rc=$rc, stderr: $(cat "$s.err")"

# a save or an export killed before its rename (kill -9) leaves its temporary directory, a
# whole checkpoint's bytes: the next save and the next export remove it (any pid)
k="$tmp/stale"; mkdir -p "$k/checkpoints/.tmp.step_00000002.999999" "$k/final.tmp.999999" "$k/final_merged.tmp.1"
touch "$k/checkpoints/.tmp.step_00000002.999999/model.safetensors" "$k/final.tmp.999999/model.safetensors"
"$bin" "${small[@]}" --max_steps 1 --out_dir "$k" > "$k.log" 2>&1 || bad "stale temporaries: run failed: $(tail -1 "$k.log")"
[ ! -e "$k/checkpoints/.tmp.step_00000002.999999" ] && [ ! -e "$k/final.tmp.999999" ] && [ -d "$k/final_merged.tmp.1" ] \
  && ok "a killed save's and export's temporary directories are removed by the next save and export" \
  || bad "stale temporaries left: $(ls -a "$k" "$k/checkpoints" | tr '\n' ' ')"

# --save_total_limit 2: every save keeps the newest two checkpoints (a 7B checkpoint is 84 GB;
# without it every --save_every checkpoint stays), the removed ones leave no temporary behind
r="$tmp/retain"
"$bin" "${small[@]}" --max_steps 5 --save_every 1 --save_total_limit 2 --out_dir "$r" > "$r.log" 2>&1 \
  && [ "$(ls -A "$r/checkpoints" | tr '\n' ' ')" = "latest step_00000004 step_00000005 " ] \
  && ok "--save_total_limit 2 over 5 saves: checkpoints/ holds latest, step_00000004, step_00000005" \
  || bad "--save_total_limit 2: $(tail -1 "$r.log"); checkpoints: $(ls -A "$r/checkpoints" | tr '\n' ' ')"

# a fresh run (no --resume) into an --out_dir holding an earlier run's checkpoints is refused
# before it writes anything (its steps would mix with the old ones, and a later --resume auto
# would pick up the old run); --overwrite_out_dir starts over, removing the old checkpoints
before_k=$(cd "$k" && find . -type f | sort | xargs md5sum | md5sum)
expect_error "$k/checkpoints/latest: --out_dir holds an earlier run's checkpoints: --resume latest continues it, \
--overwrite_out_dir starts over" "${small[@]}" --max_steps 2 --out_dir "$k"
[ "$(cd "$k" && find . -type f | sort | xargs md5sum | md5sum)" = "$before_k" ] \
  && ok "the refused fresh run left the earlier run's files as they were" || bad "the refused fresh run changed $k"
expect_error "flags --overwrite_out_dir and --resume latest contradict each other" "${small[@]}" --max_steps 2 \
  --overwrite_out_dir --resume latest --out_dir "$k"
# the same for an earlier run's export without its checkpoints (deleted to free the disk) and
# for a file named final: a fresh run would have replaced them without a word
e="$tmp/exported"; mkdir -p "$e"; cp -r "$k/final" "$e/final"
expect_error "$e/final: --out_dir holds an earlier run's export: --overwrite_out_dir starts over" "${small[@]}" \
  --max_steps 2 --out_dir "$e"
# --resume auto with no checkpoint starts fresh: the same refusal (a requeued job would
# replace the finished run's export)
expect_error "$e/final: --out_dir holds an earlier run's export" "${small[@]}" --max_steps 2 --resume auto --out_dir "$e"
mkdir -p "$e.2"; echo notes > "$e.2/final"
expect_error "$e.2/final: --out_dir holds an earlier run's export" "${small[@]}" --max_steps 2 --out_dir "$e.2"
[ "$(cat "$e.2/final")" = notes ] && [ ! -e "$e.2/metrics.jsonl" ] && ok "the refused run left the file 'final' and wrote nothing" \
  || bad "the refused run into $e.2 changed it: $(ls "$e.2")"
mkdir -p "$k/checkpoints/step_00000099" "$k/final_merged"
"$bin" "${small[@]}" --max_steps 2 --overwrite_out_dir --out_dir "$k" > "$k.log" 2>&1 \
  && [ "$(ls "$k/checkpoints")" = "$(printf 'latest\nstep_00000002')" ] && [ ! -e "$k/final_merged" ] \
  && [ "$(grep -c '"type":"train"' "$k/metrics.jsonl")" = 2 ] \
  && ok "--overwrite_out_dir: the earlier run's checkpoints and exports removed, the new run's alone remain" \
  || bad "--overwrite_out_dir: $(tail -1 "$k.log"); checkpoints: $(ls "$k/checkpoints" | tr '\n' ' ')"

# ---------------------------------------------------------------- 3. the export
f="$tmp/games-a/final"
[ -f "$f/config.json" ] && [ -f "$f/model.safetensors" ] && [ -f "$f/tokenizer.json" ] && [ -f "$f/tokenizer_config.json" ] \
  && ok "export has config.json, model.safetensors, tokenizer files" || bad "export layout: $(ls "$f")"
grep -q '"dtype": "bfloat16"' "$f/config.json" && ok "export config dtype bfloat16" || bad "export config dtype"
head -c 20000 "$f/model.safetensors" | grep -q '"dtype":"BF16"' && ! head -c 20000 "$f/model.safetensors" | grep -q '"F32"' \
  && ok "export tensors are BF16" || bad "export tensors not BF16"
ours=$("$bin" --eval_only --model_dir "$f" --seq_len 64 --max_eval_docs 16 2>&1 | sed -nE 's/.*val loss ([0-9.]+).*/\1/p')
trained=$(grep '"type":"eval","step":6' "$tmp/games-a/metrics.jsonl" | sed -E 's/.*"val_loss":([0-9.]+).*/\1/')
# bf16 rounding of the weights moves the loss by ~1e-3 relative at most here
awk -v a="$ours" -v b="$trained" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d < 0.01 * b) }' \
  && ok "our loss on the bf16 export $ours ~ the fp32 trained model's $trained" || bad "export loss $ours vs $trained"
py="${FT_ORACLE_PYTHON:-/opt/oracle-venv/bin/python}"
if [ -x "$py" ] && "$py" -c "import transformers, torch" 2>/dev/null; then
  out=$(HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error "$py" tests/oracle/check_export.py "$f" data/chess/val_000.bin 64 16 "$ours" 2>&1) \
    && ok "transformers loads the export: $out" || bad "transformers check: $out"
elif [ -n "${FT_ORACLE_PYTHON:-}" ]; then
  bad "FT_ORACLE_PYTHON=$FT_ORACLE_PYTHON cannot import torch and transformers"
else
  skip_or_fail "transformers check of the export (no Python with transformers; set FT_ORACLE_PYTHON)"
fi

# ---------------------------------------------------------------- 4. bad input
expect_error "is not a multiple of --batch_size_per_device 3" "${small[@]}" --batch_size_per_device 3 --out_dir "$tmp/x"
expect_error "/proc/nonexistent" "${small[@]}" --max_steps 1 --out_dir /proc/nonexistent/out
# paths of the wrong kind, refused up front by what they are (a file as --out_dir used to fail
# after setup at metrics.jsonl; a missing --data_dir said "no val shards")
touch "$tmp/a-file"
expect_error "$tmp/a-file: exists and is not a directory" "${small[@]}" --max_steps 1 --out_dir "$tmp/a-file"
expect_error "$tmp/none: cannot open the data directory: No such file or directory" "${small[@]}" --eval_only --data_dir "$tmp/none"
expect_error "$tmp/a-file: not a directory (the data directory" "${small[@]}" --eval_only --data_dir "$tmp/a-file"
expect_error "--resume $tmp/games-a/checkpoints/latest: not a checkpoint directory" "${small[@]}" --max_steps 6 \
  --resume "$tmp/games-a/checkpoints/latest" --out_dir "$tmp/x"
expect_error "--resume $tmp/none: no such checkpoint directory" "${small[@]}" --eval_only --resume "$tmp/none"
expect_error "--resume latest" "${small[@]}" --max_steps 1 --resume latest --out_dir "$tmp/empty"
# shards with nothing to learn from (a lone <s>, an empty game, <s></s>): refused at load by
# name, not "val loss nan", an eval error at the first evaluation, or steps on padding alone
# empty_shard FILE DOCS: write FILE with the documents DOCS (a Python list; b, e: bos, eos; 7: a move)
empty_shard() {
  python3 -c 'import sys; sys.path.insert(0, "scripts"); import token_shard as t
h = t.read_shard("data/chess/val_000.bin")[0]
b, e = h["bos_id"], h["eos_id"]
t.write_shard(sys.argv[1], eval(sys.argv[2], {"b": b, "e": e}), h["vocab_size"], b, e)' "$1" "$2" || bad "could not write $1"
}
mkdir -p "$tmp/emptyval" "$tmp/emptytrain"; cp data/chess/train_*.bin "$tmp/emptyval/"
empty_shard "$tmp/emptyval/val_000.bin" '[[b], [], [b]]'
expect_error "$tmp/emptyval/val_000.bin: no document has a token to predict (each of its 3 has fewer than 2 tokens or \
only bos/eos)" "${small[@]}" --eval_only --data_dir "$tmp/emptyval"
empty_shard "$tmp/emptyval/val_000.bin" '[[b, e], [e], [b, e]]'
expect_error "$tmp/emptyval/val_000.bin: no document has a token to predict" "${small[@]}" --eval_only --data_dir "$tmp/emptyval"
cp data/chess/train_000.bin data/chess/val_000.bin "$tmp/emptytrain/"
empty_shard "$tmp/emptytrain/train_001.bin" '[[], [b, e], [b]]'
expect_error "$tmp/emptytrain/train_001.bin: no document has a token to predict" "${small[@]}" --max_steps 1 \
  --data_dir "$tmp/emptytrain" --out_dir "$tmp/x"
expect_error "$tmp/emptytrain/train_001.bin: every document is empty (each of its 3 holds no token but bos/eos)" \
  "${small[@]}" --pack --max_steps 1 --data_dir "$tmp/emptytrain" --out_dir "$tmp/x"
# too little to train on: 3 games, fewer rows than one --total_batch_size of 8; with --pack their
# 9 tokens, fewer than one row of 64. Refused at load, before --out_dir is made
mkdir -p "$tmp/fewrows"; cp data/chess/val_000.bin "$tmp/fewrows/"
empty_shard "$tmp/fewrows/train_000.bin" '[[b, 7, e]] * 3'
expect_error "$tmp/fewrows: 3 training rows, fewer than one --total_batch_size of 8" "${small[@]}" --max_steps 1 \
  --data_dir "$tmp/fewrows" --out_dir "$tmp/fewrows-out"
expect_error "$tmp/fewrows: the train shards are too small for one row of 64 tokens" "${small[@]}" --pack --max_steps 1 \
  --data_dir "$tmp/fewrows" --out_dir "$tmp/fewrows-out"
[ ! -e "$tmp/fewrows-out" ] && ok "the runs refused for too little training data created nothing" || bad "$tmp/fewrows-out was created"
# games of fewer than 2 tokens have no target: no row (the first --max_eval_docs games
# evaluated used to be all empty here, an error; a step of only such games stopped training,
# and its resume stopped at the same step again); the summary says how many were left out
empty_shard "$tmp/emptyval/val_000.bin" '[[b], [], [b, 7, e]]'
"$bin" "${small[@]}" --eval_only --max_eval_docs 2 --data_dir "$tmp/emptyval" > "$tmp/emptyval.log" 2>&1 \
  && grep -q "^finetune: data .*, 1 validation games$" "$tmp/emptyval.log" && grep -q "^eval .*loss [0-9]" "$tmp/emptyval.log" \
  && ok "validation games without a target are no rows: the one game with a move is evaluated" \
  || bad "validation games without a target: $(tail -2 "$tmp/emptyval.log")"
# sampling takes its prompts from validation games that hold a token (an empty game gave a
# sequence of length 0 and failed the run after its export)
"$bin" "${small[@]}" --max_steps 1 --max_eval_docs 2 --sample_tokens 4 --sample_games 2 --data_dir "$tmp/emptyval" \
  --out_dir "$tmp/emptyval-s" > "$tmp/emptyval-s.log" 2>&1 \
  && [ "$(grep -o '"game":[0-9]*' "$tmp/emptyval-s/samples.jsonl" | tr '\n' ' ')" = '"game":0 "game":2 ' ] \
  && ok "--sample_games 2 over validation games [b], [], [b 7 e]: games 0 and 2 continued" \
  || bad "sampling past an empty validation game: $(tail -1 "$tmp/emptyval-s.log")"
expect_error "flag --sample_games: 3 exceeds the 2 validation games that hold a token" "${small[@]}" --max_steps 1 \
  --sample_tokens 4 --sample_games 3 --data_dir "$tmp/emptyval" --out_dir "$tmp/emptyval-s3"
empty_shard "$tmp/emptytrain/train_001.bin" '[[b]] * 7 + [[b, 7, e]] + [[e]] * 8'
"$bin" "${small[@]}" --total_batch_size 4 --batch_size_per_device 4 --max_steps 3 --max_eval_docs 4 \
  --data_dir "$tmp/emptytrain" --out_dir "$tmp/shortgames" > "$tmp/shortgames.log" 2>&1 \
  && grep -q "^finetune: note: 15 training game(s) of fewer than 2 tokens have no target and are left out$" "$tmp/shortgames.log" \
  && ok "15 one-token training games are left out, said once; training runs" \
  || bad "one-token training games: $(tail -2 "$tmp/shortgames.log")"
# auto starts fresh only when nothing was saved: a latest pointer to a missing checkpoint is an error
mkdir -p "$tmp/lost/checkpoints"; echo step_00000009 > "$tmp/lost/checkpoints/latest"
expect_error "--resume auto: $tmp/lost/checkpoints/latest names step_00000009, which is not a checkpoint directory (No \
such file or directory); --resume DIR starts from another checkpoint" "${small[@]}" --max_steps 1 --resume auto --out_dir "$tmp/lost"
# a latest pointer that is not one line naming a directory: refused by name, never cut or read in part
bad_latest() {   # bad_latest WHY PRINTF_FORMAT [ARGS]: latest holds printf's output
  printf "${@:2}" > "$tmp/lost/checkpoints/latest"
  expect_error "$tmp/lost/checkpoints/latest: does not name a checkpoint directory ($1)" "${small[@]}" --max_steps 1 \
    --resume auto --out_dir "$tmp/lost"
}
bad_latest "the name is longer than 255 bytes" 'step_%0300d\n' 9
bad_latest "more than one line" 'step_00000009\nstep_00000003\n'
bad_latest "empty" ''
bad_latest "a NUL byte in the name" 'step_\000x\n'
bad_latest "'..' is not a plain directory name" '..\n'
expect_error "incompatible checkpoint: it was trained with --seq_len 64, this run has 32" \
  "${small[@]}" --seq_len 32 --max_steps 6 --resume latest --out_dir "$tmp/games-a"
expect_error "incompatible checkpoint: it was trained with --total_batch_size 8" \
  "${small[@]}" --total_batch_size 16 --max_steps 6 --resume latest --out_dir "$tmp/games-a"
# --seed and --pack set the data order too: another value is refused, as --seq_len is; and a
# checkpoint past this run's --max_steps (a shortened requeue line) is refused, not trained on
before_a=$(cd "$tmp/games-a" && find . -type f | sort | xargs md5sum | md5sum)
expect_error "$tmp/games-a/checkpoints/step_00000006: incompatible checkpoint: it was trained with --seed 42, this run has 7" \
  "${small[@]}" --seed 7 --max_steps 6 --resume latest --out_dir "$tmp/games-a"
expect_error "$tmp/games-a/checkpoints/step_00000006: incompatible checkpoint: it was trained with --pack 0, this run has 1" \
  "${small[@]}" --pack --max_steps 6 --resume latest --out_dir "$tmp/games-a"
expect_error "$tmp/games-a/checkpoints/step_00000006: checkpoint is at step 6, past this run's 4 total steps" \
  "${small[@]}" --max_steps 4 --resume latest --out_dir "$tmp/games-a"
[ "$(cd "$tmp/games-a" && find . -type f | sort | xargs md5sum | md5sum)" = "$before_a" ] \
  && ok "the refused resumes (--seed, --pack, past --max_steps) left --out_dir as it was" || bad "a refused resume changed $tmp/games-a"
mkdir -p "$tmp/m2"; cp data/model/* "$tmp/m2/"; sed -i 's/"intermediate_size": 352/"intermediate_size": 360/' "$tmp/m2/config.json"
expect_error "(another model: --model_dir's config.json differs)" --eval_only --model_dir "$tmp/m2" "${small[@]}" --resume "$tmp/games-a/checkpoints/step_00000006"
# a corrupt checkpoint (copies of step 6, one defect each): refused by name, not resumed
ck="$tmp/games-a/checkpoints/step_00000006"
bad_ck() { rm -rf "$tmp/bad-ck"; cp -r "$ck" "$tmp/bad-ck"; }
# an int field past INT_MAX, which used to wrap to this run's value (2^32 + 64 -> 64)
bad_ck; sed -i 's/"seq_len": 64/"seq_len": 4294967360/' "$tmp/bad-ck/trainer_state.json"
expect_error "field 'seq_len' = 4294967360 is too large" --eval_only "${small[@]}" --resume "$tmp/bad-ck"
# trainer_state.json damaged otherwise: cut short (not JSON), another format, a negative
# integer or number, a non-finite number (JSON has no NaN or inf: 1e999 overflows the parser,
# and a string "nan" is not a number)
bad_state() {   # bad_state WANT SED_SCRIPT: the bad copy's trainer_state.json edited by SED_SCRIPT
  bad_ck; sed -i "$2" "$tmp/bad-ck/trainer_state.json"
  expect_error "$tmp/bad-ck/trainer_state.json: $1" --eval_only "${small[@]}" --resume "$tmp/bad-ck"
}
bad_state "not a finetune checkpoint: " '$d'
bad_state "field 'format' is not \"finetune-checkpoint-v1\"" 's/finetune-checkpoint-v1/finetune-checkpoint-v2/'
bad_state "field 'step' is negative" 's/"step": 6,/"step": -6,/'
bad_state "field 'learning_rate' is not a finite number >= 0" 's/"learning_rate": [0-9.e-]*/"learning_rate": -0.003/'
bad_state "not a finetune checkpoint: real number overflow near '1e999'" 's/"beta2": [0-9.e-]*/"beta2": 1e999/'
bad_state "field 'beta2' is not a finite number >= 0" 's/"beta2": [0-9.e-]*/"beta2": "nan"/'
# a moment of another shape with the same size ([352, 128] for down_proj's [128, 352])
bad_ck; LC_ALL=C sed -i 's/\("exp_avg.model.layers.0.mlp.down_proj.weight":{"dtype":"F32","shape":\)\[128,352\]/\1[352,128]/' \
  "$tmp/bad-ck/optimizer.safetensors"
expect_error "tensor 'exp_avg.model.layers.0.mlp.down_proj.weight' missing, not F32 or BF16, or of the wrong shape" \
  --eval_only "${small[@]}" --resume "$tmp/bad-ck"
# the moments' header is checked with the weights' before anything is loaded: with both a NaN
# weight (found only when the data is read) and that mis-shaped moment, the moment is named
bad_ck; LC_ALL=C sed -i 's/\("exp_avg.model.layers.0.mlp.down_proj.weight":{"dtype":"F32","shape":\)\[128,352\]/\1[352,128]/' \
  "$tmp/bad-ck/optimizer.safetensors"
printf '\x00\x00\xc0\x7f' | dd of="$tmp/bad-ck/model.safetensors" bs=1 \
  seek=$((8 + $(od -An -t u8 -N8 "$tmp/bad-ck/model.safetensors" | tr -d ' '))) conv=notrunc status=none
expect_error "tensor 'exp_avg.model.layers.0.mlp.down_proj.weight' missing, not F32 or BF16, or of the wrong shape" \
  --eval_only "${small[@]}" --resume "$tmp/bad-ck"
# a tensor the moments file should not hold: refused by name, as one in the weights is
opt_add_tensor() {   # opt_add_tensor NAME [SUM]: one more F32 [1] tensor (zero) at the end of the bad copy's
                     # optimizer.safetensors, with its checksum recorded (SUM 1) or not (SUM 0)
  python3 - "$tmp/bad-ck/optimizer.safetensors" "$1" "${2:-1}" <<'PY' || bad "could not add tensor $1 to optimizer.safetensors"
import json, struct, sys
p, name, with_sum = sys.argv[1:4]
b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), b[8 + n:]
h[name] = {"dtype": "F32", "shape": [1], "data_offsets": [len(data), len(data) + 4]}
if with_sum == "1": h["__metadata__"]["finetune.checksum." + name] = "485381fad106fc3b"   # ft_hash64 of 4 zero bytes
hb = json.dumps(h).encode()
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + data + bytes(4))
PY
}
for extra in exp_avg.model.layers.99.mlp.up_proj.weight exp_avg_sq.lm_head.bias model.norm.weight; do
  bad_ck; opt_add_tensor "$extra"
  expect_error "optimizer.safetensors: unexpected tensor '$extra'" --eval_only "${small[@]}" --resume "$tmp/bad-ck"
done
# one added without its checksum (the writer records one per tensor: the file was edited since) is
# refused as that when the file is opened, before its names are checked
bad_ck; opt_add_tensor exp_avg.model.layers.99.mlp.up_proj.weight 0
expect_error "$tmp/bad-ck/optimizer.safetensors: tensor 'exp_avg.model.layers.99.mlp.up_proj.weight' has no checksum \
though the file records finetune checksums (edited after finetune wrote it?)" --eval_only "${small[@]}" --resume "$tmp/bad-ck"
# a NaN first moment, a negative second moment (the data area: every exp_avg, then every exp_avg_sq),
# in a checkpoint without checksums (an older build's; with them the checksum names the damage first):
# refused by a resume that trains; --eval_only reads no moments (it holds none), so it evaluates
opt_data() { echo $((8 + $(od -An -t u8 -N8 "$tmp/bad-ck/optimizer.safetensors" | tr -d ' '))); }
bad_ck; strip_checksums "$tmp/bad-ck/optimizer.safetensors"; printf '\x00\x00\xc0\x7f' | dd of="$tmp/bad-ck/optimizer.safetensors" bs=1 seek="$(opt_data)" conv=notrunc status=none
expect_error "optimizer.safetensors: tensor 'exp_avg.model.layers.0.input_layernorm.weight': element 0 is nan" "${small[@]}" \
  --max_steps 6 --resume "$tmp/bad-ck" --out_dir "$tmp/bad-out"
ev=$("$bin" --eval_only "${small[@]}" --resume "$tmp/bad-ck" 2>&1) && [ "$(eval_exact "$ev")" = "$x6" ] \
  && ok "--eval_only of a checkpoint with a NaN moment: val loss $x6, the run's (moments not read)" || bad "--eval_only with a NaN moment: $(tail -1 <<<"$ev")"
bad_ck; strip_checksums "$tmp/bad-ck/optimizer.safetensors"; d=$(opt_data); half=$((($(stat -c %s "$tmp/bad-ck/optimizer.safetensors") - d) / 2))
printf '\x00\x00\x80\xbf' | dd of="$tmp/bad-ck/optimizer.safetensors" bs=1 seek=$((d + half)) conv=notrunc status=none
expect_error "tensor 'exp_avg_sq.model.layers.0.input_layernorm.weight': element 0 is -1 (a mean square must be >= 0)" "${small[@]}" \
  --max_steps 6 --resume "$tmp/bad-ck" --out_dir "$tmp/bad-out"
# one bit flipped in a weight or a moment (a finite value stays finite: before the checksums this
# resumed silently on damaged values): --resume latest names the file and the tensor, exit 1,
# nothing in --out_dir written or changed
fl="$tmp/flipped"
for f in model optimizer; do
  rm -rf "$fl"; cp -r "$tmp/games-b" "$fl"
  name=$(flip_bit "$fl/checkpoints/step_00000006/$f.safetensors")
  before=$(cd "$fl" && find . -type f | sort | xargs md5sum | md5sum)
  expect_error "$fl/checkpoints/step_00000006/$f.safetensors: tensor '$name': checksum mismatch (the file is corrupted)" \
    "${small[@]}" --max_steps 6 --resume latest --out_dir "$fl"
  [ "$(cd "$fl" && find . -type f | sort | xargs md5sum | md5sum)" = "$before" ] \
    && ok "the refused resume ($f.safetensors damaged) left --out_dir as it was" || bad "the refused resume changed $fl"
done
# a config.json that disagrees with its weights fails on the checkpoint's header, before the
# model it describes is allocated (vocab 4M: gigabytes; here capped at 4 GB of address space)
# (one thread: per-thread BLAS buffers on a many-core machine must not eat into the cap; not
# under ASan, whose shadow memory alone reserves terabytes of address space)
mkdir -p "$tmp/m3"; cp data/model/* "$tmp/m3/"; sed -i 's/"vocab_size": 2048/"vocab_size": 4194304/' "$tmp/m3/config.json"
err=$( ([ -n "${FT_SANITIZED:-}" ] || ulimit -v 4000000; export OMP_NUM_THREADS=1; "$bin" "${small[@]}" --max_steps 1 --model_dir "$tmp/m3" --out_dir "$tmp/x3" 2>&1 >/dev/null) ); rc=$?
[ $rc -ne 0 ] && [[ $err == "finetune: error: $tmp/m3/model.safetensors: tensor 'model.embed_tokens.weight': shape [2048, 128], config.json implies [4194304, 128]" ]] \
  && [ ! -e "$tmp/x3" ] && ok "config.json vocab 4194304 vs its weights -> $err" || bad "config.json vocab vs weights: rc=$rc, $err"
expect_error "exceeds the model's max_position_embeddings 512" "${small[@]}" --seq_len 1000
# resuming on other training shards: one warning naming --data_dir, and the run goes on (a
# changed dataset can be meant); the same shards copied elsewhere: no warning
mkdir -p "$tmp/data-less" && cp data/chess/val_000.bin data/chess/train_000.bin data/chess/train_001.bin "$tmp/data-less/"
cp -r data/chess "$tmp/data-same"
"$bin" "${small[@]}" --max_steps 3 --save_every 2 --out_dir "$tmp/dfp" > /dev/null 2>&1 || bad "data fingerprint: the first run failed"
for d in data-less data-same; do
  "$bin" "${small[@]}" --max_steps 3 --data_dir "$tmp/$d" --resume "$tmp/dfp/checkpoints/step_00000002" \
    --out_dir "$tmp/dfp-$d" > "$tmp/dfp-$d.out" 2> "$tmp/dfp-$d.err"; echo $? > "$tmp/dfp-$d.rc"
done
[ "$(cat "$tmp/dfp-data-less.rc")" = 0 ] && grep -q "^finetune: warning: $tmp/dfp/checkpoints/step_00000002/trainer_state.json: \
the training shards of --data_dir $tmp/data-less are not the ones this checkpoint was trained on" "$tmp/dfp-data-less.err" \
  && ok "resume on other training shards: a warning naming --data_dir, the run goes on" \
  || bad "resume on other training shards: rc $(cat "$tmp/dfp-data-less.rc"), stderr: $(head -2 "$tmp/dfp-data-less.err")"
[ "$(cat "$tmp/dfp-data-same.rc")" = 0 ] && ! grep -q warning "$tmp/dfp-data-same.err" \
  && grep -q '"data_fingerprint": "[0-9a-f]\{16\}"' "$tmp/dfp/checkpoints/step_00000002/trainer_state.json" \
  && ok "resume on the same shards in another directory: no warning; trainer_state.json records data_fingerprint" \
  || bad "resume on the same shards: rc $(cat "$tmp/dfp-data-same.rc"), stderr: $(head -2 "$tmp/dfp-data-same.err")"
# resuming with another total of steps: one warning (the schedule is recomputed), the run goes on
"$bin" "${small[@]}" --max_steps 5 --resume "$tmp/dfp/checkpoints/step_00000002" --out_dir "$tmp/dfp-longer" \
  > "$tmp/dfp-longer.out" 2> "$tmp/dfp-longer.err"; rc=$?
[ $rc = 0 ] && [ "$(grep -c . "$tmp/dfp-longer.err")" = 1 ] && grep -q "^finetune: warning: .*step_00000002/trainer_state.json: \
the checkpoint's run had 3 steps in all, this one has 5: the learning-rate schedule is recomputed over 5 steps, so the rate \
changes at step 2" "$tmp/dfp-longer.err" && grep -q "^step *5/5" "$tmp/dfp-longer.out" \
  && ok "resume over another number of steps: one warning (schedule recomputed), trains to the new total" \
  || bad "resume with --max_steps 5: rc $rc, stderr: $(head -2 "$tmp/dfp-longer.err")"
# sampling past the model's positions: refused up front (it was capped at 500 without a word)
expect_error "flag --sample_tokens: 501 tokens after the 12-token prompt exceed the model's max_position_embeddings 512 \
(at most 500)" "${small[@]}" --max_steps 1 --sample_tokens 501 --out_dir "$tmp/sample-cap"
[ ! -e "$tmp/sample-cap" ] && ok "the refused --sample_tokens run created nothing" || bad "$tmp/sample-cap was created"
# --sample_games without --sample_tokens sampled nothing without a word: refused
expect_error "flag --sample_games needs --sample_tokens" "${small[@]}" --max_steps 1 --sample_games 4 --out_dir "$tmp/sample-games"
for f in "--sample_temperature 0" "--sample_top_k 50" "--sample_top_p 0.9"; do
  expect_error "flag ${f% *} needs --sample_tokens" "${small[@]}" --max_steps 1 $f --out_dir "$tmp/sample-games"
done
expect_error "flag --sample_tokens: --eval_only writes nothing, samples neither" --eval_only "${small[@]}" --sample_tokens 8
[ ! -e "$tmp/sample-games" ] && ok "the refused --sample_games run created nothing" || bad "$tmp/sample-games was created"
# sampling with a --model_dir without tokenizer.json (a checkpoint brought without one): the
# flag and the file named, before anything is written
mkdir -p "$tmp/notok" && cp data/model/config.json data/model/model.safetensors "$tmp/notok/"
expect_error "flag --sample_tokens: $tmp/notok/tokenizer.json: No such file or directory (samples are decoded with \
--model_dir's tokenizer.json)" "${small[@]}" --model_dir "$tmp/notok" --max_steps 1 --sample_tokens 4 --out_dir "$tmp/notok-out"
[ ! -e "$tmp/notok-out" ] && ok "the run refused for a missing tokenizer.json created nothing" || bad "$tmp/notok-out was created"
# without --sample_tokens it trains, and says once that there is no tokenizer to check or export
"$bin" "${small[@]}" --model_dir "$tmp/notok" --max_steps 1 --max_eval_docs 2 --out_dir "$tmp/notok-run" > "$tmp/notok.log" 2>&1 \
  && [ "$(grep -c "^finetune: note: $tmp/notok: no tokenizer.json (No such file or directory): the shards' tokenizer cannot \
be checked against the model's, and the exports will hold no tokenizer.json$" "$tmp/notok.log")" = 1 ] \
  && [ -f "$tmp/notok-run/final/config.json" ] \
  && ok "a --model_dir without tokenizer.json trains with one note" || bad "no tokenizer.json: $(grep -i tokenizer "$tmp/notok.log")"
# a continuation longer than 8 KiB of text: written whole (it was cut at 8,191 bytes without a
# word, mid-piece). Every piece of this tokenizer ends in 100 bytes "X...X|", so 120 sampled
# tokens are ~12 KB and a whole continuation ends with "|"
mkdir -p "$tmp/longtok" && cp data/model/* "$tmp/longtok/"
python3 - "$tmp/longtok/tokenizer.json" <<'PY' || bad "could not write the long-piece tokenizer"
import json, sys
t = json.load(open(sys.argv[1]))
special = {a["content"] for a in t.get("added_tokens", [])}
t["model"]["vocab"] = {(k if k in special else k + "X" * 99 + "|"): i for k, i in t["model"]["vocab"].items()}
json.dump(t, open(sys.argv[1], "w"))
PY
"$bin" "${small[@]}" --max_steps 1 --model_dir "$tmp/longtok" --sample_tokens 120 --out_dir "$tmp/longtok-out" \
  > "$tmp/longtok.log" 2>&1 || bad "sampling with long pieces failed: $(tail -1 "$tmp/longtok.log")"
out=$(python3 -c 'import json, sys; r = json.loads(open(sys.argv[1]).readline()); c = r["continuation"]
print(len(c), c.count("|"), c.endswith("|"))' "$tmp/longtok-out/samples.jsonl" 2>&1)
read -r n pieces whole <<<"$out"
[ "$whole" = True ] && [ "$n" -gt 8192 ] && [ "$pieces" -gt 100 ] \
  && ok "a continuation of $n bytes ($pieces pieces) is written whole" || bad "long continuation cut: $out"
# shards tokenized with another tokenizer than --model_dir's (data/chess/shards.json records
# the sha256 of the one it used): trains, with one warning naming both files; none with the
# bundled pair or without a shards.json to compare with
mkdir -p "$tmp/othertok" "$tmp/noman" && cp data/model/* "$tmp/othertok/" && printf ' ' >> "$tmp/othertok/tokenizer.json"
cp data/chess/val_000.bin "$tmp/noman/"
for c in "bundled|data/model|data/chess|0" "another tokenizer.json|$tmp/othertok|data/chess|1" \
         "no shards.json|$tmp/othertok|$tmp/noman|0"; do
  IFS='|' read -r name m d want <<<"$c"
  "$build/finetune" --eval_only "${small[@]}" --max_eval_docs 2 --model_dir "$m" --data_dir "$d" > /dev/null 2> "$tmp/tok.err"; rc=$?
  n=$(grep -c "^finetune: warning: $d/shards.json: the shards were tokenized with a tokenizer (sha256 5de44bbda875...) \
other than --model_dir's $m/tokenizer.json (sha256 [0-9a-f]\{12\}...)" "$tmp/tok.err")
  [ $rc = 0 ] && [ "$n" = "$want" ] && [ "$(grep -c warning "$tmp/tok.err")" = "$want" ] \
    && ok "tokenizer check, $name: exit 0, $want warning(s)" || bad "tokenizer check, $name: rc $rc, $(cat "$tmp/tok.err")"
done
# a save that replaces an existing step directory (a run resumed from step 2 saving step 4
# again), killed right after the swap (TEST-ONLY FT_TEST_PUBLISH_KILL): latest's step_4 is
# whole (the new one), the old copy lies under a temporary name, and the next save removes it
"$bin" "${small[@]}" --max_steps 4 --save_every 2 --max_eval_docs 2 --out_dir "$tmp/swap" > /dev/null 2>&1
FT_TEST_PUBLISH_KILL=1 "$bin" "${small[@]}" --max_steps 4 --save_every 2 --max_eval_docs 2 --out_dir "$tmp/swap" \
  --resume "$tmp/swap/checkpoints/step_00000002" > /dev/null 2>&1; rc=$?
ck=$tmp/swap/checkpoints
left=$(ls -a "$ck" | grep -c '^\.tmp\.step_')
[ $rc = 9 ] && [ "$(cat "$ck/latest")" = step_00000004 ] && [ -s "$ck/step_00000004/model.safetensors" ] \
  && [ -s "$ck/step_00000004/trainer_state.json" ] && [ "$left" = 1 ] \
  && ok "killed right after replacing step_4: latest's checkpoint whole, the old copy under a temporary name" \
  || bad "killed mid-replace: rc $rc, latest '$(cat "$ck/latest" 2>/dev/null)', $(ls -a "$ck" | tr '\n' ' ')"
"$bin" "${small[@]}" --max_steps 6 --save_every 2 --max_eval_docs 2 --out_dir "$tmp/swap" --resume latest > "$tmp/swap.out" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^step *6/6" "$tmp/swap.out" && [ "$(ls -a "$ck" | grep -c '^\.tmp\.')" = 0 ] \
  && ok "--resume latest after it: trains to step 6, the leftover removed by the next save" \
  || bad "resume after the killed replace: rc $rc, $(ls -a "$ck" | tr '\n' ' '), $(tail -1 "$tmp/swap.out")"
# metrics.jsonl that cannot be written (here a link to /dev/full: every write fails with
# ENOSPC, as on a full disk): training goes on, with one warning, the first time
mkdir -p "$tmp/fullm" && ln -sf /dev/full "$tmp/fullm/metrics.jsonl"
"$bin" "${small[@]}" --max_steps 2 --max_eval_docs 2 --out_dir "$tmp/fullm" > "$tmp/fullm.out" 2> "$tmp/fullm.err"; rc=$?
[ $rc = 0 ] && [ "$(grep -c warning "$tmp/fullm.err")" = 1 ] \
  && grep -q "^finetune: warning: $tmp/fullm/metrics.jsonl: writing failed (No space left on device); training goes on" "$tmp/fullm.err" \
  && [ -d "$tmp/fullm/final" ] && ok "metrics.jsonl unwritable: one warning, training and export go on" \
  || bad "metrics.jsonl on /dev/full: rc $rc, $(cat "$tmp/fullm.err")"
# a checkpoint that cannot be written (a file size limit, ulimit -f, with SIGXFSZ ignored:
# every write past 8 MiB fails, as on a full disk; the bundled model's checkpoint has a 5 MB
# model.safetensors, written, and a 10 MB optimizer.safetensors, which fails): one error line
# naming that file, exit 1, nothing of that checkpoint left (no temporary folder, no
# `latest`). A periodic checkpoint's failure stops the run there, no export; the last step's
# is followed by the export (2.5 MB in bf16, which fits: the run's result kept), and the
# error line says so. Rows: name, export expected (1/0), flags (the emulated GPU when built).
# (An H100 run of a 7B with --offload_optimizer ended on a full disk so, 2026-11-26: its 81 GB
# checkpoint failed and the 13.5 GB export was never tried.)
fsize_rows=("cpu|1|" "offload|1|--offload_optimizer" "periodic save|0|--save_every 1")
[ -x "$build/tests/finetune_emu" ] && fsize_rows+=("emulated GPU, offload|1|--device cuda --offload_optimizer")
command -v mpiexec >/dev/null && fsize_rows+=("FSDP over 2 ranks|1|--mpi2")   # (rank 0 writes; both export)
for row in "${fsize_rows[@]}"; do
  IFS='|' read -r name export rest <<<"$row"; read -r -a flags <<<"$rest"
  exe=("$bin"); [[ " ${flags[*]} " == *" --device cuda "* ]] && exe=("$build/tests/finetune_emu")
  [ "${flags[*]}" = --mpi2 ] && { exe=(timeout 300 mpiexec -n 2 "$bin"); flags=(); }
  d="$tmp/fsize-${name// /_}"
  (trap '' XFSZ; ulimit -f 8192; exec "${exe[@]}" "${small[@]}" --max_steps 2 --max_eval_docs 2 "${flags[@]}" --out_dir "$d") \
    > "$d.out" 2> "$d.err"; rc=$?
  left=$(ls -A "$d/checkpoints" 2>/dev/null | tr '\n' ' ')
  err="^finetune: error: \(rank 0 (host [^)]*): \)\?$d/checkpoints/\.tmp\.step_[0-9]*\.[0-9]*/optimizer\.safetensors\.tmp\.[0-9]*: write failed: File too large"
  if [ "$export" = 1 ]; then
    err="$err; the export in $d/final was written after it$"
    [ -s "$d/final/config.json" ] && { [ -s "$d/final/model.safetensors" ] || [ -s "$d/final/adapter_model.safetensors" ]; } \
      && grep -q "^finetune: exported $d/final " "$d.out" || err="(no export: $(ls "$d/final" 2>&1 | tr '\n' ' '))"
  else
    [ ! -e "$d/final" ] || err="(an export after a periodic checkpoint failed)"
  fi
  [ $rc = 1 ] && [ "$(wc -l < "$d.err")" = 1 ] && grep -q "$err" "$d.err" && [ -z "$left" ] \
    && ok "checkpoint write fails ($name): one line naming the file, exit 1, no checkpoint left, export $([ "$export" = 1 ] && echo written || echo none)" \
    || bad "checkpoint write fails ($name): rc $rc, left in checkpoints/: '$left', want '$err', got $(head -2 "$d.err")"
done
# under 2 MiB the export (2.5 MB) fails too: one line with both, no final/ and no checkpoint left
d="$tmp/fsize-both"
(trap '' XFSZ; ulimit -f 2048; exec "$bin" "${small[@]}" --max_steps 2 --max_eval_docs 2 --out_dir "$d") > "$d.out" 2> "$d.err"; rc=$?
err="^finetune: error: $d/checkpoints/\.tmp\.step_[0-9.]*/model\.safetensors\.tmp\.[0-9]*: write failed: File too large; then the export: $d/final[^ ]*: write failed: File too large$"
[ $rc = 1 ] && [ "$(wc -l < "$d.err")" = 1 ] && grep -q "$err" "$d.err" && [ ! -e "$d/final" ] \
  && [ -z "$(ls -A "$d/checkpoints" 2>/dev/null)" ] \
  && ok "checkpoint and export both fail: one line with both, nothing of either left" \
  || bad "checkpoint and export both fail: rc $rc, $(head -2 "$d.err"); $(ls -A "$d" "$d/checkpoints" 2>&1 | tr '\n' ' ')"
# a record torn by a failed write mid-file (TEST-ONLY FT_TEST_METRICS_TEAR=2: half of the 2nd
# record written, then the write fails, as a disk filling up mid-record): cut back to the last
# whole record, so the next ones start their own lines; that record is lost, one warning
FT_TEST_METRICS_TEAR=2 "$bin" "${small[@]}" --max_steps 3 --max_eval_docs 2 --out_dir "$tmp/tearm" > /dev/null 2> "$tmp/tearm.err"; rc=$?
m=$tmp/tearm/metrics.jsonl
[ $rc = 0 ] && [ "$(grep -c warning "$tmp/tearm.err")" = 1 ] && [ "$(grep -vc '^{.*}$' "$m")" = 0 ] \
  && [ "$(grep -c '{"type".*{"type"' "$m")" = 0 ] \
  && [ "$(grep -c '"type":"train"' "$m")" = 2 ] && ! grep -q '"type":"train","step":1,' "$m" \
  && ok "metrics record torn mid-file: cut back, later records whole (steps 2 and 3), one warning" \
  || bad "torn metrics record: rc $rc, $(cat "$tmp/tearm.err"), $(cat "$m" 2>/dev/null | cut -c1-60)"
expect_error "'foo' is not one of linear|cosine|constant" --lr_schedule foo
expect_error "'-1x' is not a number" --learning_rate -1x
expect_error "flag --learning_rate: -1 is out of range" --learning_rate -1
mkdir -p "$tmp/d1" "$tmp/d2" "$tmp/d3"
cp data/chess/val_000.bin "$tmp/d1/train_000.bin"; cp data/chess/val_000.bin "$tmp/d1/val_000.bin"
head -c 5000 data/chess/val_000.bin > "$tmp/d1/train_001.bin"
expect_error "$tmp/d1/train_001.bin" "${small[@]}" --data_dir "$tmp/d1" --max_steps 1 --out_dir "$tmp/x"
cp data/chess/val_000.bin "$tmp/d2/val_000.bin"; printf 'XXXXXXXX' | dd of="$tmp/d2/val_000.bin" conv=notrunc status=none
expect_error "$tmp/d2/val_000.bin" --eval_only "${small[@]}" --data_dir "$tmp/d2"
# shards made for a bigger vocabulary than the model's
expect_error "vocab" --eval_only --model_dir tests/golden/mha --data_dir data/chess --seq_len 32
[ ! -e "$tmp/x/final" ] && ! ls "$tmp/x" 2>/dev/null | grep -q tmp && ok "failed runs left no export or temporary files" || bad "leftovers in $tmp/x"

# weights whose logits overflow (every RMSNorm weight 3e38, finite): the validation loss is
# NaN. --eval_only and training both stop with one line naming it, and metrics.jsonl holds
# only JSON (a "val_loss":nan record once made the file unreadable to json.loads and plots).
# (Training stops at its step-0 evaluation; the training loss's own check stays a guard
# behind the gradient norm's, which a non-finite loss trips first.)
mkdir -p "$tmp/hot" && cp data/model/config.json data/model/tokenizer.json "$tmp/hot/"
python3 - data/model/model.safetensors "$tmp/hot/model.safetensors" <<'PY' || bad "could not write the overflowing model"
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), bytearray(b[8 + n:])
for k, v in h.items():
    if k.endswith("norm.weight") and v["dtype"] == "F32":
        lo, hi = v["data_offsets"]; data[lo:hi] = struct.pack("<f", 3e38) * ((hi - lo) // 4)
open(sys.argv[2], "wb").write(b[:8 + n] + data)
PY
expect_error "eval at step 0: the validation loss is NaN: the model's logits are not finite (check the weights in --model_dir)" \
  --eval_only "${small[@]}" --model_dir "$tmp/hot"
err=$("$bin" "${small[@]}" --model_dir "$tmp/hot" --max_steps 2 --out_dir "$tmp/hotrun" 2>&1 >/dev/null); rc=$?
bad_json=$(python3 -c 'import json, sys
n = 0
for line in open(sys.argv[1]): json.loads(line); n += 1
print(n)' "$tmp/hotrun/metrics.jsonl" 2>&1 | tail -1)
[ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c .)" = 1 ] && [[ "$err" == *"validation loss is NaN"* ]] && [[ "$bad_json" =~ ^[0-9]+$ ]] \
  && ! grep -qi nan "$tmp/hotrun/metrics.jsonl" && [ ! -e "$tmp/hotrun/final" ] \
  && ok "training on overflowing weights: '$err', metrics.jsonl all JSON ($bad_json records), no export" \
  || bad "training on overflowing weights: rc $rc, '$err', metrics.jsonl: $bad_json"

finish
