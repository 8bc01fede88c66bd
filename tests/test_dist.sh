#!/usr/bin/env bash
# test_dist.sh BUILD_DIR: multi-rank training on CPU ranks over MPI (mpiexec, MPICH), the
# same global batch everywhere (8 sequences per step, 20 steps, seq 64):
#   1. single process == FSDP 2 == FSDP 4 == DDP 2 (--no_fsdp; also with its all-reduce in
#      chunks, bitwise) == HSDP 4 (--dp_shard 2), FSDP 2
#      with gradient checkpointing, FSDP 2 accumulating gradients locally (4 micro-batches),
#      FSDP 2 keeping the gathered parameters for the step (--keep_params_gathered, 4 micro-batches):
#      per-step losses and final weights within the tolerance derived below;
#   2. bytes sent per step by all-gather / reduce-scatter / all-reduce equal the formula;
#   3. a checkpoint saved at 4 ranks resumes at 2 and at 1 rank with the same continuation (its
#      checksums verify); one bit flipped in it: refused at 2 ranks, said once;
#   4. an --out_dir removed or replaced under a 2-rank job stops every rank after the step that
#      notices (exit 1, one warning and one error); kill -9 of one rank ends the job (no hang)
#      with a non-zero exit; resuming from the last checkpoint ends with the uninterrupted
#      run's parameters and moments, exactly;
#   5. a rank that does not see rank 0's --out_dir (a node-local path) is refused at startup;
#   6. shard groups spread over hosts though they would fit on one: a warning.
# Without MPI (no mpiexec, or finetune built without it) it skips, and fails when CI=true.
#
# Tolerance: ranks sum the same per-token gradients in a different order (reduce-scatter of
# per-rank partial sums vs one running sum), so gradients differ by ~1e-7 relative. AdamW
# normalises every element by sqrt(v) and turns noise-level gradients into lr-sized steps
# (see tests/test_train_golden.c), so the gap can grow with the steps. Measured here after 20
# steps at lr 3e-3: loss rel <= 1.5e-7, weight NMSE <= 2e-11 between any two splits. We
# allow loss rel 1e-5 and NMSE 1e-8 (~100x margin for other thread counts and MPI builds). A real sharding bug (a slice applied at the wrong offset, a
# missing reduce, a wrong loss scale per rank) changes the first step's loss or weights by
# 1e-2 relative or more.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_dist
nmse="$build/tests/st_nmse"
if ! have_mpi; then skip_or_fail "no mpiexec, or $bin built without MPI (install mpich libmpich-dev; make MPI=1)"; finish; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
# the backward gets fresh (not zeroed) layer gradient buffers (sharded: per micro-batch; one
# shard: the step gradient in its first micro-batch); test-only, fill
# them with NaN first so that an element it fails to overwrite cannot pass for a stale value
export FT_TEST_POISON_FRESH_GRADS=1
common=(--seq_len 64 --total_batch_size 8 --max_eval_docs 16 --learning_rate 3e-3 --max_steps 20)
mpirun_() { local n="$1"; shift; timeout 300 mpiexec -n "$n" "$bin" "$@"; }

# field DIR FIELD of step 2's train line: steady state (step 1 follows the evaluation at step 0,
# which already gathered the root unit of those parameters)
field() { train_field "$1/metrics.jsonl" 2 "$2"; }

# ---------------------------------------------------------------- 1. equality across splits
"$bin" "${common[@]}" --batch_size_per_device 2 --out_dir "$tmp/ref" > "$tmp/ref.log" 2>&1 || bad "single-process run: $(tail -1 "$tmp/ref.log")"
compare() {  # compare NAME DIR
  local name="$1" d="$2"
  local worst n
  n=$(metric "$d" loss | grep -c .)
  if [ "$(metric "$tmp/ref" step)" != "$(metric "$d" step)" ]; then worst="step mismatch"
  elif [ "$n" != 20 ]; then worst="steps $n"
  else worst=$(worst_rel "$(metric "$tmp/ref" loss)" "$(metric "$d" loss)"); fi
  le "$worst" 1e-5 \
    && ok "$name: 20 step losses match the single process (worst rel $worst)" || bad "$name: losses differ: $worst"
  local e
  e=$("$nmse" "$d/checkpoints/step_00000020/model.safetensors" "$tmp/ref/checkpoints/step_00000020/model.safetensors")
  le "${e##* }" 1e-8 && ok "$name: final weights match ($e)" || bad "$name: final weights: '$e'"
}
run_case() {  # run_case NAME RANKS flags...
  local name="$1" n="$2"; shift 2
  if mpirun_ "$n" "${common[@]}" "$@" --out_dir "$tmp/$name" > "$tmp/$name.log" 2>&1; then
    compare "$name" "$tmp/$name"
  else bad "$name: run failed: $(grep -m1 error "$tmp/$name.log")"; fi
}
run_case fsdp2 2 --batch_size_per_device 2
run_case fsdp4 4 --batch_size_per_device 1
run_case ddp2 2 --batch_size_per_device 2 --no_fsdp
# MPI counts are int: DDP's gradient all-reduce (6.7e9 elements for 7B) goes in chunks; with
# chunks of 1000 elements (test-only FT_MPI_MAX_COUNT) the same run, bitwise (two ranks: a + b)
FT_MPI_MAX_COUNT=1000 run_case ddp2_chunked 2 --batch_size_per_device 2 --no_fsdp
if [ -f "$tmp/ddp2_chunked/final/model.safetensors" ] \
   && cmp -s "$tmp/ddp2/final/model.safetensors" "$tmp/ddp2_chunked/final/model.safetensors" \
   && [ "$(metric "$tmp/ddp2" loss)" = "$(metric "$tmp/ddp2_chunked" loss)" ]; then
  ok "DDP 2 with the all-reduce in chunks of 1000 elements: bitwise the losses and weights of one call"
else bad "DDP 2 with chunked all-reduces differs from one call"; fi
out=$(FT_MPI_MAX_COUNT=0 mpirun_ 2 "${common[@]}" --max_steps 1 --no_fsdp --batch_size_per_device 2 --out_dir "$tmp/chunk0" 2>&1)
grep -q "FT_MPI_MAX_COUNT: '0' is not a count in \[1, 2147483647\]" <<<"$out" \
  && ok "FT_MPI_MAX_COUNT is read (0 refused): the chunked run above did run in chunks" || bad "FT_MPI_MAX_COUNT=0: $out"
run_case hsdp4 4 --batch_size_per_device 2 --dp_shard 2
run_case fsdp2_ckpt 2 --batch_size_per_device 4 --gradient_checkpointing
run_case fsdp2_keep 2 --batch_size_per_device 1 --keep_params_gathered
# keeping the gathered parameters changes where they are read from, not one operation on them:
# bitwise the same step losses and final weights as the plain FSDP 2 run at the same batch
run_case fsdp2_b1 2 --batch_size_per_device 1
if [ -f "$tmp/fsdp2_b1/final/model.safetensors" ] \
   && cmp -s "$tmp/fsdp2_b1/final/model.safetensors" "$tmp/fsdp2_keep/final/model.safetensors" \
   && [ "$(metric "$tmp/fsdp2_b1" loss)" = "$(metric "$tmp/fsdp2_keep" loss)" ]; then
  ok "--keep_params_gathered: losses and final weights bitwise those of plain FSDP 2"
else bad "--keep_params_gathered differs from plain FSDP 2 at the same batch"; fi
run_case fsdp2_local 2 --batch_size_per_device 1 --accumulate_grads_locally
grep -q "sharding HSDP (shard group 2 x replica group 2)" "$tmp/hsdp4.log" && ok "HSDP 4 = 2 shard x 2 replica" || bad "HSDP grid not reported"
grep -q "bootstrap: MPI (mpirun); world 4 rank(s)" "$tmp/fsdp4.log" && ok "bootstrap reported once" || bad "bootstrap line"
[ "$(grep -c "bootstrap:" "$tmp/fsdp4.log")" -eq 1 ] && ok "rank 0 alone prints" || bad "bootstrap printed $(grep -c bootstrap: "$tmp/fsdp4.log") times"

# the consolidated export written from 4 FSDP shards loads in transformers with our loss
py="${FT_ORACLE_PYTHON:-/opt/oracle-venv/bin/python}"
ours=$("$bin" --eval_only --model_dir "$tmp/fsdp4/final" --seq_len 64 --max_eval_docs 16 2>&1 | sed -nE 's/.*val loss ([0-9.]+).*/\1/p')
if [ -x "$py" ] && "$py" -c "import transformers, torch" 2>/dev/null; then
  out=$(HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error "$py" tests/oracle/check_export.py "$tmp/fsdp4/final" \
        data/chess/val_000.bin 64 16 "$ours" 2>&1) && ok "export from 4 FSDP shards loads in transformers: $out" || bad "export from shards: $out"
elif [ -n "${FT_ORACLE_PYTHON:-}" ]; then bad "FT_ORACLE_PYTHON cannot import transformers"
else skip_or_fail "transformers check of the sharded export (no Python with transformers; set FT_ORACLE_PYTHON)"; fi

# sampling over FSDP 2 (--sample_tokens: every token a forward with the ranks' all-gathers):
# every rank takes rank 0's token. FT_TEST_SAMPLE_SKEW (test-only) makes rank 1 draw EOS at
# every token, as a rank whose logits differ in the last bit could draw another token: with
# the agreement the samples are those of the plain run, exactly; without it rank 1 would end
# each game after one token and its collectives would pair with rank 0's of another forward
# (a hang: --collective_timeout 60 ends it)
samp=(--batch_size_per_device 2 --max_steps 2 --sample_tokens 12 --sample_games 3 --collective_timeout 60)
if mpirun_ 2 "${common[@]}" "${samp[@]}" --out_dir "$tmp/samp" > "$tmp/samp.log" 2>&1 \
   && FT_TEST_SAMPLE_SKEW=1 mpirun_ 2 "${common[@]}" "${samp[@]}" --out_dir "$tmp/samp_skew" > "$tmp/samp_skew.log" 2>&1; then
  n=$(grep -c '"game"' "$tmp/samp/samples.jsonl")
  [ "$n" = 3 ] && cmp -s "$tmp/samp/samples.jsonl" "$tmp/samp_skew/samples.jsonl" \
    && ok "FSDP 2 sampling: 3 games; with rank 1 drawing EOS the samples are rank 0's, the same file" \
    || bad "FSDP 2 sampling: $n games; skewed run: $(head -c 200 "$tmp/samp_skew/samples.jsonl")"
else bad "FSDP 2 sampling: $(grep -m1 -i 'error\|timeout' "$tmp/samp.log" "$tmp/samp_skew.log")"; fi

# ---------------------------------------------------------------- 2. bytes per step
# default model: L = 4 layer units of 184,576 params, root 524,416 (embeddings + norm +
# lm_head); P = 1,262,720 (units already multiples of 64, so no padding). Per step FSDP
# gathers the root once (kept across the micro-batches until the optimizer step changes it)
# and each layer when it is not already in one of the two layer buffers: the backward starts
# with the last two forward layers still gathered, and a following micro-batch of the same
# step starts with layers 0 and 1 still gathered from the backward. So per step: root +
# (L + L-2 + (accum-1) x 2(L-2)) x layer elements, each all-gather sending (N-1)/N of it, 4
# bytes each. Reduce-scatter: every layer once per micro-step; the root once per step (its
# gradient summed over the micro-batches in fp32 first, then reduce-scattered in fp32). DDP
# all-reduces the gradients once per step: 2 (N-1)/N x 4 x P.
P=1262720; layer=184576; root=524416; L=4
gathered() { echo $(( root + (L + L - 2 + ($1 - 1) * 2 * (L - 2)) * layer )); }  # accum
reduced() { echo $(( $1 * (P - root) + root )); }  # accum
check_bytes() {  # check_bytes NAME FIELD EXPECTED
  local got; got=$(field "$tmp/$1" "$2")
  [ "$got" = "$3" ] && ok "$1: $2 per step = $got (formula)" || bad "$1: $2 per step $got, formula $3"
}
# fsdp2: 2 micro-steps per step; fsdp4: 2 micro-steps (8 / (1 x 4))
check_bytes fsdp2 all_gather_bytes $(( $(gathered 2) * 4 / 2 ))
check_bytes fsdp2 reduce_scatter_bytes $(( $(reduced 2) * 4 / 2 ))
check_bytes fsdp4 all_gather_bytes $(( $(gathered 2) * 3 * 4 / 4 ))
check_bytes fsdp4 reduce_scatter_bytes $(( $(reduced 2) * 3 * 4 / 4 ))
# --keep_params_gathered: every unit gathered once per step (4 micro-batches here), kept
check_bytes fsdp2_keep all_gather_bytes $(( P * 4 / 2 ))
check_bytes fsdp2_keep reduce_scatter_bytes $(( $(reduced 4) * 4 / 2 ))
# accumulating locally: one reduce-scatter of every unit per step, whatever the micro-batches
check_bytes fsdp2_local reduce_scatter_bytes $(( P * 4 / 2 ))
check_bytes ddp2 all_reduce_bytes $(( 2 * P * 4 / 2 ))
check_bytes ddp2 all_gather_bytes 0
# per-rank model state: params (fp32 on CPU) + master + 2 moments + fp32 grads = 20 bytes per
# parameter, sharded 1/N, plus when sharded one micro-batch's full-unit gradient buffers: two
# layers (one layer's reduce-scatter overlaps the next's backward). These jobs take 2
# micro-batches per step, so the root's gradient is summed over them in fp32 and
# reduce-scattered once, in the checkpoint gather buffer (a workspace); its micro-batch
# gradients, fp32 on the CPU, add into that sum directly (no root buffer: fsdp.c
# root_into_acc). Unsharded (one process, DDP) the backward adds into the fp32 gradient
# itself: no unit buffers (FSDP_GRADS_DIRECT).
for c in ref:1:0 fsdp2:2:2 fsdp4:4:2 ddp2:1:0; do
  n=${c#*:}; n=${n%%:*}; nl=${c##*:}
  units=$(( nl * layer * 4 ))
  check_bytes "${c%%:*}" model_state_bytes $(( P * 20 / n + units ))
done
check_bytes fsdp2_local model_state_bytes $(( P * 20 / 2 + P * 4 ))   # + full-size local gradients
# the FSDP rule of thumb: a micro-step moves at most 3 x P (gather for the forward, again for
# the backward, reduce-scatter), x 4 bytes x (N-1)/N sent per rank; keeping the last forward
# layers gathered for the backward and the root for the step makes ours less (docs/architecture.md: 4.37 MB
# vs 7.58 MB)
ag=$(field "$tmp/fsdp2" all_gather_bytes); rs=$(field "$tmp/fsdp2" reduce_scatter_bytes)
per=$(( (ag + rs) / 2 )); rule=$(( 3 * P * 4 / 2 ))
[ -n "$ag" ] && [ -n "$rs" ] && [ "$per" -gt $(( P * 4 / 2 )) ] && [ "$per" -le "$rule" ] \
  && ok "FSDP 2 ranks: $per bytes per micro-step, within the 3 x P rule ($rule)" || bad "FSDP 2 bytes per micro-step '$per' vs rule $rule"

# ---------------------------------------------------------------- 3. resume at another world size
if mpirun_ 4 "${common[@]}" --batch_size_per_device 1 --stop_at_step 10 --out_dir "$tmp/r4" > "$tmp/r4.log" 2>&1; then
  for n in 2 1; do
    cp -r "$tmp/r4" "$tmp/r4to$n"
    if [ "$n" -eq 1 ]; then "$bin" "${common[@]}" --batch_size_per_device 2 --resume latest --out_dir "$tmp/r4to$n" > "$tmp/r4to$n.log" 2>&1
    else mpirun_ "$n" "${common[@]}" --batch_size_per_device 2 --resume latest --out_dir "$tmp/r4to$n" > "$tmp/r4to$n.log" 2>&1; fi
    [ $? -eq 0 ] && compare "saved at 4 ranks, resumed at $n" "$tmp/r4to$n" || bad "resume at $n ranks failed: $(grep -m1 error "$tmp/r4to$n.log")"
  done
else bad "4-rank run with --stop_at_step failed"; fi
# its checksums, recorded by rank 0 over the units it gathered from the 4 ranks' slices, verify
# at 2 and at 1 rank above; one bit flipped in its weights or its moments (each tensor's
# checksum verified by one of the 2 ranks, each reading its slices otherwise): the resume at 2
# ranks ends on every rank, the file and tensor named once
for f in model optimizer; do
  rm -rf "$tmp/r4flip"; cp -r "$tmp/r4" "$tmp/r4flip"
  ck="$tmp/r4flip/checkpoints/$(cat "$tmp/r4flip/checkpoints/latest" 2>/dev/null)"
  name=$(flip_bit "$ck/$f.safetensors")
  err=$(mpirun_ 2 "${common[@]}" --batch_size_per_device 2 --resume latest --out_dir "$tmp/r4flip" 2>&1 >/dev/null); rc=$?
  n=$(printf '%s\n' "$err" | grep -c "finetune: error")
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] \
    && grep -qE "^finetune: error: rank [0-9]+ \(host [^)]*\): " <<<"$err" \
    && grep -qF ": $ck/$f.safetensors: tensor '$name': checksum mismatch (the file is corrupted)" <<<"$err" \
    && ok "saved at 4 ranks, a bit flipped in $f.safetensors: the resume at 2 ranks refuses it (rc $rc), said once" \
    || bad "a bit flipped in the 4-rank $f.safetensors, resumed at 2: rc=$rc, $n error lines: $err"
done

# ---------------------------------------------------------------- bad input seen by one rank
# MPMD launch: rank 1 gets a data directory whose training shard is truncated (as if one
# node had a damaged copy); every rank must exit, the error printed once, by the rank that saw it
mkdir -p "$tmp/baddata"; cp data/chess/val_000.bin "$tmp/baddata/"; head -c 4000 data/chess/train_000.bin > "$tmp/baddata/train_000.bin"
err=$(timeout 60 mpiexec -n 1 "$bin" "${common[@]}" --batch_size_per_device 2 --out_dir "$tmp/bad" : \
        -n 1 "$bin" "${common[@]}" --batch_size_per_device 2 --out_dir "$tmp/bad" --data_dir "$tmp/baddata" 2>&1 >/dev/null); rc=$?
n=$(printf '%s\n' "$err" | grep -c "finetune: error")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && printf '%s' "$err" | grep -q "baddata/train_000.bin" \
  && ok "a bad shard on one rank: all ranks exit (rc $rc), error printed once" || bad "bad shard on one rank: rc=$rc, $n error lines: $err"

# ---------------------------------------------------------------- --out_dir removed under the job
# rank 0 notices (its check, once a step) and every rank stops together after that step
# (agreed like a failed save): one warning and one error, from rank 0, exit 1, nothing recreated
gone=(--seq_len 64 --batch_size_per_device 1 --total_batch_size 2 --max_steps 400 --eval_every 0 --save_every 50)
out_dir_removed "2 ranks" removed "$tmp/gone" mpirun_ 2 "${gone[@]}" --out_dir "$tmp/gone"
out_dir_removed "2 ranks" replaced "$tmp/gone" mpirun_ 2 "${gone[@]}" --out_dir "$tmp/gone"

# ---------------------------------------------------------------- 4. kill -9 of one rank
# A 2-rank FSDP run saving every 4 steps loses a rank to kill -9 mid-run: the job must end
# (no rank left blocked in a collective) with a non-zero exit and the launcher's report;
# resubmitting with --resume latest continues from the last checkpoint and must end with
# exactly the parameters of an uninterrupted run. Constant lr without warmup, so the killed
# run's open-ended --max_steps does not change the schedule.
kflags=(--seq_len 64 --batch_size_per_device 2 --total_batch_size 8 --max_eval_docs 16 --learning_rate 3e-3
        --lr_schedule constant --warmup_fraction 0 --save_every 4)
mpirun_ 2 "${kflags[@]}" --max_steps 16 --out_dir "$tmp/nokill" > "$tmp/nokill.log" 2>&1 || bad "uninterrupted run failed"
mpiexec -n 2 "$bin" "${kflags[@]}" --max_steps 100000 --out_dir "$tmp/kill" > "$tmp/kill.log" 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do grep -q "^step    9/" "$tmp/kill.log" 2>/dev/null && break; sleep 0.1; done
# the victim: a rank our mpiexec started (its descendants named finetune), never a name pattern
victim=$(for p in $(descendants $launcher); do [ "$(ps -o comm= -p "$p" 2>/dev/null)" = finetune ] && echo "$p"; done | tail -1)
start=$(date +%s)
[ -n "$victim" ] && kill -9 "$victim"
for _ in $(seq 1 600); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
took=$(( $(date +%s) - start ))
if kill -0 $launcher 2>/dev/null; then
  bad "kill -9 of one rank: job still running after ${took}s"; kill_tree $launcher
else
  wait $launcher; krc=$?
  [ -n "$victim" ] && [ $krc -ne 0 ] && grep -qi "killed\|terminat" "$tmp/kill.log" \
    && ok "kill -9 of one rank: job ended in ${took}s with exit $krc: $(grep -i -m1 'killed\|terminat' "$tmp/kill.log" | tr -s ' =')" \
    || bad "kill -9 of one rank (victim '$victim'): exit $krc, no report: $(tail -1 "$tmp/kill.log")"
fi
last=$(cat "$tmp/kill/checkpoints/latest" 2>/dev/null)
if mpirun_ 2 "${kflags[@]}" --max_steps 16 --resume latest --out_dir "$tmp/kill" > "$tmp/resume.log" 2>&1; then
  e=$("$nmse" "$tmp/kill/checkpoints/step_00000016/model.safetensors" "$tmp/nokill/checkpoints/step_00000016/model.safetensors")
  o=$("$nmse" "$tmp/kill/checkpoints/step_00000016/optimizer.safetensors" "$tmp/nokill/checkpoints/step_00000016/optimizer.safetensors")
  le "${e##* }" 0 && le "${o##* }" 0 \
    && ok "resumed from $last after kill -9: step 16 weights and moments equal the uninterrupted run's ($e; $o)" \
    || bad "resume after kill -9 (from '$last'): weights $e, moments $o"
else bad "resume after kill -9: $(grep -m1 error "$tmp/resume.log")"; fi

# ---------------------------------------------------------------- 5. --out_dir seen by every rank
# a node-local --out_dir gives each node its own directory (each rank resolved --resume in
# its own: mixed weights, then a hang). Simulated with mpiexec's MPMD form, rank 1 given
# another directory: one error line naming rank 1, exit 1, both directories gone (created by
# this job); with --resume auto over a checkpoint only rank 0's directory holds, the same
# (a rank that does not see it looks again for 60 s, a network filesystem's cache; 2 s here)
export FT_TEST_OUT_DIR_WAIT_S=2
out=$(timeout 120 mpiexec -n 1 "$bin" "${common[@]}" --batch_size_per_device 2 --out_dir "$tmp/own0" : \
      -n 1 "$bin" "${common[@]}" --batch_size_per_device 2 --out_dir "$tmp/own1" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && [ "$(grep -c 'error' <<<"$out")" = 1 ] \
  && grep -q "^finetune: error: rank 1 (host [^)]*): --out_dir $tmp/own1: this rank does not see the lock rank 0 holds in it (no .lock there, after 2 s)" <<<"$out" \
  && [ ! -e "$tmp/own0" ] && [ ! -e "$tmp/own1" ] && ok "a different --out_dir on rank 1: refused at startup: $(grep error <<<"$out")" \
  || bad "a different --out_dir on rank 1: rc $rc, $out"
mkdir -p "$tmp/own3"; echo "pid 1 on host elsewhere" > "$tmp/own3/.lock"   # (another job's, left there)
out=$(timeout 120 mpiexec -n 1 "$bin" "${common[@]}" --batch_size_per_device 2 --resume auto --out_dir "$tmp/fsdp2" : \
      -n 1 "$bin" "${common[@]}" --batch_size_per_device 2 --resume auto --out_dir "$tmp/own3" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && grep -q "rank 1 (host [^)]*): --out_dir $tmp/own3: this rank does not see the lock rank 0 holds in it (it finds another job's: pid 1 on host elsewhere, after 2 s)" <<<"$out" \
  && [ ! -e "$tmp/fsdp2/.lock" ] && ok "--resume auto with rank 1 in another directory (another job's .lock): refused before anything is resumed" \
  || bad "--resume auto, rank 1 elsewhere: rc $rc, $out"


# ---------------------------------------------------------------- 6. shard groups across hosts
# HSDP 2 x 2 with the ranks placed round-robin over two hosts (test-only FT_TEST_HOST names
# each rank's host, as mpiexec -hosts a,b would place them): both shard groups span the two
# hosts though each fits on one: one warning from rank 0; placed in blocks (one real host): none
hsdp=(--seq_len 64 --total_batch_size 8 --max_eval_docs 4 --max_steps 1 --batch_size_per_device 2 --dp_shard 2)
mp=(); for h in a b a b; do mp+=(: -n 1 -env FT_TEST_HOST "$h" "$bin" "${hsdp[@]}" --out_dir "$tmp/spread"); done
err=$(timeout 120 mpiexec "${mp[@]:1}" 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "warning: .*span several hosts" <<<"$err")" = 1 ] \
  && grep -q "^finetune: warning: 2 of 2 shard groups of 2 ranks span several hosts (the first: ranks 0-1)" <<<"$err" \
  && ! grep -q "span several hosts" "$tmp/hsdp4.log" \
  && ok "HSDP shard groups spread round-robin over hosts: one warning; in blocks (hsdp4): none" \
  || bad "shard groups across hosts: rc $rc, $err"
finish
