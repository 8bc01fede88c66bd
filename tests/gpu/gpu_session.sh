#!/usr/bin/env bash
# tests/gpu/gpu_session.sh [REPORT_DIR]: all a session lent a GPU runs, in ONE device call:
# since 2026-11-28 that is tests/gpu/first_light.sh alone, whose bench phase runs
# scripts/bench_gpu.py (issue 37 item 5: one call of at most 8 minutes). Kept because the
# dated reports in docs/results/ name it; the arguments, $OUT and the exit status are
# first_light.sh's. Its old variables map onto first light's: FT_GPU_SESSION_BUDGET sets
# FT_FIRST_LIGHT_BUDGET when that is not set.
#
# Device call (timeout_s leaves time for the machine's start and the copy back):
#   run(command="bash tests/gpu/gpu_session.sh", carry=[".deps/bundle.tar.xz"], timeout_s=540)
set -u
export FT_FIRST_LIGHT_BUDGET=${FT_FIRST_LIGHT_BUDGET:-${FT_GPU_SESSION_BUDGET:-465}}
exec bash "$(dirname "$0")/first_light.sh" "$@"
