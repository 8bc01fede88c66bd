# tests/func_lengths.awk FILE...: one line "FILE:LINE NAME LENGTH" per C function definition,
# LENGTH its lines from the first line of its signature through its closing brace. A brace
# scan, not a parser: comments, string and character literals and preprocessor lines (with
# their continuations) are left out; a top-level brace whose item has a ( ) and no = before
# it opens a function (a struct, enum or initializer does not). Used by test_func_length.sh.

# the code of one line: strings and characters blanked, comments dropped (in_block carries
# a /* comment over lines)
function code(s,    out, i, n, c, q) {
    out = ""; i = 1; n = length(s)
    while (i <= n) {
        if (in_block) {
            c = index(substr(s, i), "*/")
            if (!c) return out
            i += c + 1; in_block = 0; continue
        }
        c = substr(s, i, 1)
        if (substr(s, i, 2) == "//") return out
        if (substr(s, i, 2) == "/*") { in_block = 1; i += 2; continue }
        if (c == "\"" || c == "'") {
            q = c; i++
            while (i <= n && substr(s, i, 1) != q) { if (substr(s, i, 1) == "\\") i++; i++ }
            i++; out = out " "; continue
        }
        out = out c; i++
    }
    return out
}

FNR == 1 { depth = 0; in_block = 0; cont = 0; start = 0; sig = ""; is_func = 0 }
{
    if (cont) { cont = ($0 ~ /\\$/); next }
    if (!in_block && $0 ~ /^[ \t]*#/) { cont = ($0 ~ /\\$/); next }
    s = code($0)
    if (depth == 0) {
        if (!start && s ~ /[^ \t]/) start = FNR
        sig = sig " " s
    }
    n = length(s)
    for (i = 1; i <= n; i++) {
        c = substr(s, i, 1)
        if (c == "{") {
            if (depth == 0) {
                head = substr(sig, 1, length(sig) - n + i - 1)
                is_func = head ~ /\)/ && head !~ /=/
                if (is_func) {
                    name = head
                    sub(/[ \t]*\(.*/, "", name)
                    sub(/.*[^A-Za-z_0-9]/, "", name)
                    fstart = start
                }
            }
            depth++
        } else if (c == "}") {
            depth--
            if (depth == 0) {
                if (is_func) print FILENAME ":" fstart " " name " " (FNR - fstart + 1)
                is_func = 0; start = 0; sig = ""
            }
        } else if (c == ";" && depth == 0) {
            start = 0; sig = ""
        }
    }
}
