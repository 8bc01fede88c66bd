#!/usr/bin/env bash
# sanitizer_logs.sh DIR: the last step of `make test-asan` (named so that `make test`, which
# runs every tests/test_*.sh, does not). Its suites run with ASAN_OPTIONS / UBSAN_OPTIONS
# log_path=DIR/..., so a report from any process they start (the C tests, and finetune itself
# under test_cli.sh and test_train.sh, whose checks may look only at its output or at files
# it wrote) lands in DIR even when the test that ran it passed. Any file there is a failure,
# printed whole.
set -u
build=build   # (lib.sh's $bin is not used here)
. "$(dirname "$0")/lib.sh" sanitizer_logs
dir=${1:?usage: sanitizer_logs.sh DIR}
if [ ! -d "$dir" ]; then bad "$dir: no such directory (the sanitizer log_path was not set up)"; finish; fi
n=0
for f in "$dir"/*; do
  [ -e "$f" ] || continue
  n=$((n + 1)); cat "$f"; bad "sanitizer report: $f"
done
[ $n -eq 0 ] && ok "no sanitizer report from any process of the sanitized suites ($dir is empty)"
finish
