#!/usr/bin/env bash
# tests/gpu/first_light.sh [REPORT_DIR]: first light on a machine with a GPU, in one command,
# from the repository root. For machines that have a GPU, the CUDA toolkit (nvcc, cuBLASLt)
# and Python wheels of NCCL/cuDNN perhaps, but no package manager: jansson and OpenBLAS come
# from scripts/gpu_bundle.sh's folder (.deps/root, or .deps/bundle.tar.xz, unpacked here).
#
#   build      the trainer and the GPU tests for this GPU's architecture only (BUILD
#              build/first_light, every nvcc warning and spill an error as in nvcc-check)
#   fatbin     each kernel object holds SASS for this GPU (kernels/fatbin_check.py)
#   test-gpu   `make test-gpu`: every backend op vs the CPU (7B shapes included; attention on
#              cuDNN and native), the default job on the GPU vs the CPU (cuDNN attention must
#              pass the startup check; --attention native too), FSDP over 2 GPUs when there are 2
#   multi_rank tests/gpu/multi_rank_gpu.sh: several ranks on this one GPU through the test-only
#              NCCL stand-in (tests/nccl_standin; NCCL itself refuses two ranks on one GPU):
#              FSDP 2 and 4, HSDP 2 x 2, DDP 2, 30 steps of the default job vs 1 rank; a stop at
#              step 10 resumed at another world size; LoRA and --offload_optimizer over 2 ranks;
#              compute-sanitizer memcheck and racecheck over 2 ranks (needs the bundle's MPICH)
#   bench      scripts/bench_gpu.py (issue 37): CodeLlama-7b width at seq 512, batch 16 then 4,
#              FT_BENCH_LAYERS layers (default 8), then the 32-layer job with activation
#              checkpointing where it fits (an H200) (FT_BENCH_JOBS, default 7b,7b32);
#              programs in priority order finetune, finetune_fp8, torch_compile, liger, torch
#              (eager), finetune_bf16_moments (FT_BENCH_PROGRAMS); FT_BENCH_STEPS timed steps (default 5) after the warm-up;
#              its --deadline_s is the phase's time less 20 s, and a program whose estimated
#              time (torch.compile's warm-up included) exceeds what is left is dropped and
#              reported as not run with that reason. Writes REPORT_DIR/bench_results/
#              DATE-GPU.json and .md (scripts/bench_results/'s form: copy them there). A
#              program that cannot be had (no torch, no liger_kernel, out of memory, a binary
#              without --fp8) is a "not run" line, not a failure; one that crashes fails it
#   fp8_loss   tests/gpu/fp8_loss_gpu.sh: 30 steps of test_gpu.sh's default job with --fp8 vs
#              bf16 (its tolerance derived there); not run when the binary has no --fp8
#   memcheck, racecheck, synccheck   compute-sanitizer over 2 training steps of the bundled
#              job (seq 128, batch 2, with the evaluations before and after); racecheck and
#              synccheck with --attention native (our kernels, not cuDNN's)
#   soak       the un-truncated job (seq 512, variable lengths, batch 4 and 1, 300 steps, eval,
#              stop + resume, sampling) vs the CPU: tests/test_cuda_emu_soak.sh when it
#              takes FT_SOAK_BIN/FT_SOAK_DEVICE (the emulated soak, pointed at this binary
#              and --device cuda), else tests/gpu/soak_gpu.sh (the same job)
#   deterministic   tests/gpu/deterministic_gpu.sh: two short runs with --deterministic
#              bitwise equal (and whether two without it are: reported, not judged)
#
# Writes REPORT_DIR/first_light.md, first_light.json, first_light_logs.tar.gz and the bench
# check's bench_results/DATE-GPU.{json,md} (REPORT_DIR:
# $OUT when set, else the argument, else out/first_light). Every check is pass, fail,
# timeout or not_run, and each not run names why (no GPU, no compute-sanitizer, an earlier
# failure, the time budget). Exit 0: all ran and passed; 1: something failed or timed out;
# 3: nothing failed but something did not run (a machine without a GPU: all).
#
# The time plan: FT_FIRST_LIGHT_BUDGET seconds (default 465: the whole call, with the machine's
# start and the copy back, fits one 8-minute device call), shared in priority order. The slots
# below sum to 465 and scale with the budget; phase N must end by start + the slots of phases
# 1..N, so time a phase leaves unused goes to the next ones (the sanitizers, soak and
# deterministic run only on such time), and a phase whose time so reckoned is under its
# minimum is not run ("the time plan leaves ..."). first_light.md repeats the plan with the
# seconds each phase used. (This table is read by the script itself: keep its layout.)
#
#   phase          slot  min   why this much
#   build           110   30   the H100's cold build took ~80 s (2026-11-26, all kernels)
#   fatbin            5    2   a Python read of the objects
#   test-gpu         70   40   ~50 s on the H100 (2026-11-26)
#   multi_rank       60   30   5 ranks' short jobs in waves (unmeasured)
#   bench           150   60   the 8-layer model written once; finetune ~15 s a run, eager
#                              ~20 s, torch.compile ~60 s with its warm-up (estimates)
#   fp8_loss         20   10   two 30-step runs of the bundled model
#   memcheck         10   25   2 steps under compute-sanitizer (~20 s on the H100)
#   racecheck        15   35
#   synccheck        10   25
#   soak             10   25   ~25 s on the H100
#   deterministic     5   10
#   total           465
set -u
report=${OUT:-${1:-$(dirname "$0")/../../out/first_light}}
mkdir -p "$report" && report=$(cd "$report" && pwd) || { echo "first_light: cannot create report dir $report" >&2; exit 2; }
cd "$(dirname "$0")/../.." || exit 2
budget=${FT_FIRST_LIGHT_BUDGET:-465}
[[ $budget =~ ^[0-9]+$ ]] && [ "$budget" -ge 10 ] || { echo "first_light: FT_FIRST_LIGHT_BUDGET=$budget is not a number of seconds >= 10" >&2; exit 2; }
# the time plan (the table above): plan_ids, plan_slot, plan_min; plan_total the slots' sum
plan_ids=() plan_slot=() plan_min=() plan_total=0
while read -r id sl mn; do
  plan_ids+=("$id"); plan_slot+=("$sl"); plan_min+=("$mn"); plan_total=$((plan_total + sl))
done < <(sed -n '/^#   phase  *slot/,/^#   total/p' tests/gpu/first_light.sh |
         sed -nE 's/^#   ([a-z0-9_-]+) +([0-9]+) +([0-9]+)( .*)?$/\1 \2 \3/p')
B=${FT_FIRST_LIGHT_BUILD:-build/first_light}   # (another folder: tests/test_first_light.sh's rehearsal)
deps=.deps
start=$(date +%s)
logs=$(mktemp -d /tmp/ft-first-light.XXXXXX)
trap 'rm -rf "$logs"' EXIT

# ---------------------------------------------------------------- the record
ids=() sts=() secs=() details=() subs=()
record() { ids+=("$1"); sts+=("$2"); secs+=("$3"); details+=("$4"); subs+=("${5:-}"); }
not_run() { record "$1" not_run 0 "$2"; echo "first_light: $1: not run: $2"; }
left() { echo $((budget - ($(date +%s) - start))); }
# plan_time ID: "SECONDS MIN" for phase ID now: until the end of its slot in the time plan
# (start + budget x (slots up to and including ID's) / plan_total), and its minimum
plan_time() {
  local i cum=0
  for i in "${!plan_ids[@]}"; do
    cum=$((cum + plan_slot[i]))
    if [ "${plan_ids[$i]}" = "$1" ]; then
      echo $((start + budget * cum / plan_total - $(date +%s))) $((plan_min[i] * budget / plan_total)); return 0
    fi
  done
  echo "first_light: phase $1 is not in the time plan (the table at the top)" >&2; echo "0 0"
}
# phase ID CMD...: run CMD (output in $logs/ID.log; FT_PHASE_LIMIT in its environment) until
# the end of ID's time in the plan (plan_time); records pass / fail / timeout with the
# command's last summary line, or not_run when its time is under its minimum, or when CMD
# exits 3 saying "not run: WHY" (a capability it lacks: a binary without --fp8); returns its status
phase() {
  local id=$1 t0 rc lim min detail
  shift
  read -r lim min < <(plan_time "$id")
  if [ "$lim" -lt 5 ] || [ "$lim" -lt "$min" ]; then
    not_run "$id" "the time plan leaves ${lim} s of the ${budget} s budget (its slot and what earlier phases left), under its minimum ${min} s"
    return 99
  fi
  echo "first_light: $id (limit ${lim} s) ..."
  t0=$(date +%s)
  timeout -k 5 "$lim" env FT_PHASE_LIMIT="$lim" "$@" >"$logs/$id.log" 2>&1
  rc=$?
  if [ $rc = 3 ] && detail=$(grep -m1 '^not run: ' "$logs/$id.log"); then
    not_run "$id" "${detail#not run: }"; return 3
  fi
  detail=$(grep -E '(: [0-9]+ passed, [0-9]+ failed|ERROR SUMMARY|RACECHECK SUMMARY)' "$logs/$id.log" | tail -1)
  [ -n "$detail" ] || detail=$(grep -v '^\s*$' "$logs/$id.log" | tail -1)
  local sub
  # test lines; a sanitizer's report lines (each hazard with its kernel, source line, threads)
  sub=$(grep -E '^(ok  |FAIL|skip)|^========= +[^ ]' "$logs/$id.log" | head -80)
  # a test that skips for want of a device fails here: this machine has one
  [ $rc = 0 ] && grep -q "SKIPPED" "$logs/$id.log" && rc=1 && detail="skipped: $(grep -m1 SKIPPED "$logs/$id.log")"
  case $rc in
    0) record "$id" pass $(($(date +%s) - t0)) "$detail" "$sub" ;;
    124|137) record "$id" timeout $(($(date +%s) - t0)) "stopped at its ${lim} s limit; last: $detail" "$sub" ;;
    *) record "$id" fail $(($(date +%s) - t0)) "exit $rc: $detail" "$sub" ;;
  esac
  echo "first_light: $id: ${sts[-1]} (${secs[-1]} s): ${details[-1]}"
  return $rc
}

# racecheck_judge LOG: a racecheck run whose every hazard is inside library code passes
# (tests/gpu/racecheck_judge.sh says why and how it decides)
racecheck_judge() {
  local lib
  lib=$(bash tests/gpu/racecheck_judge.sh "$1") || return
  sts[-1]=pass
  details[-1]="every hazard reported is inside library kernels, none in ours: $lib"
  echo "first_light: racecheck: pass after all: ${details[-1]}"
}

# ---------------------------------------------------------------- what this machine has
info_gpu="none" info_driver="-" info_nvcc="-" info_cuda="-" info_san="-" info_libs="-" info_bundle="-"
gpu_ok=0 why_gpu=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  why_gpu="no GPU: nvidia-smi is not installed (no NVIDIA driver)"
elif ! q=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1) || [ -z "$q" ]; then
  why_gpu="no GPU: nvidia-smi: $(head -1 <<<"$q")"
else
  gpu_ok=1
  gpu_name=$(head -1 <<<"$q" | cut -d, -f1 | xargs)
  info_gpu="$(wc -l <<<"$q") x $(head -1 <<<"$q" | cut -d, -f1 | xargs) ($(head -1 <<<"$q" | cut -d, -f4 | xargs))"
  info_driver=$(head -1 <<<"$q" | cut -d, -f2 | xargs)
  cc=$(head -1 <<<"$q" | cut -d, -f3 | xargs)
  sm=${cc/./}
  [[ $sm =~ ^[0-9]+$ ]] || { sm=90; cc="unknown (sm_90 assumed)"; }
  info_gpu+=", compute capability $cc"
fi

nvcc=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
cuda_home=/usr/local/cuda
[ -n "$nvcc" ] && [ ! -e "$cuda_home/include/cuda_runtime.h" ] && cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
[ -n "$nvcc" ] && info_nvcc=$("$nvcc" --version | tail -2 | head -1) && info_cuda=$cuda_home
san=$(command -v compute-sanitizer 2>/dev/null || ls "$cuda_home/bin/compute-sanitizer" "$cuda_home/compute-sanitizer/compute-sanitizer" 2>/dev/null | head -1)
[ -n "$san" ] && info_san=$san

# NCCL, cuDNN, cuBLASLt: the toolkit's, else the Python wheels' (nvidia-nccl-cu13, ...). A
# wheel's headers and the unversioned name `-l` needs are linked into .deps/links; the
# libraries themselves are found in the wheel's own lib folder (-rpath and LD_LIBRARY_PATH),
# never through a link: cuDNN 9's libcudnn.so.9 is a shim that dlopens libcudnn_graph.so.9,
# libcudnn_engines_*.so.9, ... from its own $ORIGIN (the folder it was loaded from), and
# libcudnn_engines_runtime_compiled finds NVRTC at $ORIGIN/../../cuda_nvrtc/lib; loaded
# through a link in another folder the shim finds nothing and aborts at its first call.
# (CUDA 13's wheels of cuBLAS, NVRTC and the runtime share one folder, nvidia/cu13/{include,lib};
# NCCL's and cuDNN's keep their own: nvidia/nccl, nvidia/cudnn)
wheel_dir() {
  python3 -c "import importlib.util as u; s = u.find_spec('nvidia.$1'); print(s.submodule_search_locations[0])" 2>/dev/null ||
  python3 -c "import importlib.util as u; s = u.find_spec('nvidia.cu13'); print(s.submodule_search_locations[0])" 2>/dev/null
}
wheel_libs=""
link_from_wheel() {   # link_from_wheel PKG HEADER LIB: 0 when the toolkit has it or a wheel does
  local pkg=$1 hdr=$2 lib=$3 w f
  if [ -e "$cuda_home/include/$hdr" ] && ls "$cuda_home"/lib*/"$lib"* >/dev/null 2>&1; then
    info_libs+=" $pkg:toolkit"; return 0
  fi
  w=$(wheel_dir "$pkg") && [ -e "$w/include/$hdr" ] || { info_libs+=" $pkg:MISSING"; return 1; }
  mkdir -p "$deps/links/include" "$deps/links/lib"
  for f in "$w"/include/*.h; do ln -sf "$f" "$deps/links/include/"; done
  for f in "$w"/lib/"$lib"*; do ln -sf "$f" "$deps/links/lib/$lib"; done   # for -l only
  wheel_libs+="${wheel_libs:+:}$w/lib"
  info_libs+=" $pkg:wheel($w)"
}
link_env=()
if [ $gpu_ok = 1 ] && [ -n "$nvcc" ]; then
  info_libs=""
  link_from_wheel nccl nccl.h libnccl.so
  link_from_wheel cublas cublasLt.h libcublasLt.so
  link_from_wheel cudnn cudnn.h libcudnn.so
  # NVRTC for cuDNN's runtime-compiled engines: the toolkit's, else its wheel
  if ! ls "$cuda_home"/lib*/libnvrtc.so* >/dev/null 2>&1 && w=$(wheel_dir cuda_nvrtc) && [ -d "$w/lib" ]; then
    wheel_libs+="${wheel_libs:+:}$w/lib"; info_libs+=" nvrtc:wheel($w)"
  fi
  if [ -n "$wheel_libs" ]; then
    export LD_LIBRARY_PATH="$wheel_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"   # every phase's processes
    rpath=""
    IFS=: read -ra dirs <<< "$wheel_libs"
    for f in "${dirs[@]}"; do rpath+=" -L$f -Wl,-rpath,$f"; done
    link_env=(CFLAGS="-I$PWD/$deps/links/include" LDLIBS="-L$PWD/$deps/links/lib$rpath")
  fi
fi

# jansson and OpenBLAS: the bundle (unpacked on first use), else the system's
deps_arg=()
if [ -e "$deps/root/usr/include/jansson.h" ]; then
  deps_arg=(DEPS_PREFIX="$PWD/$deps/root"); info_bundle="$deps/root ($(sed -n '1s/^# //p' "$deps/root/MANIFEST" 2>/dev/null))"
elif [ -e "$deps/bundle.tar.xz" ] && [ $gpu_ok = 1 ]; then
  # (tar needs xz for -J; Python's tarfile reads xz itself)
  if tar -C "$deps" -xJf "$deps/bundle.tar.xz" 2>"$logs/unpack.log" ||
     python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$deps/bundle.tar.xz" "$deps" 2>>"$logs/unpack.log"; then
    deps_arg=(DEPS_PREFIX="$PWD/$deps/root"); info_bundle="$deps/bundle.tar.xz, unpacked"
  else info_bundle="$deps/bundle.tar.xz does not unpack: $(tail -1 "$logs/unpack.log")"; fi
elif [ -e /usr/include/jansson.h ] && [ -e /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ]; then
  info_bundle="none (the system's jansson and OpenBLAS)"
else
  info_bundle="none, and the system lacks jansson or OpenBLAS (run scripts/gpu_bundle.sh on Debian 12 and carry .deps/bundle.tar.xz)"
fi

# ---------------------------------------------------------------- the checks
make_vars=(BUILD=$B CUDA=1 CUDA_HOME="$cuda_home" NVCC="$nvcc" NVCC_SASS_ARCHS="${sm:-90}" NVCC_PTX_ARCH=
           NVCC_EXTRA=-lineinfo "${deps_arg[@]}")
job=(--model_dir data/model --data_dir data/chess --batch_size_per_device 2 --total_batch_size 2
     --seq_len 128 --max_steps 2 --eval_every 0 --save_every 0 --max_eval_docs 4 --sample_tokens 0)
checks=(build fatbin test-gpu multi_rank bench fp8_loss memcheck racecheck synccheck soak deterministic)
# FT_FIRST_LIGHT_CHECKS="racecheck soak": run only these (and the build they need), e.g. to
# redo a failed check on a short lease; the others are reported not run
sel=${FT_FIRST_LIGHT_CHECKS:-}
only=" ${sel//,/ } "
selected() { [ -z "${FT_FIRST_LIGHT_CHECKS:-}" ] || [ "$1" = build ] || [[ $only == *" $1 "* ]]; }
phase_sel() {   # phase_sel ID ...: phase, or not_run when FT_FIRST_LIGHT_CHECKS leaves ID out
  if selected "$1"; then phase "$@"; else not_run "$1" "not selected (FT_FIRST_LIGHT_CHECKS=$FT_FIRST_LIGHT_CHECKS)"; fi
}
# bench: scripts/bench_gpu.py under the phase's limit (FT_PHASE_LIMIT, less 20 s for its
# report), its results as REPORT_DIR/bench_results/DATE-GPU.{json,md}; the check's lines are
# one per job and program (bench_gpu.py --kit_lines): "skip" with the reason for each program
# not run (under "Not run, and why"), a program that crashed fails the check
bench_phase() {
  local slug name
  selected bench || { not_run bench "not selected (FT_FIRST_LIGHT_CHECKS=$FT_FIRST_LIGHT_CHECKS)"; return; }
  slug=$(sed -E 's/^NVIDIA //; s/[^A-Za-z0-9]+/-/g; s/-+$//' <<<"${gpu_name:-gpu}" | tr 'A-Z' 'a-z')
  name=$(date -u +%F)-$slug
  mkdir -p "$report/bench_results"
  # (20 s of the phase kept for bench_gpu.py's report and the kill of a program past the deadline)
  phase bench bash -c 'l=$FT_PHASE_LIMIT; exec python3 scripts/bench_gpu.py --deadline_s $((l > 40 ? l - 20 : l / 2)) "$@"' bench \
    --jobs "${FT_BENCH_JOBS:-7b,7b32}" --batch_7b 16,4 --layers "${FT_BENCH_LAYERS:-8}" --steps "${FT_BENCH_STEPS:-5}" \
    --programs "${FT_BENCH_PROGRAMS:-finetune,finetune_fp8,torch_compile,liger,torch,finetune_bf16_moments}" \
    --bin "$B/finetune" --json "$report/bench_results/$name.json" --md "$report/bench_results/$name.md"
  [ "${sts[-1]}" = not_run ] && return
  local lines brc
  lines=$(python3 scripts/bench_gpu.py --kit_lines "$report/bench_results/$name.json" 2>&1); brc=$?
  [ $brc = 2 ] && return   # no JSON: the phase's own record stands
  subs[-1]=$(grep -v '^bench: ' <<<"$lines")
  local own=${details[-1]}
  details[-1]="$(tail -1 <<<"$lines"); bench_results/$name.{json,md}"
  [ "${sts[-1]}" = pass ] || details[-1]+="; $own"
  [ $brc = 1 ] && [ "${sts[-1]}" = pass ] && sts[-1]=fail
  echo "first_light: bench: ${sts[-1]}: ${details[-1]}"
}
# MPICH for multi_rank: the bundle's (mpiexec and its libraries from there), else the system's
mpi_env=() why_mpi=""
if [ ${#deps_arg[@]} -gt 0 ]; then
  if [ -e "$deps/root/usr/include/x86_64-linux-gnu/mpich/mpi.h" ] && [ -x "$deps/root/usr/bin/mpiexec" ]; then
    mpi_env=(PATH="$PWD/$deps/root/usr/bin:$PATH"
             LD_LIBRARY_PATH="$PWD/$deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  else why_mpi="no MPICH in the bundle (scripts/gpu_bundle.sh --without-mpi?)"; fi
elif ! pkg-config --exists mpich 2>/dev/null || ! command -v mpiexec >/dev/null; then
  why_mpi="no MPICH (pkg-config mpich, mpiexec) and no bundle"
fi
blocked=""
if [ $gpu_ok = 0 ]; then blocked=$why_gpu
elif [ -z "$nvcc" ]; then blocked="no CUDA toolkit: nvcc not found on PATH or in /usr/local/cuda/bin"
elif [[ $info_bundle == none,* ]] || [[ $info_bundle == *"does not unpack"* ]]; then blocked="no jansson/OpenBLAS: $info_bundle"
fi
if [ -n "$blocked" ]; then
  for c in "${checks[@]}"; do not_run "$c" "$blocked"; done
else
  standin=(); [ -z "$why_mpi" ] && standin=("$B/tests/libnccl_standin.so")   # (multi_rank's)
  if phase build env "${link_env[@]}" make -j"$(nproc)" "${make_vars[@]}" \
       "$B/finetune" "$B/tests/gpu/test_backend_gpu" "$B/tests/gpu/cuda_probe" "${standin[@]}"; then
    # the library path the build was linked for, for whoever runs $B/finetune next
    # (tests/gpu/gpu_session.sh's benchmark)
    printf 'export LD_LIBRARY_PATH=%q\n' "${LD_LIBRARY_PATH:-}" >"$B/env.sh"
    phase_sel fatbin python3 kernels/fatbin_check.py --sass "$sm" --ptx "" "$B"/nvcc/*.o
    # cuDNN's errors and warnings (why a plan was refused: the startup check's fallback line
    # carries only the last error) go to their own log, in the logs tarball
    phase_sel test-gpu env "${link_env[@]}" CUDNN_LOGERR_DBG=1 CUDNN_LOGWARN_DBG=1 CUDNN_LOGDEST_DBG="$logs/cudnn.log" \
      make "${make_vars[@]}" test-gpu
    if [ -n "$why_mpi" ]; then not_run multi_rank "$why_mpi"
    else
      phase_sel multi_rank env "${mpi_env[@]}" FT_SANITIZER="$san" bash tests/gpu/multi_rank_gpu.sh "$B" "$logs/multi_rank"
    fi
    bench_phase
    phase_sel fp8_loss bash tests/gpu/fp8_loss_gpu.sh "$B/finetune" cuda "$logs/fp8_loss"
    for tool in memcheck racecheck synccheck; do
      selected "$tool" || { not_run "$tool" "not selected (FT_FIRST_LIGHT_CHECKS=$FT_FIRST_LIGHT_CHECKS)"; continue; }
      if [ -z "$san" ]; then not_run "$tool" "compute-sanitizer not found (PATH, $cuda_home/bin)"; continue; fi
      rm -rf "$logs/san-$tool"
      # memcheck with the default attention (cuDNN: our workspace sizes for it); racecheck and
      # synccheck judge our kernels, not cuDNN's runtime-compiled ones (slow under them, and
      # a report inside library code would say nothing about ours)
      att=(); [ $tool != memcheck ] && att=(--attention native)
      phase "$tool" "$san" --tool "$tool" --error-exitcode 7 --print-limit 30 \
        "$B/finetune" --device cuda "${job[@]}" "${att[@]}" --out_dir "$logs/san-$tool"
      [ $? = 7 ] && [ $tool = racecheck ] && racecheck_judge "$logs/racecheck.log"
    done
    if [ -f tests/test_cuda_emu_soak.sh ] && grep -q FT_SOAK_BIN tests/test_cuda_emu_soak.sh; then
      phase_sel soak env FT_SOAK_BIN="$B/finetune" FT_SOAK_DEVICE=cuda bash tests/test_cuda_emu_soak.sh "$B"
    else
      phase_sel soak bash tests/gpu/soak_gpu.sh "$B/finetune" cuda "$logs/soak"
    fi
    phase_sel deterministic bash tests/gpu/deterministic_gpu.sh "$B/finetune" cuda "$logs/deterministic"
  else
    for c in "${checks[@]:1}"; do not_run "$c" "the build failed (see build)"; done
  fi
fi
total=$(($(date +%s) - start))

# ---------------------------------------------------------------- the reports
json_str() {   # a JSON string literal of $1
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/ }; s=${s//$'\r'/}
  printf '"%s"' "$(tr -d '\000-\010\013\014\016-\037' <<<"$s")"
}
count() { local n=0 s; for s in "${sts[@]}"; do [ "$s" = "$1" ] && n=$((n + 1)); done; echo $n; }
npass=$(count pass) nfail=$(count fail) ntime=$(count timeout) nnot=$(count not_run)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
date=$(date -u '+%Y-%m-%d %H:%M UTC')
md=$report/first_light.md
{
  echo "# First light: $date"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| commit | $commit |"
  echo "| host | $(hostname) ($(nproc) CPUs) |"
  echo "| GPU | $info_gpu |"
  echo "| driver | $info_driver |"
  echo "| nvcc | $info_nvcc ($info_cuda) |"
  echo "| compute-sanitizer | $info_san |"
  echo "| NCCL, cuBLASLt, cuDNN | ${info_libs# } |"
  echo "| jansson, OpenBLAS | $info_bundle |"
  echo "| time | ${total} s of a ${budget} s budget |"
  echo "| result | $npass passed, $nfail failed, $ntime timed out, $nnot not run |"
  echo
  echo "| check | status | seconds | detail |"
  echo "|---|---|---|---|"
  for i in "${!ids[@]}"; do echo "| ${ids[$i]} | ${sts[$i]} | ${secs[$i]} | ${details[$i]//|/\\|} |"; done
  echo
  echo "## Time plan"
  echo
  echo "Slots in priority order (tests/gpu/first_light.sh's table, scaled to the ${budget} s budget); a"
  echo "phase may also use what earlier ones left."
  echo
  echo "| phase | slot s | min s | used s | status |"
  echo "|---|---|---|---|---|"
  for j in "${!plan_ids[@]}"; do
    used=- st=-
    for i in "${!ids[@]}"; do [ "${ids[$i]}" = "${plan_ids[$j]}" ] && used=${secs[$i]} && st=${sts[$i]}; done
    echo "| ${plan_ids[$j]} | $((plan_slot[j] * budget / plan_total)) | $((plan_min[j] * budget / plan_total)) | $used | $st |"
  done
  echo
  echo "## Not run, and why"
  echo
  any=0
  for i in "${!ids[@]}"; do
    [ "${sts[$i]}" = not_run ] && { echo "- ${ids[$i]}: ${details[$i]}"; any=1; }
    while IFS= read -r l; do [[ $l == skip* ]] && { l=${l#skip}; l=${l#:}; l=${l# - }; echo "- ${ids[$i]}: ${l# }"; any=1; }; done <<<"${subs[$i]}"
  done
  [ $any = 0 ] && echo "(everything ran)"
  for i in "${!ids[@]}"; do
    [ -n "${subs[$i]}" ] || continue
    echo; echo "## ${ids[$i]}"; echo; echo '```'; echo "${subs[$i]}"; echo '```'
  done
} >"$md"
{
  printf '{"tool": "tests/gpu/first_light.sh", "date": %s, "commit": %s, "host": %s,\n' \
    "$(json_str "$date")" "$(json_str "$commit")" "$(json_str "$(hostname)")"
  printf ' "gpu": %s, "driver": %s, "nvcc": %s, "cuda_home": %s, "compute_sanitizer": %s,\n' \
    "$(json_str "$info_gpu")" "$(json_str "$info_driver")" "$(json_str "$info_nvcc")" \
    "$(json_str "$info_cuda")" "$(json_str "$info_san")"
  printf ' "libraries": %s, "bundle": %s, "seconds": %d, "budget_seconds": %d,\n' \
    "$(json_str "${info_libs# }")" "$(json_str "$info_bundle")" "$total" "$budget"
  printf ' "plan": ['
  for j in "${!plan_ids[@]}"; do
    [ "$j" -gt 0 ] && printf ', '
    printf '{"id": %s, "slot_seconds": %d, "min_seconds": %d}' "$(json_str "${plan_ids[$j]}")" \
      $((plan_slot[j] * budget / plan_total)) $((plan_min[j] * budget / plan_total))
  done
  printf '],\n'
  printf ' "summary": {"pass": %d, "fail": %d, "timeout": %d, "not_run": %d},\n' "$npass" "$nfail" "$ntime" "$nnot"
  printf ' "checks": ['
  for i in "${!ids[@]}"; do
    [ "$i" -gt 0 ] && printf ','
    printf '\n  {"id": %s, "status": %s, "seconds": %d, "detail": %s, "lines": [' \
      "$(json_str "${ids[$i]}")" "$(json_str "${sts[$i]}")" "${secs[$i]}" "$(json_str "${details[$i]}")"
    first=1
    while IFS= read -r l; do
      [ -n "$l" ] || continue
      [ $first = 1 ] || printf ', '
      json_str "$l"; first=0
    done <<<"${subs[$i]}"
    printf ']}'
  done
  printf '\n]}\n'
} >"$report/first_light.json"
# a device call brings back files of at most 16 MB: a log over 2 MB keeps its first and last MB
find "$logs" -path "$logs/san-*" -prune -o -type f -size +2M -print | while IFS= read -r f; do
  { head -c 1M "$f"; printf '\n[... %s bytes cut by first_light.sh ...]\n' "$(stat -c %s "$f")"; tail -c 1M "$f"; } >"$f.cut" && mv "$f.cut" "$f"
done
tar -C "$logs" --exclude="./san-*" --exclude="*.safetensors" -czf "$report/first_light_logs.tar.gz" . 2>/dev/null
echo "first_light: $npass passed, $nfail failed, $ntime timed out, $nnot not run in ${total} s; report in $md"
[ $((nfail + ntime)) -gt 0 ] && exit 1
[ "$nnot" -gt 0 ] && exit 3
exit 0
