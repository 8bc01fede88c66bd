#!/usr/bin/env bash
# tests/test_func_length.sh [BUILD]: no function of src/*.c is longer than 80 lines (the
# style rule: a function reads on one screen), counted from the first line of its signature
# through its closing brace by a brace scan (tests/func_lengths.awk: comments, literals and
# preprocessor lines left out). An offender is named with its file, line and length. Then
# meta-checks on planted files: an 81-line function is caught and an 80-line one is not,
# braces inside strings, characters, comments and macros do not move the count, and a long
# initializer or struct is not taken for a function. ~0.2 s.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_func_length
cd "$(dirname "$0")/.." || exit 2
MAX=80
scan() { awk -f tests/func_lengths.awk "$@"; }

all=$(scan src/*.c)
n=$(printf '%s\n' "$all" | grep -c .)
long=$(printf '%s\n' "$all" | awk -v max=$MAX '$3 > max')
[ "$n" -gt 100 ] && ok "src/*.c: $n functions found by the scan" || bad "src/*.c: only $n functions found: the scan is broken"
if [ -z "$long" ]; then ok "src/*.c: no function over $MAX lines (longest: $(printf '%s\n' "$all" | sort -k3 -n | tail -1))"
else while read -r where name len; do bad "$where $name: $len lines, over $MAX (split it)"; done <<<"$long"; fi

# ---------------------------------------------------------------- meta-checks
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# plant FILE NAME BODY_LINES: a function of BODY_LINES + 2 lines (signature, body, brace)
plant() {
  { echo "static int $2(int x) {"
    for ((i = 0; i < $3; i++)); do echo "    x += $i;"; done
    echo "}"; } >>"$1"
}
{ echo '// a file of planted functions'; echo '#include <stdio.h>'; echo; } >"$tmp/planted.c"
plant "$tmp/planted.c" eighty_one 79
echo >>"$tmp/planted.c"
plant "$tmp/planted.c" exactly_eighty 78
v=$(scan "$tmp/planted.c")
grep -qx "$tmp/planted.c:4 eighty_one 81" <<<"$v" && ! awk -v max=$MAX '$3 > max && $2 != "eighty_one"' <<<"$v" | grep -q . \
  && grep -qx "$tmp/planted.c:86 exactly_eighty 80" <<<"$v" \
  && ok "meta: a planted 81-line function is caught (line 4, 81 lines), an 80-line one is not" \
  || bad "meta: planted functions measured as '$v'"

# braces in a string, a character, comments and a multi-line macro; a two-line
# signature (counted from its first line); a long initializer and a struct (not functions)
cat >"$tmp/tricky.c" <<'EOF'
static const int table[] = {
    1,
    2,
};
struct s {
    int a;
};
#define OPEN {
#define BLOCK(x) do { \
        x;           \
    } while (0)
static int
tricky(int x) {
    const char *s = "{ { {";   /* } } */
    char c = '{';   // }
    BLOCK(x++);
    return x + (s[0] == c);
}
int after(void) { return 0; }
EOF
v=$(scan "$tmp/tricky.c")
[ "$v" = "$tmp/tricky.c:12 tricky 7
$tmp/tricky.c:19 after 1" ] && ok "meta: literals, comments and macros hold no braces; initializers and structs are not functions" \
  || bad "meta: tricky.c measured as '$v'"
finish
