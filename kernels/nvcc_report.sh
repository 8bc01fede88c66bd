#!/bin/sh
# nvcc_report.sh LOG...: the per-kernel resource table from nvcc `-Xptxas -v` logs
# (one log per kernels/*.cu, written by `make nvcc-check`).
demangle() { if command -v c++filt >/dev/null 2>&1; then c++filt; else cat; fi; }
printf '%-14s %-6s %5s %6s %6s %6s %6s  %s\n' file arch regs smem stack spill_st spill_ld kernel
for log in "$@"; do
  file=$(basename "$log" .o.log)
  awk -v file="$file" '
    /Compiling entry function/ {
      match($0, /function \x27[^\x27]+\x27/); name = substr($0, RSTART + 10, RLENGTH - 11)
      match($0, /for \x27sm_[0-9a-z]+\x27/); arch = substr($0, RSTART + 5, RLENGTH - 6)
      stack = st = ld = 0 }
    /bytes stack frame/ {
      for (i = 1; i <= NF; i++) {
        if ($(i+1) == "bytes" && $(i+2) == "stack") stack = $i
        if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) ~ /^stores/) st = $i
        if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) ~ /^loads/) ld = $i } }
    /Used [0-9]+ registers/ {
      match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
      smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
      printf "%-14s %-6s %5d %6d %6d %6d %6d  %s\n", file, arch, regs, smem, stack, st, ld, name }
  ' "$log"
done | demangle | sed 's/(.*$//'
