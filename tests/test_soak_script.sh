#!/usr/bin/env bash
# test_soak_script.sh BUILD_DIR: tests/gpu/soak_gpu.sh, which first light runs on a real GPU
# (issue 11 item 4) and nothing else runs, driven end to end here on the emulated device
# (build/tests/finetune_emu --device cuda) with SOAK_STEPS=2: batch 4 straight and stopped at
# step 1 + resumed (step logs and the step-2 checkpoint bitwise equal), batch 1 with sampling,
# 4 validation games per evaluation (SOAK_EVAL_DOCS),
# both against the CPU. The numbers are the emulator's, not a GPU's: what this checks is the
# script (its flags, its out_dirs, its greps of finetune's output), so that a GPU lease is not
# spent on a script bug. ~40 s.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_soak_script
emu=$build/tests/finetune_emu
if [ ! -x "$emu" ]; then skip_or_fail "$emu not built (needs the CUDA toolkit's headers: make CUDA=1)"; finish; fi
out=$(SOAK_STEPS=2 SOAK_EVAL_DOCS=4 bash tests/gpu/soak_gpu.sh "$emu" cuda 2>&1); rc=$?
n_ok=$(grep -c '^ok ' <<<"$out"); n_bad=$(grep -c '^FAIL' <<<"$out")
[ $rc = 0 ] && [ "$n_bad" = 0 ] && [ "$n_ok" -ge 10 ] && ok "soak_gpu.sh on the emulated GPU: $(tail -1 <<<"$out")" \
  || bad "soak_gpu.sh on the emulated GPU: exit $rc, $n_ok ok, $n_bad FAIL: $(grep -m3 '^FAIL' <<<"$out")"
finish
