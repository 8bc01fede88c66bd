#!/usr/bin/env bash
# test_auto.sh BUILD_DIR: --auto (src/plan_auto.c), which chooses --batch_size_per_device,
# --gradient_checkpointing, --keep_params_gathered, --dp_shard, --accumulate_grads_locally and
# --offload_optimizer, those not given, for the most predicted tokens/s among the plans that fit.
#   a. More device memory never gives a slower choice: FT_TEST_DEVICE_MIB swept upwards for the
#      bundled model and for CodeLlama-7b (data/configs/codellama-7b) at 1 and 8 ranks; the chosen
#      tokens/s and the count of fitting plans never fall, and each sweep binds (its choices
#      differ from the smallest memory to the largest, so it could fail).
#   b. Flags given stay fixed (--batch_size_per_device 2, --gradient_checkpointing both ways,
#      --dp_shard 4, --offload_optimizer), listed as held, while the others are still
#      chosen (the choice beats the job without --auto); the report that follows is of the choice.
#   c. The choice fits: a real run with --auto on the emulated GPU whose memory
#      (FT_EMU_MEMORY_MIB = FT_TEST_DEVICE_MIB) lies between the plans of two batches: it chooses
#      the smaller, trains 2 steps, its tracked peak and arena high-water are within the plan of
#      the choice, and the faster plan that --auto left out (its "binding" line), run with its
#      flags given, is refused at startup. On the CPU backend (one rank, and 2 MPI ranks) the
#      --auto run's tracker equals the --dry_run --auto plan to the byte and the config line
#      shows the chosen flags.
#   d. The choice is never slower than the default flags: for several shapes the chosen tokens/s
#      >= the H100 tokens/s/GPU of a plain --dry_run of the same job (the same estimate: the
#      timeline's row), and the
#      "no --auto" line equals that plain figure.
#   e. What --auto cannot satisfy: one error line each.
# Runtime: ~35 s of CPU (2 min wall at load 14): ~50 dry runs, two short emulated-GPU runs, two
# CPU runs (one over 2 MPI ranks).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_auto
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
m7=data/configs/codellama-7b

# the chosen line's fields of an --auto report on stdin: tokens/s, then the flags
chosen_tps() { awk '/^  chosen: / { for (i = 1; i <= NF; i++) if ($i == "tokens/s/GPU,") { print $(i - 1); exit } }'; }
chosen_flags() { sed -nE 's/^  chosen: +(--[^:]*): .*/\1/p'; }
fitting() { sed -nE 's/.* ([0-9]+) valid, ([0-9]+) fit;.*/\2/p'; }

# ---------------------------------------------------------------- a. memory sweep
# sweep NAME "MIB..." FLAGS...: --dry_run --auto at each memory, ascending
sweep() {
  local name=$1 mibs=$2; shift 2
  local prev_tps=0 prev_fit=0 first="" last="" m out tps fit flags bad_at=""
  for m in $mibs; do
    out=$(FT_TEST_DEVICE_MIB=$m "$bin" --dry_run --auto --device cuda "$@" 2>&1)
    tps=$(chosen_tps <<<"$out"); fit=$(fitting <<<"$out"); flags=$(chosen_flags <<<"$out")
    if [ -z "$tps" ]; then
      grep -q "none of .* plans fits" <<<"$out" && { prev_fit=0; continue; }   # (nothing fits yet)
      bad_at="$bad_at $m:'$(head -1 <<<"$out")'"; continue
    fi
    le "$prev_tps" "$tps" && le "$prev_fit" "$fit" || bad_at="$bad_at $m:$tps<$prev_tps|fit$fit<$prev_fit"
    prev_tps=$tps; prev_fit=$fit; [ -z "$first" ] && first=$flags; last=$flags
  done
  [ -z "$bad_at" ] && [ -n "$first" ] && [ "$first" != "$last" ] \
    && ok "$name: more memory never slower (${mibs// /, } MiB: '$first' ... '$last', $prev_tps tokens/s)" \
    || bad "$name: sweep${bad_at:- binds nothing: '$first' == '$last'}"
}
sweep "bundled model, 1 GPU" "1300 1340 1380 1450 1600 2000 4000" --seq_len 512 --total_batch_size 64
sweep "7B, 1 GPU" "20000 40000 60000 81559 100000 144000 300000" --model_dir $m7 --world_size 1
sweep "7B, 8 GPUs" "10000 20000 30000 40000 60000 81559 144000" --model_dir $m7 --world_size 8
sweep "7B, 64 GPUs, total 128" "6000 9000 12000 20000 40000 81559" --model_dir $m7 --world_size 64 --total_batch_size 128

# ---------------------------------------------------------------- b. flags given stay fixed
# fixed NAME WANT_IN_CHOSEN WANT_HELD FLAGS...: the chosen flags contain WANT (a regex), the held
# line names WANT_HELD, the choice beats the job without --auto, the report's job line follows
fixed() {
  local name=$1 want=$2 held=$3; shift 3
  local out; out=$("$bin" --dry_run --auto --device cuda "$@" 2>&1)
  local flags tps plain; flags=$(chosen_flags <<<"$out"); tps=$(chosen_tps <<<"$out")
  plain=$(awk '/^  no --auto: / { for (i = 1; i <= NF; i++) if ($i == "tokens/s/GPU,") { print $(i - 1); exit } }' <<<"$out")
  local B; B=$(sed -nE 's/.*--batch_size_per_device ([0-9]+).*/\1/p' <<<"$flags")
  grep -Eq -- "$want" <<<"$flags" && grep -q "^  held: .*$held" <<<"$out" && [ -n "$plain" ] \
    && awk -v a="$tps" -v b="$plain" 'BEGIN { exit !(a > b) }' && grep -q "^job: .* batch $B x seq" <<<"$out" \
    && ok "$name: chosen '$flags' ($tps > $plain tokens/s without --auto), $held held" \
    || bad "$name: chosen '$flags' ($tps vs $plain), want /$want/ and $held held: $(grep -E '^  (held|chosen)' <<<"$out")"
}
fixed "--batch_size_per_device 2" "^--batch_size_per_device 2 " "--batch_size_per_device" \
  --model_dir $m7 --world_size 8 --batch_size_per_device 2
fixed "--gradient_checkpointing" "--gradient_checkpointing" "--gradient_checkpointing" \
  --model_dir $m7 --world_size 8 --gradient_checkpointing
fixed "--dp_shard 4" "--dp_shard 4( |$)" "--dp_shard" --model_dir $m7 --world_size 8 --dp_shard 4
fixed "--offload_optimizer" "--offload_optimizer$" "--offload_optimizer" --model_dir $m7 --world_size 8 --offload_optimizer
out=$("$bin" --dry_run --auto --device cuda --model_dir $m7 --world_size 8 --gradient_checkpointing=false 2>&1)
! chosen_flags <<<"$out" | grep -q -- --gradient_checkpointing && grep -q "^  held: .*--gradient_checkpointing" <<<"$out" \
  && ok "--gradient_checkpointing=false: held off ($(chosen_flags <<<"$out"))" \
  || bad "--gradient_checkpointing=false: $(grep -E '^  (held|chosen)' <<<"$out")"

# --dry_run_device: the device --auto plans for; a larger one never gives a slower choice, and
# the report names it with its memory
out=$("$bin" --dry_run --auto --device cuda --model_dir $m7 --world_size 8 2>&1)
out200=$("$bin" --dry_run --auto --device cuda --model_dir $m7 --world_size 8 --dry_run_device h200 2>&1)
t100=$(chosen_tps <<<"$out"); t200=$(chosen_tps <<<"$out200")
grep -q "predicted on the H100-SXM5-80GB (79.65 GiB" <<<"$out" && grep -q "predicted on the H200-SXM-141GB (131.32 GiB" <<<"$out200" \
  && awk -v a="$t200" -v b="$t100" 'BEGIN { exit !(a >= b && b > 0) }' \
  && ok "--dry_run_device h200: planned on the H200 ($t200 >= $t100 tokens/s on the H100)" \
  || bad "--dry_run_device h200: $t200 vs $t100: $(grep -m1 'predicted on' <<<"$out200")"

# ---------------------------------------------------------------- c. the choice fits
emu=$build/tests/finetune_emu
if [ -x "$emu" ]; then
  f=(--device cuda --seq_len 64 --total_batch_size 32 --max_eval_docs 1 --warmup_fraction 0 --peak_tflops 1)
  total_at() { "$bin" --dry_run "${f[@]}" --batch_size_per_device "$1" | awk '$1 == "total" && NF >= 3 { print $2; exit }'; }
  t16=$(total_at 16); t32=$(total_at 32)
  # one rank: arena = total + total / 100 + 256 MiB, beside 1 GiB for the context (src/plan.h)
  mib=$(awk -v a="$t16" -v b="$t32" 'BEGIN { m = 268435456; a16 = a + int(a / 100) + m; a32 = b + int(b / 100) + m
         printf "%d", (1073741824 + (a16 + a32) / 2) / 1048576 }')
  FT_TEST_DEVICE_MIB=$mib "$bin" --dry_run --auto "${f[@]}" > "$tmp/emu.plan" 2>&1
  flags=$(chosen_flags < "$tmp/emu.plan")
  planned=$(awk '$1 == "total" && NF >= 3 { print $2; exit }' "$tmp/emu.plan")
  blocked=$(sed -nE 's/^  binding: +the fastest plan, (--[^(]*) \(.*/\1/p' "$tmp/emu.plan")
  # (FT_EMU_CONTEXT_MIB: the plan's 1 GiB less cuBLASLt's 32 MiB workspace, which the arena holds)
  # (no FT_TEST_DEVICE_MIB: the run reads its GPU's memory, launch.c auto_device_probe)
  FT_EMU_MEMORY_MIB=$mib FT_EMU_CONTEXT_MIB=992 "$emu" --auto "${f[@]}" --max_steps 2 \
    --out_dir "$tmp/emu" > "$tmp/emu.log" 2>&1; rc=$?
  peak=$(train_field "$tmp/emu/metrics.jsonl" 2 peak_mem_bytes)
  hw=$(sed -nE 's/^finetune: device arena: high-water .* \(([0-9]+) bytes\) of .*/\1/p' "$tmp/emu.log")
  [ $rc -eq 0 ] && [ -n "$blocked" ] && grep -qE "^  chosen: +$flags:" "$tmp/emu.log" && [ -n "$peak" ] \
    && [ "$peak" -le "$planned" ] && [ -n "$hw" ] && [ "$hw" -le $((planned + 33554432)) ] \
    && ok "emulated GPU of $mib MiB: --auto chose '$flags', trained 2 steps, tracked peak $peak and high-water $hw within the plan $planned (+32 MiB)" \
    || bad "emulated GPU of $mib MiB: rc $rc, chosen '$flags', blocked '$blocked', peak '$peak' hw '$hw' plan '$planned': $(grep -m1 error "$tmp/emu.log")"
  gib=$(awk -v m="$mib" 'BEGIN { printf "%.2f", m / 1024 }')
  grep -q "predicted on the CPU emulation (tests/cuda_emu), the smallest of the ranks' (priced as the H100[^(]*) ($gib GiB" \
    "$tmp/emu.log" && ok "a real run plans for its GPU's memory ($gib GiB read from the device)" \
    || bad "a real run's --auto device: $(grep -m1 'predicted on' "$tmp/emu.log") (wanted the device's $gib GiB)"
  # two ranks whose GPUs differ: both plan for the smaller (rank 1's), and agree on the choice
  if command -v mpiexec > /dev/null; then
    # (GiBs, not the 1-rank case's MiBs: two GPU ranks' plans hold NCCL's communicators)
    small=6144 big=24576 g2=6.00
    FT_EMU_CONTEXT_MIB=992 FT_EMU_DEVICE_NAME="NVIDIA H200" timeout 300 mpiexec -n 1 -env FT_EMU_MEMORY_MIB "$big" \
      "$emu" --auto "${f[@]}" --max_steps 1 --out_dir "$tmp/emu3" : -n 1 -env FT_EMU_MEMORY_MIB "$small" "$emu" --auto \
      "${f[@]}" --max_steps 1 --out_dir "$tmp/emu3" > "$tmp/emu3.log" 2>&1; rc=$?
    FT_TEST_DEVICE_MIB=$small "$bin" --dry_run --auto --world_size 2 --dry_run_device h200 "${f[@]}" > "$tmp/emu3.plan" 2>&1
    want=$(chosen_flags < "$tmp/emu3.plan")
    [ $rc -eq 0 ] && grep -q "predicted on the NVIDIA H200, the smallest of the ranks' (priced as the H200[^(]*) ($g2 GiB" \
      "$tmp/emu3.log" && grep -qE "^  chosen: +$want:" "$tmp/emu3.log" \
      && ok "2 ranks, GPUs of $big and $small MiB: planned for $g2 GiB at H200 rates, chose '$want' as the dry run does" \
      || bad "2 ranks of $big / $small MiB: rc $rc, $(grep -m1 'predicted on\|error' "$tmp/emu3.log"); wanted '$want'"
  else skip_or_fail "--auto over 2 emulated GPUs (no mpiexec)"; fi
  # shellcheck disable=SC2086
  FT_EMU_MEMORY_MIB=$mib FT_EMU_CONTEXT_MIB=992 "$emu" "${f[@]}" $blocked --max_steps 1 --out_dir "$tmp/emu2" \
    > "$tmp/emu2.log" 2>&1; rc=$?
  [ -n "$blocked" ] && [ $rc -ne 0 ] && grep -q "the memory plan needs .* GiB are free" "$tmp/emu2.log" \
    && ok "the plan --auto left out ($blocked) is refused by the startup check" \
    || bad "the plan --auto left out ('$blocked'): rc $rc, $(grep -m1 error "$tmp/emu2.log")"
else
  skip_or_fail "$emu not built (make CUDA=1): --auto on the emulated GPU"
fi
# cpu_case NAME RANKS FLAGS...: --auto trains 2 steps on the CPU; its tracker = --dry_run --auto's plan
cpu_case() {
  local name=$1 n=$2; shift 2
  local d="$tmp/cpu$n" run=() rc
  [ "$n" -gt 1 ] && run=(timeout 300 mpiexec -n "$n")
  "${run[@]}" "$bin" --auto --max_steps 2 --max_eval_docs 2 --out_dir "$d" "$@" > "$d.log" 2>&1; rc=$?
  "$bin" --dry_run --auto --world_size "$n" "$@" > "$d.plan" 2>&1
  local planned peak flags B
  planned=$(awk '$1 == "total" && NF >= 3 { print $2; exit }' "$d.plan"); peak=$(train_field "$d/metrics.jsonl" 2 peak_mem_bytes)
  flags=$(chosen_flags < "$d.plan"); B=$(sed -nE 's/.*--batch_size_per_device ([0-9]+).*/\1/p' <<<"$flags")
  [ $rc -eq 0 ] && [ -n "$planned" ] && [ "$planned" = "$peak" ] && grep -q "^finetune: config: .* batch_size_per_device=$B " "$d.log" \
    && [ "$(grep -c '^finetune: --auto: ' "$d.log")" = 1 ] \
    && ok "CPU, $name: --auto chose '$flags' (printed once), tracked peak = plan ($peak bytes)" \
    || bad "CPU, $name: rc $rc, chosen '$flags', peak '$peak', plan '$planned': $(grep -m1 error "$d.log")"
}
cpu_case "1 rank" 1 --seq_len 64 --total_batch_size 8
# a real run's --auto names the estimate-only flags it ranked by, once; without them, nothing
grep -q "^finetune: --auto ranked" "$tmp/cpu1.log" && bad "1 rank: an estimate-flag line without such flags" \
  || ok "1 rank, no estimate-only flags: no line about them"
"$bin" --auto --max_steps 1 --max_eval_docs 2 --seq_len 64 --total_batch_size 8 --fabric_inter_gbps 40 \
  --dry_run_row_tokens 32 --out_dir "$tmp/cpu_est" > "$tmp/cpu_est.log" 2>&1; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c '^finetune: --auto ranked the plans by the step-time estimate with --fabric_inter_gbps 40 --dry_run_row_tokens 32 ' "$tmp/cpu_est.log")" = 1 ] \
  && ok "a real run's --auto names --fabric_inter_gbps 40 --dry_run_row_tokens 32 once" \
  || bad "estimate-only flags in a real run: rc $rc, $(grep -m1 'auto ranked\|error' "$tmp/cpu_est.log")"
if have_mpi; then cpu_case "2 ranks" 2 --seq_len 64 --total_batch_size 8
else skip_or_fail "--auto over 2 CPU ranks (no mpiexec, or $bin built without MPI)"; fi

# ---------------------------------------------------------------- d. never slower than the defaults
# shape NAME FLAGS...: the chosen tokens/s >= the plain job's H100 tokens/s/GPU (when it fits)
shape() {
  local name=$1; shift
  local plain auto p a n
  plain=$("$bin" --dry_run --device cuda "$@" 2>&1); auto=$("$bin" --dry_run --auto --device cuda "$@" 2>&1)
  # (the timeline's H100 row: device, step ms, per-phase ms, tokens/s/GPU, ...: --auto's estimate)
  p=$(awk '/^  H100-SXM5-80GB +[0-9.]+ +[0-9.]+ +[0-9]+ / { print $4; exit }' <<<"$plain"); a=$(chosen_tps <<<"$auto")
  n=$(awk '/^  no --auto: / { for (i = 1; i <= NF; i++) if ($i == "tokens/s/GPU,") { print $(i - 1); exit } }' <<<"$auto")
  grep -q "^fits an 80 GB GPU .*: yes" <<<"$plain" || { bad "$name: the default flags do not fit (pick a shape that does)"; return; }
  [ -n "$p" ] && [ -n "$a" ] && le "$p" "$a" && [ "$n" = "$p" ] \
    && ok "$name: --auto $a >= default $p tokens/s/GPU ($(chosen_flags <<<"$auto"))" \
    || bad "$name: --auto '$a', default '$p', the report's no --auto '$n'"
}
shape "bundled, 1 GPU" --total_batch_size 64
shape "bundled, 4 GPUs" --world_size 4 --total_batch_size 64
shape "7B, 4 GPUs" --model_dir $m7 --world_size 4
shape "7B, 8 GPUs" --model_dir $m7 --world_size 8
shape "7B, 16 GPUs, total 256, seq 1024" --model_dir $m7 --world_size 16 --total_batch_size 256 --seq_len 1024
shape "7B, 64 GPUs" --model_dir $m7 --world_size 64
shape "7B, 8 GPUs, LoRA" --model_dir $m7 --world_size 8 --lora_rank 16

# ---------------------------------------------------------------- e. what --auto cannot satisfy
expect_error "--eval_only has none to choose" --auto --eval_only --dry_run
expect_error "no --batch_size_per_device B makes B x 4 rank(s) divide --total_batch_size 6" \
  --dry_run --auto --world_size 4 --total_batch_size 6
expect_error "--dp_shard: 3 does not divide the world size 4" --dry_run --auto --world_size 4 --dp_shard 3
expect_error "--total_batch_size: 64 is not a multiple of --batch_size_per_device 3" --dry_run --auto --batch_size_per_device 3
expect_error "none of 4 plans fits the H100-SXM5-80GB" --dry_run --auto --device cuda --model_dir $m7 \
  --batch_size_per_device 64 --offload_optimizer=false
FT_TEST_DEVICE_MIB=lots expect_error "FT_TEST_DEVICE_MIB: 'lots' is not a positive number" --dry_run --auto
expect_error "--world_size is for --dry_run" --auto --world_size 2

finish
