#!/usr/bin/env bash
# test_deps.sh BUILD_DIR: scripts/deps.sh, the dependency step of `make run` / `make check`
# and .ci/run, on a fake filesystem (DEPS_ROOT, an empty PATH) so nothing is installed:
#   1. with nothing present it names every package of its set in one apt-get line, exits 1;
#      for `run`, the demo's packages (stockfish, python3-matplotlib) alone missing: one line, exit 0
#      (DEPS_NO_INSTALL: what a non-root user sees; as root it would install them);
#   2. jansson and OpenBLAS found under DEPS_PREFIX (a folder of extracted .deb files, the
#      GPU-machine bundle) count as present, as do commands on PATH;
#   3. with everything present it prints nothing and exits 0;
#   4. the Makefile runs it for `make run` and stops before compiling when it fails;
#   5. the Makefile finds Slurm's pmi2.h and libpmi2 under the prefix of the srun on PATH.
# Runtime: under 2 s.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_deps
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/root"
deps() { env -i HOME="$HOME" PATH="$tmp/bin" DEPS_ROOT="$tmp/root" DEPS_NO_INSTALL=1 "$@" /bin/bash scripts/deps.sh "${args[@]}"; }

# 1. nothing present
args=(check); out=$(deps 2>&1); rc=$?
want="apt-get install -y --no-install-recommends build-essential libopenblas-openmp-dev libjansson-dev pgn-extract stockfish xz-utils python3 python3-matplotlib mpich libmpich-dev slurm-wlm munge libpmi2-0-dev"
[ $rc -eq 1 ] && [ "$(grep -c 'apt-get install' <<<"$out")" -eq 1 ] && grep -qF -- "$want" <<<"$out" \
  && ok "check, nothing present: one apt-get line with all 13 packages, rc 1" || bad "check, nothing present: rc $rc: $out"
args=(build); out=$(deps 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "install -y --no-install-recommends build-essential libopenblas-openmp-dev libjansson-dev" <<<"$out" \
  && ! grep -q stockfish <<<"$out" && ok "build, nothing present: the 3 build packages only, rc 1" || bad "build: rc $rc: $out"
args=(run); out=$(deps 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "install -y --no-install-recommends build-essential libopenblas-openmp-dev libjansson-dev stockfish python3-matplotlib" <<<"$out" \
  && ok "run, nothing present: the build and demo packages in one line, rc 1" || bad "run: rc $rc: $out"
args=(bogus); out=$(deps 2>&1); rc=$?
[ $rc -eq 2 ] && ok "unknown set: usage, rc 2" || bad "unknown set: rc $rc: $out"

# 2. a bundle under DEPS_PREFIX and commands on PATH
for c in cc make; do ln -s "$(command -v $c)" "$tmp/bin/$c"; done
b="$tmp/bundle"; mkdir -p "$b/usr/include/x86_64-linux-gnu/openblas-openmp" "$b/usr/lib/x86_64-linux-gnu/openblas-openmp"
touch "$b/usr/include/jansson.h" "$b/usr/lib/x86_64-linux-gnu/libjansson.so"
args=(build); out=$(deps DEPS_PREFIX="$b" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF "install -y --no-install-recommends libopenblas-openmp-dev" <<<"$out" && ! grep -q "jansson\|build-essential" <<<"$out" \
  && ok "jansson in DEPS_PREFIX and cc/make on PATH count as present" || bad "bundle: rc $rc: $out"
touch "$b/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h" "$b/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so"

# the demo's packages alone missing: `make run` goes on, naming the command that completes the demo
args=(run); out=$(deps DEPS_PREFIX="$b" 2>&1); rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -qF "for the whole demo" <<<"$out" && grep -qF "install -y --no-install-recommends stockfish python3-matplotlib" <<<"$out" \
  && ok "run with only stockfish and matplotlib missing: one line naming them, rc 0" || bad "run, demo missing: rc $rc: $out"

# 3. everything present
args=(build); out=$(deps DEPS_PREFIX="$b" 2>&1); rc=$?
[ $rc -eq 0 ] && [ -z "$out" ] && ok "build, all present (bundle): silent, rc 0" || bad "all present: rc $rc: $out"
mkdir -p "$tmp/root/usr/include/slurm" "$tmp/root/usr/games"; touch "$tmp/root/usr/include/slurm/pmi2.h"
for c in pgn-extract xz python3 mpiexec slurmctld munged; do printf '#!/bin/sh\n' > "$tmp/bin/$c"; chmod +x "$tmp/bin/$c"; done
printf '#!/bin/sh\n' > "$tmp/root/usr/games/stockfish"; chmod +x "$tmp/root/usr/games/stockfish"
printf '#!/bin/sh\n[ "$1 $2" = "--exists mpich" ]\n' > "$tmp/bin/pkg-config"; chmod +x "$tmp/bin/pkg-config"
args=(check); out=$(deps DEPS_PREFIX="$b" 2>&1); rc=$?
[ $rc -eq 0 ] && [ -z "$out" ] && ok "check, all present: silent, rc 0" || bad "check all present: rc $rc: $out"

# 4. the Makefile: `make run` stops at the dependency step, before compiling anything
out=$(env DEPS_ROOT="$tmp/root" DEPS_NO_INSTALL=1 PATH="$tmp/bin:/usr/bin:/bin" make -n run BUILD="$tmp/build" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -qF "apt-get install" <<<"$out" && ! grep -q "finetune --model_dir" <<<"$out" && [ ! -e "$tmp/build" ] \
  && ok "make run with a dependency missing: the apt-get line, no build, rc $rc" || bad "make run: rc $rc: $out"

# 5. the Makefile finds Slurm's pmi2.h and libpmi2 under the prefix of the srun on PATH (a
# cluster's Slurm in /opt/slurm, not the system's): -I on every compile, -L and an rpath at
# the link; SLURM_DIR= (empty) falls back to the system's header (or none)
s="$tmp/opt/slurm"; mkdir -p "$s/bin" "$s/include/slurm" "$s/lib64"; touch "$s/include/slurm/pmi2.h" "$s/lib64/libpmi2.so"
printf '#!/bin/sh\n' > "$s/bin/srun"; chmod +x "$s/bin/srun"
out=$(PATH="$s/bin:$PATH" make -n -B BUILD="$tmp/mk" "$tmp/mk/finetune" 2>&1); rc=$?
n_cc=$(grep -c -- "-DFT_HAVE_PMI2 -I$s/include" <<<"$out")
[ $rc -eq 0 ] && [ "$n_cc" -gt 10 ] && grep -q -- "-L$s/lib64 -Wl,-rpath,$s/lib64 .*-lpmi2" <<<"$out" && [ ! -e "$tmp/mk" ] \
  && ok "make: Slurm under the srun on PATH ($s): -I on $n_cc compiles, -L/rpath and -lpmi2 at the link" \
  || bad "make with srun in $s: rc $rc, $n_cc compiles with its -I: $(grep -- '-o .*/finetune$' <<<"$out")"
rm "$s/lib64/libpmi2.so"   # a header without the library: not taken (it would not link)
out=$(PATH="$s/bin:$PATH" make -n -B BUILD="$tmp/mk" "$tmp/mk/finetune" 2>&1)
! grep -q -- "$s" <<<"$out" && ok "make: pmi2.h under $s without libpmi2: not taken" || bad "header without libpmi2 taken"
out=$(PATH="$s/bin:$PATH" make -n -B BUILD="$tmp/mk" SLURM_DIR= "$tmp/mk/finetune" 2>&1)
! grep -q -- "$s" <<<"$out" && ok "make SLURM_DIR= (empty): nothing from $s" || bad "SLURM_DIR= still uses $s"

finish
