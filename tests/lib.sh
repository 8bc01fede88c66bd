# tests/lib.sh: what the shell suites share. Source it first:
#     . "$(dirname "$0")/lib.sh" test_name     (test_name: the summary line's name)
# then use $build (first argument, default "build") and $bin ($build/finetune).
#   ok MSG / bad MSG         count a pass ("ok   MSG") or a failure ("FAIL MSG"), on stdout
#   check MSG CMD ARGS..     ok MSG when CMD ARGS succeeds, else bad MSG
#   finish                   run the suite's finish_hook if it defines one (cleanup, notes),
#                            print "test_name: N passed, M failed", exit non-zero on failures
#   skip_or_fail WHY         a missing prerequisite: a failure when CI=true, else "skip: WHY"
#   expect_error SUB ARGS..  $bin ARGS must exit non-zero with exactly one stderr line containing SUB
#   train_field FILE STEP F  numeric field F of the train line of step STEP in metrics.jsonl FILE
#   metric DIR FIELD         numeric field FIELD of every train line of DIR/metrics.jsonl, one a line
#   step_logs DIR            the train lines of DIR/metrics.jsonl up to their timing fields
#                            (what two runs of the same job must reproduce exactly)
#   worst_rel REF GOT        worst |ref - got| / |ref| over two lists of numbers (one a line),
#                            printed as %.2e ("none" when empty)
#   le A B                   A is a number and A <= B
#   have_mpi                 finetune was built with MPI (its --version names the MPI launcher)
#                            and mpiexec is on PATH
#   kill_tree PID            SIGKILL every process below PID, then PID (our own processes only:
#                            never by a name pattern)
#   out_dir_removed NAME MODE OUT CMD..  CMD (a training job into --out_dir OUT, long enough) in
#                            the background; once OUT/metrics.jsonl holds 3 train records, OUT is
#                            removed (MODE removed) or replaced (MODE replaced: rm -rf, mkdir, and a
#                            .lock as a new job's), or only the file OUT/MODE is removed (MODE .lock
#                            or metrics.jsonl); the job must stop within 5 steps of it with rank 0's
#                            error naming what went (for OUT itself after one warning; for a file
#                            as the only line on stderr), exit non-zero, and leave the path as the
#                            test left it (nothing recreated; the new .lock kept)
#   strip_checksums FILE     FILE (a safetensors file) as an older build wrote it: __metadata__
#                            without the per-tensor checksums (finetune.checksum*)
#   flip_bit FILE            flip the lowest bit of the fp32 value in the middle of FILE's data
#                            area (it stays finite: only the checksum tells); prints the tensor's name
test_name="${1:?lib.sh: pass the suite name}"
build="${build:-build}"   # the suite sets it from its first argument before sourcing
bin="$build/finetune"
pass=0; fail=0

ok()  { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
finish() {
  [ "$(type -t finish_hook)" = function ] && finish_hook
  echo "$test_name: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
}
skip_or_fail() { if [ "${CI:-}" = true ]; then bad "$* (a prerequisite; CI=true)"; else echo "skip: $*"; fi; }

expect_error() {
  local want="$1"; shift
  local err rc
  err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$want"
  then ok "finetune $* -> $err"
  else bad "finetune $* -> rc=$rc, stderr: $err (wanted one line with '$want')"; fi
}

train_field() { grep "\"type\":\"train\",\"step\":$2," "$1" | sed -nE "s/.*\"$3\":([0-9.e+-]+).*/\1/p"; }

metric() { grep '"type":"train"' "$1/metrics.jsonl" | sed -E "s/.*\"$2\":([0-9.e+-]+).*/\1/"; }
step_logs() { grep '"type":"train"' "$1/metrics.jsonl" | sed -E 's/,"tokens_per_s".*//'; }
worst_rel() {
  paste <(printf '%s\n' "$1") <(printf '%s\n' "$2") | awk '
    { r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > w) w = r; n++ } END { if (n < 1) print "none"; else printf "%.2e", w }'
}
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 == a && a <= b) }'; }

# (the binary's own word: a .d file lists paths, never the -DFT_HAVE_MPI it was built with, and
# a build directory keeps comm_mpi.o and its .d from an earlier MPI=1 build after MPI=0)
have_mpi() {
  command -v mpiexec >/dev/null && "$bin" --version 2>/dev/null | grep -q '^launchers: .*MPI (mpirun'
}

descendants() {   # every process below $1, deepest last
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}
kill_tree() { local p; for p in $(descendants "$1") "$1"; do kill -9 "$p" 2>/dev/null; done; return 0; }

out_dir_removed() {
  local name=$1 mode=$2 o=$3 n=0 rc stop gone what; shift 3
  rm -rf "$o" "$o.log" "$o.err"
  "$@" > "$o.log" 2> "$o.err" &
  local pid=$!
  for _ in $(seq 1 600); do
    n=$(grep -c '"type":"train"' "$o/metrics.jsonl" 2>/dev/null); [ "${n:-0}" -ge 3 ] && break; sleep 0.05
  done
  n=$(grep -c '"type":"train"' "$o/metrics.jsonl" 2>/dev/null)   # the steps done before the removal
  case $mode in
    removed|replaced) rm -rf "$o"; gone="--out_dir $o"; what="--out_dir $mode" ;;
    *) rm "$o/$mode"; gone="$o/$mode"; what="$mode removed" ;;
  esac
  [ "$mode" = replaced ] && mkdir "$o" && echo "pid 1 on host another-job" > "$o/.lock"
  wait $pid; rc=$?
  stop=$(sed -nE "s|^finetune: error: (rank [0-9]+ \(host [^)]*\): )?stopping after step ([0-9]+): $gone .*|\2|p" "$o.err")
  local left warned; left=$(ls -A "$o" 2>/dev/null | tr '\n' ' ')
  warned=$(grep -cxF "finetune: warning: --out_dir $o was deleted or replaced while training: metrics, \
checkpoints and the export would be lost" "$o.err")
  if [ $rc -ne 0 ] && [ -n "$stop" ] && [ "$stop" -le $((n + 5)) ] \
     && case $mode in
          removed) [ "$warned" = 1 ] && [ ! -e "$o" ] ;;
          replaced) [ "$warned" = 1 ] && [ "$left" = ".lock " ] && grep -q another-job "$o/.lock" ;;
          *) [ "$(grep -c . "$o.err")" = 1 ] && [ ! -e "$o/$mode" ] ;;   # (OUT, made by the job: gone if empty)
        esac
  then ok "$name: $what after step $n: stopped after step $stop, rc=$rc: $(grep error: "$o.err")"
  else bad "$name: $what after step $n: rc=$rc, stop step '$stop', left in it: '$left', stderr: $(cat "$o.err"), stdout: $(tail -1 "$o.log")"; fi
}
strip_checksums() {
  python3 - "$1" <<'PY' || bad "could not strip the checksums of $1"
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"] = {k: v for k, v in h["__metadata__"].items() if not k.startswith("finetune.checksum")}
hb = json.dumps(h, separators=(",", ":")).encode(); hb += b" " * (-(8 + len(hb)) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
}
flip_bit() {
  python3 - "$1" <<'PY' || bad "could not flip a bit of $1"
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); off = (len(b) - 8 - n) // 2 // 4 * 4
b[8 + n + off] ^= 1
open(p, "wb").write(b)
print(next(k for k, v in h.items() if k != "__metadata__" and v["data_offsets"][0] <= off < v["data_offsets"][1]))
PY
}
