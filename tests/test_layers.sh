#!/usr/bin/env bash
# tests/test_layers.sh [BUILD]: the layering rule of docs/architecture.md's Layout, from the include
# graph: a file of src/ or kernels/ includes no project header of a higher layer than its own
# (the same layer, or a lower one, is fine). The table below is the rule docs/architecture.md describes; a
# new module must be given a layer here, or this test fails naming it. Then a meta-check: an
# upward include planted in a copy of the tree must be caught. ~0.2 s.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_layers
cd "$(dirname "$0")/.." || exit 2

# layer number, then its modules (a module is a file name of src/ without .c/.h; every file
# of kernels/ is the module kernels)
layers=(
  "1 base:      common dtype rng watchdog arena wheel_lib"
  "2 compute:   backend backend_registry backend_cpu backend_cpu_internal backend_cpu_attention backend_cuda cuda_check kernels memory mfu"
  "3 transport: comm comm_mpi comm_nccl bootstrap bootstrap_pmi2"
  "4 files:     config safetensors fsutil data loader"
  "5 model:     model profile"
  "6 sharding:  fsdp"
  "7 job:       checkpoint ckpt plan plan_time schedule sample"
  "8 trainer:   train train_job train_log"
  "9 process:   options launch main"
  # modules of branches not merged yet (cudnn, lora), placed by their includes
  "2 compute:   attention_cudnn attention_cudnn_graph attention_ws"
  "5 model:     lora"
)
declare -A layer_of
for row in "${layers[@]}"; do
  n=${row%% *}
  for m in ${row#*:}; do layer_of[$m]=$n; done
done
module() { local b=${1##*/}; b=${b%.cuh}; b=${b%.cu}; b=${b%.[ch]}; echo "$b"; }

# violations ROOT: one line per upward include or module without a layer; none = empty
violations() {
  local f m inc l li
  for f in "$1"/src/*.[ch] "$1"/kernels/*.cu "$1"/kernels/*.cuh "$1"/kernels/*.h; do
    [ -e "$f" ] || continue
    m=$(module "$f")
    [[ $f == */kernels/* ]] && m=kernels   # kernels/ is one module: the CUDA kernels
    l=${layer_of[$m]:-}
    [ -n "$l" ] || { echo "${f#"$1"/}: module '$m' has no layer in tests/test_layers.sh"; continue; }
    while read -r inc; do
      li=${layer_of[$inc]:-}
      [ -z "$li" ] && continue   # not a project header (cuda_emu.h, ...)
      [ "$li" -le "$l" ] || echo "${f#"$1"/} (layer $l, $m) includes $inc.h (layer $li)"
    done < <(sed -nE 's/^#include "([a-z_0-9]+)\.(h|cuh)".*/\1/p' "$f")
  done
}

v=$(violations .)
if [ -z "$v" ]; then ok "src/ and kernels/: no include reaches a higher layer ($(ls src/*.[ch] kernels/*.cu* kernels/*.h 2>/dev/null | wc -l) files)"
else while IFS= read -r l; do bad "$l"; done <<<"$v"; fi

# meta-check: the rule can fail. A copy with model.h including train.h, and one with a module
# the table does not know, must each be reported.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src" "$tmp/kernels"
cp src/model.h src/backend.h "$tmp/src/"
sed -i '0,/^#include "backend.h"/s//#include "backend.h"\n#include "train.h"/' "$tmp/src/model.h"
v=$(violations "$tmp")
grep -q '^src/model.h (layer 5, model) includes train.h (layer 8)$' <<<"$v" \
  && ok "meta: a planted upward include (model.h -> train.h) is caught" || bad "meta: planted include not caught: '$v'"
: >"$tmp/src/newthing.c"
v=$(violations "$tmp")
grep -q "newthing.c: module 'newthing' has no layer" <<<"$v" \
  && ok "meta: a module without a layer is reported" || bad "meta: unknown module not reported: '$v'"
finish
