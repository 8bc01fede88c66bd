#!/usr/bin/env bash
# scripts/build_config.sh OUT LINE...: write OUT, a C header defining FT_BUILD_CONFIG as the
# given lines ("name: value", one per argument, joined by newlines), only when its content
# differs from what OUT holds. The Makefile calls it on every run with the configuration it
# resolved (compiler, flags, the detected MPI / PMI2 / CUDA / BLAS and their paths); every
# object and binary depends on OUT, so a changed configuration (MPICH installed after a
# first build, another compiler, DEPS_PREFIX) rebuilds them, and an unchanged one rebuilds
# nothing. `finetune --version` prints the lines.
set -eu
out="$1"; shift
tmp="$out.tmp.$$"
{
  echo "// written by scripts/build_config.sh from the Makefile's resolved configuration"
  echo "#define FT_BUILD_CONFIG \\"
  for line in "$@"; do
    esc=$(printf '%s' "$line" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')
    printf '    "  %s\\n" \\\n' "$esc"
  done
  echo '    ""'
} >"$tmp"
if cmp -s "$tmp" "$out"; then rm -f "$tmp"; else mv -f "$tmp" "$out"; fi
