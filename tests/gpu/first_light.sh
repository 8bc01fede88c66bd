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
# Writes REPORT_DIR/first_light.md, first_light.json and first_light_logs.tar.gz (REPORT_DIR:
# $OUT when set, else the argument, else out/first_light). Every check is pass, fail,
# timeout or not_run, and each not run names why (no GPU, no compute-sanitizer, an earlier
# failure, the time budget). Phases have time limits that sum to under 8 minutes
# (FT_FIRST_LIGHT_BUDGET seconds, default 465) so that the whole run fits one H100 lease;
# a phase gets at most what is left. Exit 0: all ran and passed; 1: something failed or
# timed out; 3: nothing failed but something did not run (a machine without a GPU: all).
set -u
report=${OUT:-${1:-$(dirname "$0")/../../out/first_light}}
mkdir -p "$report" && report=$(cd "$report" && pwd) || { echo "first_light: cannot create report dir $report" >&2; exit 2; }
cd "$(dirname "$0")/../.." || exit 2
budget=${FT_FIRST_LIGHT_BUDGET:-465}
B=build/first_light
deps=.deps
start=$(date +%s)
logs=$(mktemp -d /tmp/ft-first-light.XXXXXX)
trap 'rm -rf "$logs"' EXIT

# ---------------------------------------------------------------- the record
ids=() sts=() secs=() details=() subs=()
record() { ids+=("$1"); sts+=("$2"); secs+=("$3"); details+=("$4"); subs+=("${5:-}"); }
not_run() { record "$1" not_run 0 "$2"; echo "first_light: $1: not run: $2"; }
left() { echo $((budget - ($(date +%s) - start))); }
# phase ID LIMIT CMD...: run CMD (output in $logs/ID.log) under min(LIMIT, what is left);
# records pass / fail / timeout with the command's last summary line; returns its status
phase() {
  local id=$1 limit=$2 t0 rc lim detail
  shift 2
  lim=$(left)
  [ "$lim" -gt "$limit" ] && lim=$limit
  if [ "$lim" -lt 5 ]; then not_run "$id" "the ${budget} s budget is spent"; return 99; fi
  echo "first_light: $id (limit ${lim} s) ..."
  t0=$(date +%s)
  timeout -k 5 "$lim" "$@" >"$logs/$id.log" 2>&1
  rc=$?
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
checks=(build fatbin test-gpu multi_rank memcheck racecheck synccheck soak deterministic)
# FT_FIRST_LIGHT_CHECKS="racecheck soak": run only these (and the build they need), e.g. to
# redo a failed check on a short lease; the others are reported not run
sel=${FT_FIRST_LIGHT_CHECKS:-}
only=" ${sel//,/ } "
selected() { [ -z "${FT_FIRST_LIGHT_CHECKS:-}" ] || [ "$1" = build ] || [[ $only == *" $1 "* ]]; }
phase_sel() {   # phase_sel ID ...: phase, or not_run when FT_FIRST_LIGHT_CHECKS leaves ID out
  if selected "$1"; then phase "$@"; else not_run "$1" "not selected (FT_FIRST_LIGHT_CHECKS=$FT_FIRST_LIGHT_CHECKS)"; fi
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
  if phase build 150 env "${link_env[@]}" make -j"$(nproc)" "${make_vars[@]}" \
       "$B/finetune" "$B/tests/gpu/test_backend_gpu" "$B/tests/gpu/cuda_probe" "${standin[@]}"; then
    # the library path the build was linked for, for whoever runs $B/finetune next
    # (tests/gpu/gpu_session.sh's benchmark)
    printf 'export LD_LIBRARY_PATH=%q\n' "${LD_LIBRARY_PATH:-}" >"$B/env.sh"
    phase_sel fatbin 10 python3 kernels/fatbin_check.py --sass "$sm" --ptx "" "$B"/nvcc/*.o
    # cuDNN's errors and warnings (why a plan was refused: the startup check's fallback line
    # carries only the last error) go to their own log, in the logs tarball
    phase_sel test-gpu 150 env "${link_env[@]}" CUDNN_LOGERR_DBG=1 CUDNN_LOGWARN_DBG=1 CUDNN_LOGDEST_DBG="$logs/cudnn.log" \
      make "${make_vars[@]}" test-gpu
    if [ -n "$why_mpi" ]; then not_run multi_rank "$why_mpi"
    else
      phase_sel multi_rank 150 env "${mpi_env[@]}" FT_SANITIZER="$san" bash tests/gpu/multi_rank_gpu.sh "$B" "$logs/multi_rank"
    fi
    for tool in memcheck racecheck synccheck; do
      lim=$([ $tool = racecheck ] && echo 55 || echo 40)
      selected "$tool" || { not_run "$tool" "not selected (FT_FIRST_LIGHT_CHECKS=$FT_FIRST_LIGHT_CHECKS)"; continue; }
      if [ -z "$san" ]; then not_run "$tool" "compute-sanitizer not found (PATH, $cuda_home/bin)"; continue; fi
      rm -rf "$logs/san-$tool"
      # memcheck with the default attention (cuDNN: our workspace sizes for it); racecheck and
      # synccheck judge our kernels, not cuDNN's runtime-compiled ones (slow under them, and
      # a report inside library code would say nothing about ours)
      att=(); [ $tool != memcheck ] && att=(--attention native)
      phase "$tool" "$lim" "$san" --tool "$tool" --error-exitcode 7 --print-limit 30 \
        "$B/finetune" --device cuda "${job[@]}" "${att[@]}" --out_dir "$logs/san-$tool"
      [ $? = 7 ] && [ $tool = racecheck ] && racecheck_judge "$logs/racecheck.log"
    done
    if [ -f tests/test_cuda_emu_soak.sh ] && grep -q FT_SOAK_BIN tests/test_cuda_emu_soak.sh; then
      phase_sel soak 100 env FT_SOAK_BIN="$B/finetune" FT_SOAK_DEVICE=cuda bash tests/test_cuda_emu_soak.sh "$B"
    else
      phase_sel soak 100 bash tests/gpu/soak_gpu.sh "$B/finetune" cuda "$logs/soak"
    fi
    phase_sel deterministic 40 bash tests/gpu/deterministic_gpu.sh "$B/finetune" cuda "$logs/deterministic"
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
