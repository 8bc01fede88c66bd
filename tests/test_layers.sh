#!/usr/bin/env bash
# tests/test_layers.sh [BUILD]: the layering rule of docs/architecture.md's Layout, from the include
# graph: a file of src/ or kernels/ includes no project header of a higher layer than its own
# (the same layer, or a lower one, is fine), and the modules' include graph has no cycle (two
# modules of one layer including each other, directly or around a loop; tsort finds them). A
# module is a file name without .c/.h (kernels/ is one module); an internal header counts as
# part of the module it serves (train_job.h: train). The table below is the one
# docs/architecture.md describes; a new module must be given a layer here, or this test fails naming it. Then
# meta-checks: an upward include, a module without a layer and an include cycle planted in a
# copy of the tree must each be caught. ~0.3 s.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_layers
cd "$(dirname "$0")/.." || exit 2

# layer number, then its modules (a module is a file name of src/ without .c/.h; every file
# of kernels/ is the module kernels)
layers=(
  "1 base:      common dtype rng watchdog arena wheel_lib fp8 bf16_sr"
  "2 compute:   backend backend_ops backend_registry backend_cpu backend_cpu_internal backend_cpu_attention backend_cpu_fp8 backend_cuda cuda_check kernels memory mfu attention_cudnn attention_cudnn_graph attention_ws attn_engine cuda_wait"
  "3 transport: comm comm_mpi comm_nccl bootstrap bootstrap_pmi2"
  "4 files:     config safetensors fsutil token_shard loader"
  "5 model:     model param_layout lora profile backend_count fp8_linear"
  "6 sharding:  fsdp"
  "7 job:       hf_checkpoint hf_export out_dir ckpt plan plan_time plan_timeline plan_price schedule sample"
  "8 trainer:   train train_job train_log preflight"
  "9 process:   options launch main plan_auto"
)
declare -A layer_of
for row in "${layers[@]}"; do
  n=${row%% *}
  for m in ${row#*:}; do layer_of[$m]=$n; done
done
# internal headers: the module they belong to (an include of one is an include of that module)
declare -A part_of=([train_job]=train)
module() { local b=${1##*/}; b=${b%.cuh}; b=${b%.cu}; b=${b%.[ch]}; echo "${part_of[$b]:-$b}"; }

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
    done < <(includes "$f")
  done
}

# the project headers file $1 includes, as module names
includes() { local inc; sed -nE 's/^#include "([a-z_0-9]+)\.(h|cuh)".*/\1/p' "$1" | while read -r inc; do module "$inc"; done; }

# cycles ROOT: one line per include cycle between modules ("include cycle: a b"); none = empty.
# The edges "m inc" of every project include between two modules go to tsort, which names the
# modules of each loop it meets (on stderr, one per line after "input contains a loop").
cycles() {
  local f m inc
  for f in "$1"/src/*.[ch] "$1"/kernels/*.cu "$1"/kernels/*.cuh "$1"/kernels/*.h; do
    [ -e "$f" ] || continue
    m=$(module "$f")
    [[ $f == */kernels/* ]] && m=kernels
    echo "$m $m"
    while read -r inc; do
      [ -n "${layer_of[$inc]:-}" ] && [ "$inc" != "$m" ] && echo "$m $inc"
    done < <(includes "$f")
  done | tsort 2>&1 >/dev/null | awk '/input contains a loop/ { if (c != "") print "include cycle:" c; c = ""; next }
                                        { sub(/^tsort: /, ""); c = c " " $0 }
                                        END { if (c != "") print "include cycle:" c }'
}

v=$(violations .)
if [ -z "$v" ]; then ok "src/ and kernels/: no include reaches a higher layer ($(ls src/*.[ch] kernels/*.cu* kernels/*.h 2>/dev/null | wc -l) files)"
else while IFS= read -r l; do bad "$l"; done <<<"$v"; fi
v=$(cycles .)
if [ -z "$v" ]; then ok "src/ and kernels/: no include cycle between modules"
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
# a cycle within one layer (the layer rule lets it pass): lora.h including model.h again, as
# it did before param_layout.h, while model.c includes lora.h
rm -f "$tmp/src/newthing.c"
cp src/model.c src/lora.h "$tmp/src/"
sed -i '0,/^#include "param_layout.h"/s//#include "param_layout.h"\n#include "model.h"/' "$tmp/src/lora.h"
[ -z "$(cycles "$tmp" | grep -v '^include cycle: model lora$\|^include cycle: lora model$')" ] && [ -n "$(cycles "$tmp")" ] \
  && ok "meta: a planted include cycle (model -> lora -> model) is caught" \
  || bad "meta: planted cycle not caught as model/lora: '$(cycles "$tmp")'"
sed -i '/^#include "model.h"$/d' "$tmp/src/lora.h"
[ -z "$(cycles "$tmp")" ] && ok "meta: without it, the copy has no cycle" || bad "meta: a cycle without the plant: '$(cycles "$tmp")'"
finish
