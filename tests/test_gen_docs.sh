#!/usr/bin/env bash
# test_gen_docs.sh BUILD_DIR: the generated references are current and complete.
#   docs/flags.md        = `finetune --help=markdown` (src/options.c's flag table)
#   docs/environment.md  = `finetune --help=env` (src/common.c's environment table)
# and that table against the sources, both ways: every FT_* (and CUEMU_*) name a getenv or
# ft_getenv call reads in src/ or tests/, and every ${FT_*...} a Slurm script reads, is in it;
# src/ reads FT_* names only through ft_getenv; every entry is read where its section says. Each
# check also runs on a changed copy, which it must reject (a check that cannot fail is none).
# `make docs` rewrites both files. Runtime: about a second.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_gen_docs

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# same_as WHAT FILE: FILE holds exactly what `finetune WHAT` prints (else the first difference)
same_as() {
  local out; out=$("$bin" "$1" 2>&1) || { echo "finetune $1 failed: $out"; return 1; }
  diff <(printf '%s\n' "$out") "$2" | head -4 | tr '\n' ' ' | grep . && return 1
  return 0
}
for pair in "--help=markdown docs/flags.md" "--help=env docs/environment.md"; do
  set -- $pair
  why=$(same_as "$1" "$2") && ok "$2 is what finetune $1 prints" \
    || bad "$2 is stale (make docs rewrites it): $why"
  # meta: one changed line, and one line gone, are both seen
  sed '0,/^| `/s/^| `\(.*\)$/| `\1 (changed)/' "$2" > "$tmp/changed.md"
  sed '0,/^| `/{/^| `/d}' "$2" > "$tmp/shorter.md"
  ! same_as "$1" "$tmp/changed.md" >/dev/null && ! same_as "$1" "$tmp/shorter.md" >/dev/null \
    && ok "meta: a copy of $2 with a row changed or gone is seen as stale" \
    || bad "meta: a changed copy of $2 passed as current"
done

# every flag of --help is a row of flags.md, with its default
help=$("$bin" --help)
nflags=$(grep -cE '^  --[a-z_]+ +.*\(default: ' <<<"$help")
nrows=$(grep -cE '^\| `--[a-z_]+` \| .* \| `[^`]*` \| ' docs/flags.md)
[ "$nflags" -gt 40 ] && [ "$nflags" = "$nrows" ] \
  && ok "flags.md has a row with a default for each of the $nflags flags" \
  || bad "flags.md: $nrows rows with a default, --help lists $nflags flags"
# help texts say what a flag does, not how far it was verified (README's status table does)
grep -qiE 'unverified|verified on' <<<"$help" \
  && bad "--help speaks of verification: $(grep -iE 'verified' <<<"$help" | cut -c1-60)" \
  || ok "--help says nothing about verification status"

emu=tests/cuda_emu; [ -d "$emu" ] || emu=emu   # the CUDA emulator (review: it may move to emu/)
# env_check ROOT TABLE: the names read under ROOT against the Markdown TABLE; prints one line per
# problem, fails if there is any
env_check() {
  local root=$1 table=$2 rc=0 name sec where
  local listed; listed=$(grep -oE '^\| `[A-Z][A-Z0-9_]+`' "$table" | tr -d '|` ' | sort -u)
  local code=("$root"/src/*.[ch] "$root"/tests/*.c "$root/$emu"/*.{c,cpp,cu,h} "$root"/tests/tools/*.c
              "$root"/tests/gpu/*.c "$root"/tests/slurm/*.c "$root"/tests/nccl_standin/*.c)
  # (a) every name read is listed
  for name in $( (grep -ohE 'getenv\("(FT|CUEMU)_[A-Z0-9_]+"' "${code[@]}" 2>/dev/null
                  grep -ohE '\$\{FT_[A-Z0-9_]+(:?-|\})' "$root"/slurm/*.sbatch "$root"/slurm/*.sh 2>/dev/null) |
                 grep -oE '(FT|CUEMU)_[A-Z0-9_]+' | sort -u); do
    grep -qx "$name" <<<"$listed" || { echo "$name is read but not in the table"; rc=1; }
  done
  # (b) src/ reads FT_* names through ft_getenv only
  local raw; raw=$(grep -nE '(^|[^_a-z])getenv\("FT_' "$root"/src/*.[ch] 2>/dev/null)
  [ -z "$raw" ] || { echo "getenv instead of ft_getenv: ${raw%%:*}:$(cut -d: -f2 <<<"$raw" | head -1)"; rc=1; }
  # (c) every entry is read where its section says
  while IFS='|' read -r sec name; do
    case $sec in
      "Read by finetune") where=$(grep -lF "ft_getenv(\"$name\")" "$root"/src/*.c 2>/dev/null) ;;
      "Set by launchers"*) where=$(grep -lF "\"$name\"" $(ls "$root"/src/*.c | grep -v '/common\.c$') 2>/dev/null) ;;
      "Read by the Slurm scripts") where=$(grep -lE "\\\$\\{$name(:?-|\\})" "$root"/slurm/* 2>/dev/null) ;;
      *) where=$(grep -lF "getenv(\"$name\")" "${code[@]}" 2>/dev/null) ;;
    esac
    [ -n "$where" ] || { echo "$name ($sec) is read nowhere"; rc=1; }
  done < <(awk '/^## /{sec=substr($0,4)} /^\| `[A-Z]/{n=$2; gsub(/`/,"",n); print sec "|" n}' "$table")
  return $rc
}
envmd=$("$bin" --help=env) || bad "finetune --help=env failed"
printf '%s\n' "$envmd" > "$tmp/env.md"
n=$(grep -c '^| `' "$tmp/env.md")
why=$(env_check . "$tmp/env.md") && [ "$n" -gt 40 ] \
  && ok "the environment table ($n names) matches the sources both ways" \
  || bad "environment table vs the sources: $(head -3 <<<"$why" | tr '\n' ';')"

# meta: a copy of the sources with each kind of mistake, one at a time
mkdir -p "$tmp/tree/tests" "$tmp/tree/$emu" && cp -r src slurm "$tmp/tree/" && cp -r "$emu"/. "$tmp/tree/$emu/" \
  && cp -r tests/*.c tests/tools tests/gpu tests/slurm tests/nccl_standin "$tmp/tree/tests/"
mutant() {   # mutant WHAT WANT FILE SED: FILE changed by SED (in the copy) must fail with WANT
  local what=$1 want=$2 file=$3 expr=$4 table=$tmp/env.md out
  cp "$tmp/tree/$file" "$tmp/keep" 2>/dev/null
  if [ "$file" = table ]; then table=$tmp/env_mutant.md; sed "$expr" "$tmp/env.md" > "$table"
  else sed -i "$expr" "$tmp/tree/$file"; fi
  out=$(env_check "$tmp/tree" "$table"); local rc=$?
  [ "$file" = table ] || cp "$tmp/keep" "$tmp/tree/$file"
  [ $rc -ne 0 ] && grep -qF "$want" <<<"$out" && ok "meta: $what -> $(grep -F "$want" <<<"$out" | head -1)" \
    || bad "meta: $what passed (rc $rc: $out)"
}
mutant "src/ reads a name not in the table" "FT_NOT_LISTED is read" src/model.c \
  's/ft_getenv("FT_LMHEAD_CHUNK_ROWS")/ft_getenv("FT_NOT_LISTED")/'
mutant "the emulator reads a name not in the table" "FT_EMU_NOT_LISTED is read" "$emu/cuda_emu_host.cpp" \
  's/getenv("FT_EMU_DEVICES")/getenv("FT_EMU_NOT_LISTED")/'
mutant "a Slurm script reads a name not in the table" "FT_NOT_LISTED is read" slurm/finetune_1node.sbatch \
  's/\${FT_BIN:-/${FT_NOT_LISTED:-/'
mutant "src/ calls getenv for an FT_ name" "getenv instead of ft_getenv" src/plan.c \
  's/ft_getenv("FT_HOST_MEMORY_BYTES")/getenv("FT_HOST_MEMORY_BYTES")/'
mutant "a table entry nothing reads" "FT_NEVER_READ (Read by finetune) is read nowhere" table \
  '/^| `FT_HOST_MEMORY_BYTES`/a | `FT_NEVER_READ` | user | read by nothing |'
mutant "a system entry nothing reads" "SLURM_NEVER_READ (Set by launchers" table \
  '/^| `PMI_RANK`/a | `SLURM_NEVER_READ` | read by nothing |'
mutant "an entry whose reader is gone" "FT_TEST_SAMPLE_SKEW (Read by finetune) is read nowhere" src/sample.c \
  's/ft_getenv("FT_TEST_SAMPLE_SKEW") != NULL/0/'

finish
