#!/usr/bin/env bash
# tests/gpu/one_gpu_7b.sh [REPORT_DIR]: a whole CodeLlama-7b-shaped model (32 layers, random
# init, bf16) on ONE GPU the two ways docs/recipes/7b-one-gpu.md plans it:
# LoRA rank 16 and a full fine-tune with --offload_optimizer. For a machine with a GPU, after
# first light built build/first_light/finetune (FT_FIRST_LIGHT_CHECKS=fatbin is enough), in one
# device call of about 4 minutes:
#
#   run(command="FT_FIRST_LIGHT_CHECKS=fatbin OUT=$OUT bash tests/gpu/first_light.sh >$OUT/fl.log 2>&1;
#                bash tests/gpu/one_gpu_7b.sh", carry=[".deps/bundle.tar.xz"], timeout_s=240)
#
# Per run: the --dry_run plan of the same flags (device and host bytes), then the run under a
# time limit with the GPU's memory in use sampled every 0.2 s (nvidia-smi) and the process's
# resident host memory (VmRSS) every 0.2 s; once its last step's line is out the trainer is
# killed (SIGKILL: a 7B's final checkpoint with --offload_optimizer is 81 GB, more than such a
# machine's disk, and SIGTERM would save one); a summary line per run: steps done, the last
# step's line, the peaks, and the plan's total. Not a pass/fail test: a measurement, whose
# figures docs/results/2026-11-26-h100.md holds. Phases end at FT_7B_DEADLINE_S (default 200) after the start, so a
# cut-short call still brings back what ran. Writes REPORT_DIR ($OUT when set, else the
# argument, else out/one_gpu_7b): one_gpu_7b.log (the summary) and one log per run.
set -u
report=${OUT:-${1:-$(dirname "$0")/../../out/one_gpu_7b}}
mkdir -p "$report" && report=$(cd "$report" && pwd) || { echo "one_gpu_7b: cannot create $report" >&2; exit 2; }
cd "$(dirname "$0")/../.." || exit 2
start=$(date +%s)
deadline=$((start + ${FT_7B_DEADLINE_S:-200}))
bin=${FT_7B_BIN:-build/first_light/finetune}   # FT_7B_BIN, FT_7B_DEVICE: to try the script without a GPU
summary=$report/one_gpu_7b.log
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((deadline - $(date +%s))); }

[ -x "$bin" ] || { say "one_gpu_7b: $bin not built (run first light first)"; exit 1; }
[ -z "${FT_7B_BIN:-}" ] && [ -f build/first_light/env.sh ] && . build/first_light/env.sh
say "one_gpu_7b: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB host", $2 / 1048576}' /proc/meminfo)"

# ---------------------------------------------------------------- the model
model=${FT_7B_MODEL_DIR:-/tmp/codellama7b-random}
if [ ! -f "$model/model.safetensors.index.json" ] && [ ! -f "$model/model.safetensors" ]; then
  mkdir -p "$model" && cp data/configs/codellama-7b/config.json "$model/"
  t0=$(date +%s)
  timeout $(( $(left) > 10 ? $(left) - 10 : 1 )) python3 scripts/bench_gpu.py --make_model "$model" --model_dir data/model \
    >"$report/make_model.log" 2>&1 || { say "one_gpu_7b: writing the model failed: $(tail -2 "$report/make_model.log")"; exit 1; }
  say "one_gpu_7b: wrote a random 32-layer CodeLlama-7b-shaped model in $(( $(date +%s) - t0 )) s ($(du -sh "$model" | cut -f1))"
fi

# ---------------------------------------------------------------- one run, measured
# measure NAME LIMIT STEPS FLAGS...: plan, run STEPS steps, peaks
outs=$(mktemp -d) || exit 2   # the runs' --out_dir (checkpoints of the runs that get that far)
trap 'rm -rf "$outs"' EXIT
measure() {
  local name=$1 limit=$2 steps=$3; shift 3
  local flags=(--device "${FT_7B_DEVICE:-cuda}" --model_dir "$model" --data_dir data/chess --pack --seq_len 512 --eval_every 0
               --save_every 0 --sample_tokens 0 --max_eval_docs 1 --learning_rate 1e-4 --max_steps "$steps" "$@")
  local log=$report/$name.log
  "$bin" --dry_run "${flags[@]}" >"$log.plan" 2>&1
  local plan_dev plan_host
  plan_dev=$(awk '$1 == "total" && NF >= 3 {print $3; exit}' "$log.plan")
  plan_host=$(awk '$1 == "host" && NF >= 3 {print $3; exit}' "$log.plan")
  local lim=$(( $(left) < limit ? $(left) : limit ))
  if [ "$lim" -lt 15 ]; then say "$name: not run (no time left)"; return; fi
  local smi=$report/$name.smi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$smi" 2>/dev/null &
  local smi_pid=$!
  timeout "$lim" "$bin" "${flags[@]}" --out_dir "$outs/$name" >"$log" 2>&1 &
  local pid=$! rss=0 r stopped=0 child
  while kill -0 $pid 2>/dev/null; do
    child=$(pgrep -P $pid 2>/dev/null | head -1)
    r=$(awk '/VmRSS/ {print $2}' "/proc/${child:-$pid}/status" 2>/dev/null)
    [ -n "$r" ] && [ "$r" -gt "$rss" ] && rss=$r
    if grep -q "^step *$steps/$steps " "$log" 2>/dev/null && [ -n "$child" ]; then
      kill -KILL "$child" 2>/dev/null && stopped=1
      break
    fi
    sleep 0.2
  done
  { wait $pid; } 2>/dev/null; local rc=$?   # (timeout re-raises a SIGKILLed child's signal: no job line)
  kill $smi_pid 2>/dev/null; wait $smi_pid 2>/dev/null
  local gpu_peak n_steps last
  gpu_peak=$(sort -n "$smi" | tail -1); rm -f "$smi"
  n_steps=$(grep -c '^step ' "$log")
  last=$(grep '^step ' "$log" | tail -1)
  mv "$log.plan" "$report/$name.plan" 2>/dev/null
  rm -rf "${outs:?}/$name"   # its checkpoints and export, if it got that far (a 7B's: tens of GB)
  local how="exit $rc"
  [ $stopped = 1 ] && how="stopped after its last step"
  [ $rc = 124 ] && how="time limit $lim s"
  say "$name: $how (limit $lim s), $n_steps step lines; GPU memory used peak ${gpu_peak:-?} MiB (nvidia-smi, whole GPU); host RSS peak $((rss / 1024)) MiB; plan: device ${plan_dev:-?} GiB, host ${plan_host:-?} GiB"
  [ -n "$last" ] && say "  last: $last"
  grep -m 3 -E 'error|warning|refus' "$log" | sed 's/^/  /' | tee -a "$summary" >/dev/null
}

measure lora_r16_b4 70 8 --lora_rank 16 --batch_size_per_device 4 --total_batch_size 4
measure offload_b4 150 2 --offload_optimizer --batch_size_per_device 4 --total_batch_size 4
say "one_gpu_7b: $(( $(date +%s) - start )) s in all; reports in $report"
