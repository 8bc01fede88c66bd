#!/usr/bin/env bash
# scripts/deps.sh [build|run|check]: make sure this machine has what the build (build), `make
# run` (run: the build's libraries plus the demo's stockfish and matplotlib) or `make check`
# (check: the build's libraries plus the test tools) needs. The one list of
# system dependencies: the Makefile runs this before `make run` / `make check`, and .ci/run
# before anything else.
#
# Each dependency is probed by the file or command the build/tests use, not by package
# status, so headers and libraries found under $DEPS_PREFIX (a folder of extracted .deb
# files, for machines without a package manager) count as present. When something is
# missing: as root it apt-get installs the packages (Debian 12 names); otherwise it prints
# the one apt-get line to run and exits 1. Prints nothing when all is present. For `run`, the
# demo's packages (stockfish judges the sampled moves, python3-matplotlib draws metrics.png)
# are optional: as root they are installed with the rest; otherwise a line names the command
# that completes the demo and the run goes on without them (exit 0).
#   DEPS_PREFIX=DIR     also accept headers and libraries anywhere under DIR
#   DEPS_NO_INSTALL=1   print the apt-get line even as root (what a user sees; tests/test_deps.sh)
#   DEPS_ROOT=DIR       probe DIR/usr/... instead of /usr/... (tests/test_deps.sh only)
set -u
what="${1:-build}"
case "$what" in build|run|check) ;; *) echo "usage: scripts/deps.sh [build|run|check]" >&2; exit 2 ;; esac
prefix="${DEPS_PREFIX:-}"
root="${DEPS_ROOT:-}"
usr="$root/usr"
multiarch=$usr/lib/x86_64-linux-gnu

has_cmd() { command -v "$1" >/dev/null 2>&1 || [ -x "$usr/games/$1" ] || [ -x "$usr/sbin/$1" ]; }
# has_file NAME DIR...: NAME exists in one of DIRs, or anywhere under $DEPS_PREFIX
has_file() {
  local name="$1" d; shift
  for d in "$@"; do [ -e "$d/$name" ] && return 0; done
  [ -n "$prefix" ] && [ -d "$prefix" ] || return 1
  local found=("$prefix"/**/"$name")
  [ ${#found[@]} -gt 0 ]
}
shopt -s globstar nullglob

# a Python that can import matplotlib: the one on PATH or Debian's (scripts/plot_python.sh
# picks the same way when `make run` draws the plot)
has_matplotlib() {
  local py
  for py in python3 "$usr/bin/python3"; do "$py" -c 'import matplotlib' >/dev/null 2>&1 && return 0; done
  return 1
}

# package and the probe that says it is there
probe() {
  case "$1" in
    build-essential)        has_cmd cc && has_cmd make ;;
    libjansson-dev)         has_file jansson.h "$usr/include" && has_file libjansson.so $multiarch ;;
    libopenblas-openmp-dev) has_file cblas.h "$usr/include/x86_64-linux-gnu/openblas-openmp" &&
                            has_file libopenblas.so $multiarch/openblas-openmp ;;
    pgn-extract)            has_cmd pgn-extract ;;
    stockfish)              has_cmd stockfish ;;
    xz-utils)               has_cmd xz ;;
    python3)                has_cmd python3 ;;
    python3-matplotlib)     has_matplotlib ;;
    mpich)                  has_cmd mpiexec ;;
    libmpich-dev)           pkg-config --exists mpich 2>/dev/null ;;
    slurm-wlm)              has_cmd slurmctld ;;
    munge)                  has_cmd munged ;;
    libpmi2-0-dev)          has_file pmi2.h "$usr/include/slurm" ;;
    *) return 1 ;;
  esac
}

pkgs=(build-essential libopenblas-openmp-dev libjansson-dev)
demo=(stockfish python3-matplotlib)   # the demo's packages: optional for `run`
case "$what" in
  run)   pkgs+=("${demo[@]}") ;;
  check) pkgs+=(pgn-extract stockfish xz-utils python3 python3-matplotlib mpich libmpich-dev slurm-wlm munge libpmi2-0-dev) ;;
esac
find_missing() { missing=(); local p; for p in "${pkgs[@]}"; do probe "$p" || missing+=("$p"); done; }
find_missing
[ ${#missing[@]} -eq 0 ] && exit 0

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$EUID" -ne 0 ] || [ -n "${DEPS_NO_INSTALL:-}" ]; then
  required=0
  for p in "${missing[@]}"; do [ "$what" = run ] && [[ " ${demo[*]} " == *" $p "* ]] || required=1; done
  if [ $required = 0 ]; then
    echo "deps: for the whole demo (the sampled moves' legality, metrics.png), as root run: apt-get update && $line" >&2
    exit 0
  fi
  echo "deps: \`make $([ "$what" = check ] && echo check || echo run)\` needs packages this machine lacks; as root, run:" >&2
  echo "  apt-get update && $line" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
  echo "deps: apt-get failed; install by hand: $line" >&2
  exit 1
fi
find_missing
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: still missing after apt-get: ${missing[*]}" >&2
  exit 1
fi
