#!/usr/bin/env bash
# tests/gpu/gpu_session.sh [REPORT_DIR]: all a session lent a GPU runs, in ONE device call
# (the lease is 15 minutes of device time, the machine's start included; one call runs at
# most 10). From the repository root, with .deps/bundle.tar.xz carried (docs/testing.md, "On a machine with a GPU"):
#
#   1. tests/gpu/first_light.sh under FT_FIRST_LIGHT_BUDGET (default 360 s): build for this
#      GPU, make test-gpu, compute-sanitizer, the un-truncated soak (issue 11 item 4)
#   2. scripts/bench_gpu.py with what is left of FT_GPU_SESSION_BUDGET (default 540 s) as its
#      --deadline_s: finetune (the binary step 1 built) against the PyTorch baselines (eager,
#      FSDP1, FSDP2 + torch.compile, and that + Liger: bench_gpu.py --help; torch with CUDA
#      must be in the machine's python3, liger_kernel's wheel comes in the bundle) at
#      CodeLlama-7b width with FT_BENCH_LAYERS layers (default 8: the model is written once
#      and loaded three times inside the deadline; --layers auto's 15 fit an H100 but take
#      longer), at batch 4 and 16 (FT_BENCH_BATCH_7B: one model, two jobs), first, as the
#      issue's goals are judged on it; then the bundled job; 5 timed steps each, and after each
#      finetune run one of 3 steps with --profile (ms per op) (issue 12 item 8)
#
# Writes to REPORT_DIR ($OUT when set, else the argument, else out/gpu_session):
# first_light.md, first_light.json, first_light_logs.tar.gz, bench_gpu.json, bench_gpu.log
# (a device call brings back at most 8 files; these are 5). The benchmark's JSON is
# rewritten after every program, so a call cut short keeps what was measured.
# Exit: first_light's status (0 all passed, 1 failed, 3 not run), or 1 if it passed and the
# benchmark failed to run at all.
#
# Device call (timeout_s leaves ~50 s for the copy back):
#   run(command="bash tests/gpu/gpu_session.sh", carry=[".deps/bundle.tar.xz"], timeout_s=600)
set -u
report=${OUT:-${1:-$(dirname "$0")/../../out/gpu_session}}
mkdir -p "$report" && report=$(cd "$report" && pwd) || { echo "gpu_session: cannot create $report" >&2; exit 2; }
cd "$(dirname "$0")/../.." || exit 2
budget=${FT_GPU_SESSION_BUDGET:-540}
start=$(date +%s)

FT_FIRST_LIGHT_BUDGET=${FT_FIRST_LIGHT_BUDGET:-360} OUT="$report" bash tests/gpu/first_light.sh
fl=$?

left=$((budget - ($(date +%s) - start)))
bin=build/first_light/finetune
args=(--jobs "${FT_BENCH_JOBS:-7b,bundled}" --batch_7b "${FT_BENCH_BATCH_7B:-4,16}" --steps "${FT_BENCH_STEPS:-5}"
      --layers "${FT_BENCH_LAYERS:-8}" --profile_finetune --deadline_s "$left" --json "$report/bench_gpu.json")
if [ -x "$bin" ]; then
  # the wheel libraries' path the build was linked for (first_light.sh writes it)
  [ -f build/first_light/env.sh ] && . build/first_light/env.sh
  args+=(--bin "$bin")
elif ! grep -qE '"id": "build", "status": "(fail|timeout)"' "$report/first_light.json" 2>/dev/null ||
     [ "${FT_GPU_SESSION_BENCH_WITHOUT_BUILD:-0}" = 1 ]; then
  args+=(--programs torch,torch_fsdp,torch_compile,liger)   # no build: PyTorch's figures alone
  echo "gpu_session: $bin was not built (see first_light.md): benchmarking PyTorch alone"
else
  # the lease is short: a failed build ends the call at once, keeping the device time for a
  # second call once it is fixed (FT_GPU_SESSION_BENCH_WITHOUT_BUILD=1 benchmarks PyTorch alone)
  echo "gpu_session: $bin was not built (see first_light.md and build.log in first_light_logs.tar.gz): no benchmark"
  tar -xzOf "$report/first_light_logs.tar.gz" ./build.log 2>/dev/null | grep -E -m 40 'error|Error|undefined|cannot|No such' 
  exit 1
fi
# what the PyTorch baselines need from the machine (not carried): one line, also in the log
python3 -c 'import torch, transformers; print(f"gpu_session: python3 has torch {torch.__version__} (CUDA '\
'{torch.cuda.is_available()}), transformers {transformers.__version__}")' 2>&1 | tail -1 | tee "$report/bench_gpu.log"
echo "gpu_session: bench_gpu.py with ${left} s left ..."
PYTHONUNBUFFERED=1 python3 scripts/bench_gpu.py "${args[@]}" >>"$report/bench_gpu.log" 2>&1
bench=$?
tail -25 "$report/bench_gpu.log"
echo "gpu_session: first_light exit $fl, bench_gpu exit $bench, $(($(date +%s) - start)) s in all; reports in $report"
[ $fl = 0 ] && [ $bench != 0 ] && exit 1
exit $fl
