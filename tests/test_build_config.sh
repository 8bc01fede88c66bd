#!/usr/bin/env bash
# test_build_config.sh [BUILD]: a build remembers what it was built with and rebuilds when that
# changes (README's two commands in order on a fresh machine: `make run` builds before `make
# check` installs MPICH). In a scratch build folder (CUDA=0, PMI2=0 to keep it short):
#   1. MPICH hidden from the Makefile's detection (pkg-config finds nothing): --version says
#      "MPI: no", and `mpiexec -n 2` starts two lone processes, each a world of 1;
#   2. the same command with MPICH visible: the binary is rebuilt, --version says "MPI: yes",
#      and `mpiexec -n 2` joins the two processes into one world of 2 ranks;
#   3. once more unchanged: nothing is rebuilt (the binary's mtime stays), and `make -q` says
#      up to date; with MPICH hidden again `make -q` says out of date.
# Each build ~1 min on 2 cores (the C sources only). The BUILD argument is unused (own folder).
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_build_config
cd "$(dirname "$0")/.." || exit 2
command -v mpiexec >/dev/null && pkg-config --exists mpich 2>/dev/null ||
  { skip_or_fail "MPICH not installed (scripts/deps.sh check installs it)"; finish; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
b="$tmp/build"
mk() { make -s --no-print-directory -j2 BUILD="$b" CUDA=0 PMI2=0 "$b/finetune" >"$tmp/make.log" 2>&1; }
# bootstrap line of a 2-process launch of the tiny model's plan: "world N rank(s)" per process
world_line() { timeout 120 mpiexec -n 2 "$b/finetune" --model_dir data/model --data_dir data/chess --max_steps 1 \
  --eval_every 0 --save_every 0 --sample_tokens 0 --out_dir "$tmp/out$1" --overwrite_out_dir 2>&1 |
  grep -o 'world [0-9]* rank(s)' | sort | uniq -c | sed 's/^ *//'; }

PKG_CONFIG_LIBDIR=/nonexistent mk; rc=$?
check "build with MPICH hidden from pkg-config: exit 0 (rc $rc)" test $rc = 0
[ $rc = 0 ] || tail -5 "$tmp/make.log"
v1=$("$b/finetune" --version 2>&1)
check "--version names the build: MPI: no" grep -q '^  MPI: no' <<<"$v1"
n=$(grep -cE '^  (compiler|CFLAGS|LDLIBS|PMI2|CUDA|BLAS): ' <<<"$v1")
check "--version names the compiler, flags, PMI2, CUDA and BLAS ($n of 6 lines)" test "$n" = 6
check "launchers: single process only" grep -q 'single process only' <<<"$v1"
w=$(world_line 1)
check "mpiexec -n 2 on the MPI-less binary: two lone worlds of 1 ($w)" test "$w" = "2 world 1 rank(s)"
t1=$(stat -c %Y "$b/finetune")
sleep 1

mk; rc=$?
check "the same build with MPICH visible: exit 0 (rc $rc)" test $rc = 0
v2=$("$b/finetune" --version 2>&1)
check "--version now says MPI: yes" grep -q '^  MPI: yes' <<<"$v2"
check "launchers: MPI" grep -q 'launchers: .*MPI' <<<"$v2"
w=$(world_line 2)
check "mpiexec -n 2 on the rebuilt binary: one world of 2 ranks ($w)" test "$w" = "1 world 2 rank(s)"
t2=$(stat -c %Y "$b/finetune")
check "the binary was rebuilt" test "$t2" != "$t1"
n=$(ls "$b"/obj/*.o | wc -l); old=$(find "$b/obj" -name '*.o' ! -newer "$b/build_config.h" | wc -l)
check "every object is newer than the changed configuration ($old of $n older)" test "$old" = 0

sleep 1
mk
t3=$(stat -c %Y "$b/finetune")
check "an unchanged configuration rebuilds nothing" test "$t3" = "$t2"
# make -q / -n: an unchanged configuration is up to date (no FORCE'd header: the header is
# rewritten, only when it changes, while the Makefile is read), a changed one is not
make -q --no-print-directory BUILD="$b" CUDA=0 PMI2=0 "$b/finetune" >/dev/null 2>&1; rc=$?
check "make -q: up to date after an unchanged build (rc $rc)" test $rc = 0
n=$(make -n --no-print-directory BUILD="$b" CUDA=0 PMI2=0 "$b/finetune" 2>&1 | grep -c '^cc ')
check "make -n: nothing to compile ($n compiler lines)" test "$n" = 0
PKG_CONFIG_LIBDIR=/nonexistent make -q --no-print-directory BUILD="$b" CUDA=0 PMI2=0 "$b/finetune" >/dev/null 2>&1; rc=$?
check "make -q: out of date once MPICH is hidden again (rc $rc)" test $rc = 1
finish
