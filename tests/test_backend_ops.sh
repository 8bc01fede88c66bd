#!/usr/bin/env bash
# tests/test_backend_ops.sh [BUILD]: every op of struct backend (src/backend.h) is either in
# src/backend_ops.h's lists (the ops on backend memory, which --profile's and --fp8's wrappers
# forward: --fp8's forgets its remembered activation on each, so an op missing from the lists
# would leave a stale amax in use after it wrote that buffer) or in the table below of ops that
# write no backend memory a wrapper must see, each with its reason. A new op in neither fails
# here, naming it. Then a meta-check: a copy of backend_ops.h with one op removed must fail.
# ~0.1 s.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_backend_ops
cd "$(dirname "$0")/.." || exit 2

# the ops that need no watching: none writes a buffer the model's linears read
quiet=(
  attention_max_head_dim   # a number
  attention_prepare        # builds the attention plans at setup (their own workspace)
  attention_plan_counts    # counters
  close describe peak_tflops arena_usage   # the backend itself, a string, numbers
  alloc free host_alloc host_free          # memory handed out or back, not written
  synchronize copy_wait pace               # waits
)

# the function-pointer members of struct backend / the ops named in backend_ops.h ($1)
members() { grep -oE '\(\*[a-z_0-9]+\)\(' src/backend.h | sed -E 's/\(\*([a-z_0-9]+)\)\(/\1/' | sort -u; }
listed() { grep -oE '^ +X\([a-z_0-9]+,' "$1" | sed -E 's/ +X\(([a-z_0-9]+),/\1/' | sort -u; }
# the members in neither the lists of $1 nor the table above, one a line
unclassified() {
  comm -23 <(members) <( (listed "$1"; printf '%s\n' "${quiet[@]}") | sort -u)
}

n=$(members | wc -l)
u=$(unclassified src/backend_ops.h)
[ "$n" -ge 40 ] && [ -z "$u" ] && ok "all $n ops of struct backend are in backend_ops.h's lists ($(listed src/backend_ops.h | wc -l)) or named as writing nothing a wrapper watches" \
  || bad "ops of struct backend ($n found) in neither backend_ops.h nor this test's table: ${u:-none}"
stale=$(comm -13 <(members) <( (listed src/backend_ops.h; printf '%s\n' "${quiet[@]}") | sort -u))
[ -z "$stale" ] && ok "every name listed is an op of struct backend" || bad "listed but no op of struct backend: $stale"

# meta: backend_ops.h without fp8_cast's entry (two lines) must be caught, naming it
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -v -e '    X(fp8_cast,' src/backend_ops.h >"$tmp/ops.h"
[ "$(unclassified "$tmp/ops.h")" = fp8_cast ] && ok "meta: an op dropped from backend_ops.h is named" \
  || bad "meta: dropping fp8_cast from a copy gave '$(unclassified "$tmp/ops.h")'"
finish
