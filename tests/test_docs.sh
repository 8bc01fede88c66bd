#!/usr/bin/env bash
# tests/test_docs.sh [BUILD]: the documents stay navigable and agree with the tree.
# - every relative markdown link in README.md and docs/**/*.md points to an existing file, and
#   its #anchor, when it has one, to a heading of that file (GitHub's anchors);
# - the paths of src/, tests/, scripts/, slurm/, kernels/ and data/ that the documents name
#   exist (the dated reports in docs/results/ describe the tree as it was: left out);
# - docs/architecture.md's layer table agrees with tests/test_layers.sh;
# - README.md stays at most 260 lines (the front door: details go to docs/).
# Then meta-checks on planted trees: a broken link, a broken anchor, a missing path and a
# module in the wrong layer are caught; a link inside a code block is not taken for one.
# No build needed; ~1 s.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_docs
cd "$(dirname "$0")/.." || exit 2

readme_max_lines=260

# doc_files ROOT: README.md and every .md under ROOT/docs, one path (relative to ROOT) a line
doc_files() { (cd "$1" && { [ -e README.md ] && echo README.md; [ -d docs ] && find docs -name '*.md' | sort; }); }

# outside_fences FILE: FILE with the lines of fenced code blocks blanked (line numbers kept)
outside_fences() { awk '/^[ \t]*```/ { f = !f; print ""; next } { print (f ? "" : $0) }' "$1"; }

# anchors FILE: the anchor GitHub gives each heading of FILE, one a line
anchors() {
  outside_fences "$1" | sed -nE 's/^#{1,6}[ \t]+//p' | tr 'A-Z' 'a-z' \
    | sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'
}

# broken_links ROOT: one line per relative link of ROOT's documents whose file or anchor is
# missing ("FILE:LINE: TARGET: why")
broken_links() {
  local root=$1 f dir ln target path anchor
  while read -r f; do
    dir=$(dirname "$f")
    while IFS=: read -r ln target; do
      case $target in http://*|https://*|mailto:*) continue ;; esac
      path=${target%%#*}; anchor=
      [[ $target == *'#'* ]] && anchor=${target#*#}
      if [ -z "$path" ]; then path=$f
      else path=$(realpath -m --relative-to="$root" "$root/$dir/$path"); fi
      if [ ! -e "$root/$path" ]; then echo "$f:$ln: $target: no such file"; continue; fi
      if [ -n "$anchor" ] && [[ $path == *.md ]] && ! anchors "$root/$path" | grep -qxF -- "$anchor"; then
        echo "$f:$ln: $target: $path has no heading with anchor #$anchor"
      fi
    done < <(outside_fences "$root/$f" | perl -ne 'while (/\]\(([^)\s]+)\)/g) { print "$.:$1\n" }')
  done < <(doc_files "$root")
}

# missing_paths ROOT: one line per path under src/, tests/, scripts/, slurm/, kernels/ or data/ that
# a document outside docs/results/ names and ROOT does not hold (globs and absolute paths
# such as /data/chess are not paths of the tree)
missing_paths() {
  local root=$1 f p
  while read -r f; do
    [[ $f == docs/results/* ]] && continue
    while read -r p; do
      p=${p%.}
      [ -e "$root/$p" ] || echo "$f: names $p, which does not exist"
    done < <(perl -ne 'while (m#(?<![\w./-])((?:src|tests|scripts|slurm|kernels|data)/[\w./-]*)(?![\w*{\[-])#g) { print "$1\n" }' "$root/$f" | sort -u)
  done < <(doc_files "$root")
}

# layer_mismatches ROOT: one line per module of ROOT/docs/architecture.md's layer table (the
# backquoted names of its "| N name | modules | ... |" rows under "## Layout") that exists in
# ROOT (src/M.c or src/M.h; `kernels/` for the kernels) and that ROOT/tests/test_layers.sh
# places in another layer or in none. A module the table names that has no file (yet) is left
# out: the table may name the modules of a rename in flight. Prints "checked N" last.
layer_mismatches() {
  local root=$1 n mods m layer modules checked=0
  local -A rule=()
  while read -r n mods; do for m in $mods; do rule[$m]=$n; done
  done < <(sed -n '/^layers=(/,/^)/p' "$root/tests/test_layers.sh" | sed -nE 's/^ *"([0-9]+) [a-z]+: *([^"]*)".*/\1 \2/p')
  while IFS='|' read -r _ layer modules _; do
    n=$(grep -oE '^ *[0-9]+' <<<"$layer" | tr -d ' ')
    [ -n "$n" ] || continue
    for m in $(grep -oE '`[a-z_0-9/]+`' <<<"$modules" | tr -d '`'); do
      if [ "$m" = kernels/ ]; then m=kernels; [ -d "$root/kernels" ] || continue
      else [ -e "$root/src/$m.c" ] || [ -e "$root/src/$m.h" ] || continue; fi
      checked=$((checked + 1))
      [ "${rule[$m]:-none}" = "$n" ] \
        || echo "docs/architecture.md puts $m in layer $n, tests/test_layers.sh in layer ${rule[$m]:-none}"
    done
  done < <(sed -n '/^## Layout/,/^## [A-Z]/p' "$root/docs/architecture.md" | grep -E '^\| *[0-9]')
  echo "checked $checked"
}

# ------------------------------------------------------------------ the documents of this tree
n=$(doc_files . | wc -l)
v=$(broken_links .)
if [ -z "$v" ]; then ok "every relative link and anchor of README.md and docs/ resolves ($n documents)"
else while IFS= read -r l; do bad "$l"; done <<<"$v"; fi

v=$(missing_paths .)
if [ -z "$v" ]; then ok "every path of src/ tests/ scripts/ slurm/ kernels/ data/ the documents name exists"
else while IFS= read -r l; do bad "$l"; done <<<"$v"; fi

v=$(layer_mismatches .)
k=$(sed -n 's/^checked //p' <<<"$v"); v=$(grep -v '^checked ' <<<"$v")
if [ -z "$v" ] && [ "${k:-0}" -ge 20 ]; then ok "docs/architecture.md's layer table agrees with tests/test_layers.sh ($k modules)"
elif [ -z "$v" ]; then bad "docs/architecture.md's layer table: only ${k:-0} modules found (table moved or reformatted?)"
else while IFS= read -r l; do bad "$l"; done <<<"$v"; fi

# too_long FILE: one line when FILE has more than $readme_max_lines lines
too_long() {
  local n; n=$(wc -l <"$1")
  [ "$n" -le "$readme_max_lines" ] || echo "$1: $n lines, over $readme_max_lines: move the detail into docs/"
}
v=$(too_long README.md)
if [ -z "$v" ]; then ok "README.md: $(wc -l <README.md) lines (at most $readme_max_lines)"; else bad "$v"; fi

# ------------------------------------------------------------------ meta-checks
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs/sub" "$tmp/tests"
: >"$tmp/tests/test_here.sh"
cat >"$tmp/docs/sub/a.md" <<'EOF'
# A page

## Real heading (`--flag`)

Back to the [front](../../README.md#the-front) and [here](#a-page).
EOF
cat >"$tmp/README.md" <<'EOF'
# The front

Good: [a](docs/sub/a.md), [anchor](docs/sub/a.md#real-heading---flag), `tests/test_here.sh`.
Broken: [gone](docs/nope.md) and [bad anchor](docs/sub/a.md#no-such-heading).
Named but missing: `tests/test_gone.sh`. Generated: [flags](docs/flags.md).

```sh
[not a link](docs/in_a_fence.md)
```
EOF
v=$(broken_links "$tmp")
grep -qxF 'README.md:4: docs/nope.md: no such file' <<<"$v" \
  && ok "meta: a link to a missing file is caught" || bad "meta: missing file not caught: '$v'"
grep -qxF 'README.md:4: docs/sub/a.md#no-such-heading: docs/sub/a.md has no heading with anchor #no-such-heading' <<<"$v" \
  && ok "meta: a link to a missing anchor is caught" || bad "meta: missing anchor not caught: '$v'"
[ "$(grep -c . <<<"$v")" -eq 3 ] \
  && ok "meta: good links, anchors with code and punctuation, and a link in a code block pass" \
  || bad "meta: wanted exactly the three broken links, got: '$v'"
grep -qxF 'README.md:5: docs/flags.md: no such file' <<<"$v" \
  && ok "meta: a link to a generated document that is missing is caught" || bad "meta: missing generated document: '$v'"
v=$(missing_paths "$tmp")
[ "$v" = "README.md: names tests/test_gone.sh, which does not exist" ] \
  && ok "meta: a named path that does not exist is caught (and only it)" || bad "meta: missing path: '$v'"
mkdir -p "$tmp/lay/src" "$tmp/lay/tests" "$tmp/lay/docs"
: >"$tmp/lay/src/common.c"; : >"$tmp/lay/src/model.h"; : >"$tmp/lay/src/newmod.c"
printf '%s\n' 'layers=(' '  "1 base:   common"' '  "5 model:  model other"' ')' >"$tmp/lay/tests/test_layers.sh"
printf '%s\n' '## Layout' '| layer | modules | holds |' '|---|---|---|' '| 1 base | `common` | x |' \
  '| 4 files | `model` `ghost` `newmod` | y |' '## Next' '| 9 later | `common` | not the table |' >"$tmp/lay/docs/architecture.md"
v=$(layer_mismatches "$tmp/lay")
[ "$v" = "docs/architecture.md puts model in layer 4, tests/test_layers.sh in layer 5
docs/architecture.md puts newmod in layer 4, tests/test_layers.sh in layer none
checked 3" ] && ok "meta: a module in the wrong layer, and one without a layer, are caught (a name with no file is not)" \
  || bad "meta: layer table: '$v'"
seq 1 "$readme_max_lines" >"$tmp/fits.md"; seq 0 "$readme_max_lines" >"$tmp/long.md"
[ -z "$(too_long "$tmp/fits.md")" ] && [ -n "$(too_long "$tmp/long.md")" ] \
  && ok "meta: $readme_max_lines lines pass, $((readme_max_lines + 1)) are too long" || bad "meta: the length rule"
finish
