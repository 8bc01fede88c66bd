#!/usr/bin/env bash
# The Slurm test: a real Slurm on localhost (tests/slurm/cluster.sh: two simulated nodes with
# 4 CPUs and 4 fake GPUs each), the PMI2 bootstrap among 4 ranks on 2 nodes, then the shipped
# sbatch scripts running finetune on CPU ranks.
#
#   tests/slurm/test_slurm.sh [BUILD_DIR]      (default build; needs root, slurm-wlm, munge,
#                                               libpmi2-0-dev; finetune built with MPICH)
#
# 1. cluster up, both nodes idle, fake GPU gres visible
# 2. pmi2_exchange (built here with -lpmi2): singleton outside srun; under srun --mpi=pmi2 on
#    2 nodes x 2 ranks, rank 0's 128-byte id reaches every rank (same hash everywhere) and every
#    rank reads every other rank's value; a corrupted value is detected; the same from a batch
#    job (sbatch -> srun)
# 3. the sbatch scripts' own logic, with a stub finetune (prints its limits and arguments):
#    a. multi-node script submitted under a login node's `ulimit -S -l 64`: the job raises the
#       locked-memory limit to the hard one and says so, the ranks get the raised limit; no
#       --cpus-per-task asked: each rank gets the node's 4 CPUs / 1 task; the defaults the
#       script adds are omitted when the flags give them (an empty array under set -u)
#    b. a build without MPI and PMI2, 2 tasks: refused in one line before srun, nothing runs
#    c. the same build, 1 task: runs; the default periodic saves are added
# 4. when BUILD_DIR/finetune is linked with MPI (or FT_SLURM_TRAIN=1; FT_SLURM_TRAIN=0 skips):
#    a. slurm/finetune_multinode.sbatch, 2 nodes x 2 CPU ranks (HSDP: shard 2 x replicate 2):
#       COMPLETED, the validation loss fell, final/model.safetensors exists
#    b. slurm/finetune_1node.sbatch, 1 node x 4 ranks on the fake GPUs, SIGTERM to the steps
#       (what --signal=TERM@300 does before the time limit): saves and exits 0, job COMPLETED;
#       resubmitted with --resume latest it finishes, every step logged exactly once
#    c. srun --mpi=none -n 2: two tasks that cannot join each other each warn and train alone
#    d. finetune_1node.sbatch with --overwrite_out_dir --save_every 2, `scontrol requeue` once a
#       checkpoint is saved: the requeued run (SLURM_RESTART_COUNT=1) resumes from it instead of
#       starting over, both runs' logs are in the output file, every step logged exactly once
# The daemons are stopped at the end if this script started them. Last line:
# "test_slurm: N passed, M failed"; exit status non-zero on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-build}
case $BUILD in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
CLUSTER=$ROOT/tests/slurm/cluster.sh
export FT_SLURM_DIR=${FT_SLURM_DIR:-/tmp/ft-slurm}
export FT_DEVICE=${FT_DEVICE:-cpu}   # the sbatch scripts default to --device cuda; these are CPU ranks
export SLURM_CONF=$FT_SLURM_DIR/etc/slurm.conf

build=$BUILD
. "$ROOT/tests/lib.sh" test_slurm
t_start=$SECONDS TMP=""
finish_hook() {
    [ "$fail" -eq 0 ] || [ -z "${TMP:-}" ] || echo "test_slurm: outputs kept in $TMP"
    echo "test_slurm: $((SECONDS - t_start)) s"
}

# --- prerequisites: a missing Slurm is a skip on a developer machine, a failure in CI ------
missing=""
for b in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/bin/sbatch /usr/include/slurm/pmi2.h; do
    [ -e "$b" ] || missing="$missing $b"
done
[ "$(id -u)" = 0 ] || missing="$missing (root)"
if [ -n "$missing" ]; then
    skip_or_fail "Slurm test: missing$missing (apt-get install slurm-wlm munge libpmi2-0-dev; run as root)"
    finish
fi

TMP=$(mktemp -d /tmp/ft-slurm-test.XXXXXX)
started=0
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    if [ "$started" = 1 ] && [ "${FT_SLURM_KEEP:-0}" != 1 ]; then bash "$CLUSTER" stop >/dev/null 2>&1; fi
    if [ "$fail" -eq 0 ]; then rm -rf "$TMP"; fi
}
trap cleanup EXIT

# --- 1. cluster ------------------------------------------------------------------------------
bash "$CLUSTER" status >/dev/null 2>&1 || started=1
t0=$SECONDS
if bash "$CLUSTER" start </dev/null >"$TMP/cluster.log" 2>&1; then
    ok "cluster up in $((SECONDS - t0)) s ($(tail -1 "$TMP/cluster.log"))"
else
    bad "cluster start"; sed 's/^/  | /' "$TMP/cluster.log"; finish
fi
nodes=$(sinfo -h -N -o '%N %T %G' 2>&1 | sort -u)
check "two idle nodes with 4 fake GPUs each: $(tr '\n' ' ' <<<"$nodes")" \
    test "$(echo "$nodes" | grep -cE '^n[12] idle gpu:4')" = 2

# wait_job ID SECONDS: poll until the job leaves the queue; sets STATE and EXIT
wait_job() {
    local id=$1 limit=$2 t=0 line
    while :; do
        line=$(scontrol -o show job "$id" 2>/dev/null)
        STATE=$(sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
        EXIT=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$line")
        case $STATE in PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED | "") ;; *) return 0 ;; esac
        if [ "$t" -ge $((limit * 10)) ]; then
            scancel "$id" 2>/dev/null
            STATE="TEST_TIMEOUT($STATE)"
            return 1
        fi
        sleep 0.2
        t=$((t + 2))
    done
}
show() { echo "  | $1:"; tail -n "${2:-15}" "$1" 2>/dev/null | sed 's/^/  | /'; }

# --- 2. PMI2 ---------------------------------------------------------------------------------
mkdir -p "$BUILD/tests"
PX=$BUILD/tests/pmi2_exchange
if cc -std=gnu11 -O2 -Wall -Wextra -Werror "$ROOT/tests/slurm/pmi2_exchange.c" -o "$PX" -lpmi2 2>"$TMP/cc.log"; then
    ok "pmi2_exchange builds (-lpmi2)"
else
    bad "pmi2_exchange build"; show "$TMP/cc.log"; finish
fi

out=$(env -u PMI_FD "$PX" </dev/null 2>&1)
check "outside srun libpmi2 is a singleton (size 1): $out" grep -q 'rank 0/1 singleton' <<<"$out"

# verify_exchange FILE: 4 ranks, each once, all "peers ok", one id hash, 2 nodes x 2 ranks
verify_exchange() {
    local f=$1
    [ "$(grep -c '^pmi2_exchange: rank [0-3]/4 ' "$f")" = 4 ] || { echo "  | expected 4 rank lines"; return 1; }
    [ "$(grep -o 'rank [0-3]/4' "$f" | sort -u | wc -l)" = 4 ] || { echo "  | ranks not 0..3 once each"; return 1; }
    [ "$(grep -c ' peers ok$' "$f")" = 4 ] || { echo "  | a rank saw a wrong value"; return 1; }
    [ "$(grep -o 'id_fnv [0-9a-f]*' "$f" | sort -u | wc -l)" = 1 ] || { echo "  | ranks read different ids"; return 1; }
    [ "$(grep -o 'node n[12] local [01]/2' "$f" | sort -u | wc -l)" = 4 ] || { echo "  | not 2 nodes x 2 ranks"; return 1; }
}
t0=$SECONDS
srun --mpi=pmi2 -N 2 --ntasks-per-node=2 "$PX" </dev/null >"$TMP/px.out" 2>"$TMP/px.err"
rc=$?
if [ $rc = 0 ] && verify_exchange "$TMP/px.out"; then
    ok "srun --mpi=pmi2 -N 2 -n 4: 128-byte id from rank 0 and all-to-all values exchanged ($((SECONDS - t0)) s, $(grep -o 'id_fnv [0-9a-f]*' "$TMP/px.out" | head -1))"
else
    bad "srun --mpi=pmi2 -N 2 -n 4 exchange (rc $rc)"; show "$TMP/px.out"; show "$TMP/px.err"
fi

FT_PMI2_CORRUPT=2 srun --mpi=pmi2 -N 2 --ntasks-per-node=2 "$PX" </dev/null >"$TMP/pxc.out" 2>"$TMP/pxc.err"
rc=$?
if [ $rc != 0 ] && [ "$(grep -c 'value of rank 2 is wrong' "$TMP/pxc.err")" = 4 ]; then
    ok "a corrupted value (rank 2) is caught by all 4 ranks, srun exits $rc"
else
    bad "corrupted value not detected (rc $rc)"; show "$TMP/pxc.out"; show "$TMP/pxc.err"
fi

id=$(sbatch --parsable -N 2 --ntasks-per-node=2 --time=2 -o "$TMP/pxb-%j.out" \
    --wrap "srun --mpi=pmi2 $PX 0x5eed" </dev/null 2>"$TMP/pxb.err")
if [ -n "$id" ] && wait_job "$id" 60 && [ "$STATE" = COMPLETED ] && verify_exchange "$TMP/pxb-$id.out"; then
    ok "the same exchange in a batch job (sbatch -> srun --mpi=pmi2): job $id COMPLETED"
else
    bad "batch job exchange (job '$id' $STATE exit $EXIT)"; show "$TMP/pxb.err"; show "$TMP/pxb-$id.out"
fi

# the project's own GPU bootstrap (src/bootstrap_pmi2.c): a real ncclUniqueId from rank 0
# reaches every rank through the PMI2 KVS (built when CUDA, PMI2 and MPI are all present)
NX=$BUILD/tests/nccl_id_exchange
if [ -x "$NX" ]; then
    srun --mpi=pmi2 -N 2 --ntasks-per-node=2 "$NX" </dev/null >"$TMP/nx.out" 2>"$TMP/nx.err"
    rc=$?
    if [ $rc = 0 ] && [ "$(grep -c '^rank [0-3]/4 via Slurm PMI2: id [0-9a-f]*$' "$TMP/nx.out")" = 4 ] &&
        [ "$(grep -o 'id [0-9a-f]*' "$TMP/nx.out" | sort -u | wc -l)" = 1 ]; then
        ok "ncclUniqueId shared over PMI2 by src/bootstrap_pmi2.c among 4 ranks ($(grep -o 'id [0-9a-f]*' "$TMP/nx.out" | head -1))"
    else
        bad "nccl_id_exchange under srun --mpi=pmi2 (rc $rc)"; show "$TMP/nx.out"; show "$TMP/nx.err"
    fi
else
    skip_or_fail "$NX not built (needs the CUDA toolkit, libpmi2 and MPICH: CUDA=1 PMI2=1 MPI=1)"
fi

# --- 3. the scripts' own logic, with a stub finetune ------------------------------------------
# the scripts' jobs get --time well above their --signal=TERM@300 margin: with --time=5 or
# less Slurm sends that SIGTERM as soon as it looks, and finetune stops after its first step
JOB_MIN=10
# The stub answers --version with STUB_LAUNCHERS (default: what a build with MPI and PMI2
# prints) and otherwise prints what a rank would get: its locked-memory limit, its OpenMP
# threads and its arguments. The scripts find slurm/common.sh through FT_ROOT.
STUB=$TMP/stub-finetune
cat >"$STUB" <<'STUB_EOF'
#!/bin/bash
if [ "${1:-}" = --version ]; then
    printf 'finetune stub\nbackends: cpu\nlaunchers: %s\n' \
        "${STUB_LAUNCHERS:-single process, MPI (mpirun, or srun with MPICH), Slurm PMI2 (srun --mpi=pmi2)}"
    exit 0
fi
echo "stub: rank ${SLURM_PROCID:-?} on ${SLURMD_NODENAME:-?}: memlock $(ulimit -S -l), omp ${OMP_NUM_THREADS:-?}, args: $*"
STUB_EOF
chmod +x "$STUB"
NOMPI="single process only (built without MPI and PMI2)"

# a. a login node's 64 KB memlock limit (propagated by sbatch/srun); no --cpus-per-task under
#    --exclusive; every default given by the flags (--dp_shard, --device, --save_every): the
#    script adds nothing, its array of defaults stays empty
id=$( (ulimit -S -l 64 && FT_BIN=$STUB FT_ROOT=$ROOT sbatch --parsable --nodes=2 --ntasks-per-node=1 --gres=none \
    --time=$JOB_MIN -o "$TMP/stub-mn-%j.out" "$ROOT/slurm/finetune_multinode.sbatch" --dp_shard 1 --device cpu --save_every 5) \
    </dev/null 2>"$TMP/stub-mn.err")
log=$TMP/stub-mn-$id.out
if [ -n "$id" ] && wait_job "$id" 60 && [ "$STATE" = COMPLETED ]; then
    ok "finetune_multinode.sbatch with a stub finetune, submitted under ulimit -S -l 64: job $id COMPLETED"
else
    bad "stub multi-node job '$id' $STATE exit $EXIT"; show "$TMP/stub-mn.err"; show "$log" 30
fi
raised=$(sed -n 's/.* memlock \([0-9a-z]*\).* (raised from 64).*/\1/p' "$log")
check "the job raised the locked-memory limit from 64 to its hard limit (${raised:-?}) and said so in its header" \
    test -n "$raised" -a "$raised" != 64
check "both ranks got the raised limit (memlock $raised)" \
    test "$(grep -c "^stub: rank [01] on n[12]: memlock $raised," "$log")" = 2
check "no --cpus-per-task asked: each rank gets the node's 4 CPUs (OMP_NUM_THREADS=4)" \
    test "$(grep -c '^stub: rank [01] .*, omp 4, ' "$log")" = 2
check "defaults given by the flags: the script adds none (empty array under set -u)" \
    grep -q "^stub: rank 0 .*, args: --dp_shard 1 --device cpu --save_every 5\$" "$log"

# b. a build without MPI and PMI2 under srun with 2 tasks: refused before srun, in one line
id=$(FT_BIN=$STUB FT_ROOT=$ROOT STUB_LAUNCHERS=$NOMPI sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 \
    --time=$JOB_MIN -o "$TMP/stub-nompi-%j.out" "$ROOT/slurm/finetune_1node.sbatch" </dev/null 2>"$TMP/stub-nompi.err")
log=$TMP/stub-nompi-$id.out
wait_job "${id:-0}" 60
refused() {
    [ "$STATE" = FAILED ] && ! grep -q '^stub:' "$log" &&
        [ "$(grep -c "^finetune_1node: error: .* was built without MPI and PMI2 (launchers: $NOMPI), so its 2 tasks could not join one job; install MPICH" "$log")" = 1 ]
}
check "a build without MPI and PMI2, 2 tasks: job '$id' $STATE, one line naming the rebuild, nothing started" refused
refused || show "$log"

# c. the same build with 1 task is fine; the periodic saves are on by default
id=$(FT_BIN=$STUB FT_ROOT=$ROOT STUB_LAUNCHERS=$NOMPI sbatch --parsable --ntasks-per-node=1 --cpus-per-task=1 \
    --time=$JOB_MIN -o "$TMP/stub-one-%j.out" "$ROOT/slurm/finetune_1node.sbatch" --max_steps 3 </dev/null 2>"$TMP/stub-one.err")
log=$TMP/stub-one-$id.out
wait_job "${id:-0}" 60
ran_with_saves() {
    [ "$STATE" = COMPLETED ] &&
        grep -q '^stub: rank 0 .*, args: --device cpu --save_every 2000 --save_total_limit 2 --max_steps 3$' "$log"
}
check "the same build with 1 task runs (job '$id' $STATE), with periodic saves by default" ran_with_saves
ran_with_saves || show "$log"

# --- 4. finetune through the shipped scripts -------------------------------------------------
FT=$BUILD/finetune
train=${FT_SLURM_TRAIN:-auto}
if [ "$train" = auto ]; then
    if [ -x "$FT" ] && ldd "$FT" 2>/dev/null | grep -c 'libmpi' >/dev/null; then train=1; else train=0; fi   # not grep -q: SIGPIPE under pipefail
fi
if [ "$train" != 1 ]; then
    skip_or_fail "finetune under Slurm: $FT is missing or not built with MPI (make with libmpich-dev installed, or FT_SLURM_TRAIN=1)"
    finish
fi
export FT_BIN=$FT FT_ROOT=$ROOT
cd "$ROOT" || finish
SMALL=(--seq_len 64 --batch_size_per_device 2 --total_batch_size 8 --max_eval_docs 16 --learning_rate 3e-3)

# metrics helpers (metrics.jsonl: {"type":"train","step":N,"loss":X,...} and
# {"type":"eval","step":N,"val_loss":X,...})
evals() { grep '"type":"eval"' "$1" | sed -n 's/.*"val_loss":\([-0-9.eE+]*\).*/\1/p'; }
train_steps() { grep '"type":"train"' "$1" | grep '"loss":' | sed -n 's/.*"step":\([0-9]*\).*/\1/p'; }

# a. multi-node script: 2 nodes x 2 CPU ranks, HSDP (shard within a node, replicate across)
out=$TMP/mn
t0=$SECONDS
id=$(sbatch --parsable --nodes=2 --ntasks-per-node=2 --gres=none --cpus-per-task=1 --time=$JOB_MIN \
    -o "$TMP/mn-%j.out" slurm/finetune_multinode.sbatch "${SMALL[@]}" --max_steps 6 --out_dir "$out" \
    </dev/null 2>"$TMP/mn.err")
if [ -n "$id" ] && wait_job "$id" 150 && [ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ]; then
    ok "finetune_multinode.sbatch, 2 nodes x 2 ranks: job $id COMPLETED in $((SECONDS - t0)) s"
else
    bad "finetune_multinode.sbatch: job '$id' $STATE exit $EXIT"; show "$TMP/mn.err"; show "$TMP/mn-$id.out" 30
fi
log=$TMP/mn-$id.out
check "4 ranks, 2 per node, bootstrapped over PMI2 by srun" grep -q 'world 4 rank(s), 2 per node' "$log"
check "HSDP by default: --dp_shard 2 (the tasks per node)" grep -q 'dp_shard=2' "$log"
m=$out/metrics.jsonl
n=$(train_steps "$m" 2>/dev/null | wc -l)
check "6 train steps with a loss in metrics.jsonl (found $n)" test "$n" = 6
first=$(evals "$m" 2>/dev/null | head -1) last=$(evals "$m" 2>/dev/null | tail -1)
check "validation loss fell: $first -> $last" \
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && a + 0 > b + 0) }'
check "outputs: final/model.safetensors and checkpoints/latest" \
    test -s "$out/final/model.safetensors" -a -s "$out/checkpoints/latest"

# b. single-node script on the fake GPUs: preempted by SIGTERM, then resumed
out=$TMP/one
steps=20
t0=$SECONDS
id=$(sbatch --parsable --cpus-per-task=1 --time=$JOB_MIN -o "$TMP/one-%j.out" slurm/finetune_1node.sbatch \
    "${SMALL[@]}" --max_steps $steps --out_dir "$out" </dev/null 2>"$TMP/one.err")
# signal the steps (not srun or the batch shell), as --signal=TERM@300 does, once training runs
t=0
while [ -n "$id" ] && [ "$(train_steps "$out/metrics.jsonl" 2>/dev/null | wc -l)" -lt 2 ] && [ $t -lt 600 ]; do
    squeue -h -j "$id" 2>/dev/null | grep -q . || break
    sleep 0.2; t=$((t + 1))
done
[ -n "$id" ] && scancel --signal=TERM "$id" 2>/dev/null
if [ -n "$id" ] && wait_job "$id" 120 && [ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ]; then
    ok "finetune_1node.sbatch, 1 node x 4 ranks: SIGTERM -> job $id COMPLETED (exit 0) in $((SECONDS - t0)) s"
else
    bad "finetune_1node.sbatch + SIGTERM: job '$id' $STATE exit $EXIT"; show "$TMP/one.err"; show "$TMP/one-$id.out" 30
fi
log=$TMP/one-$id.out
check "the batch step saw the 4 fake GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3)" grep -q "GPUs '0,1,2,3'" "$log"
check "4 ranks on one node" grep -q 'world 4 rank(s), 4 per node' "$log"
stopped=$(sed -n 's/.*stopping after step \([0-9]*\) (signal received).*/\1/p' "$log")
check "finetune saved a checkpoint and stopped after step ${stopped:-?} of $steps" \
    test -n "$stopped" -a "${stopped:-0}" -lt $steps -a -s "$out/checkpoints/latest"

t0=$SECONDS
id=$(sbatch --parsable --cpus-per-task=1 --time=$JOB_MIN -o "$TMP/two-%j.out" slurm/finetune_1node.sbatch \
    "${SMALL[@]}" --max_steps $steps --out_dir "$out" --resume latest </dev/null 2>"$TMP/two.err")
if [ -n "$id" ] && wait_job "$id" 150 && [ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ]; then
    ok "resubmitted with --resume latest: job $id COMPLETED in $((SECONDS - t0)) s"
else
    bad "resume job '$id' $STATE exit $EXIT"; show "$TMP/two.err"; show "$TMP/two-$id.out" 30
fi
check "resumed at step ${stopped:-?}" grep -q "resumed from .* at step ${stopped:-x}\$" "$TMP/two-$id.out"
check "steps 1..$steps each logged exactly once across both jobs" \
    test "$(train_steps "$out/metrics.jsonl" 2>/dev/null | tr '\n' ' ')" = "$(seq -s ' ' 1 $steps) "
check "final/model.safetensors after the resumed run" test -s "$out/final/model.safetensors"

# c. srun without a PMI (--mpi=none): 2 tasks that cannot join each other each train alone,
#    and each says so (one --out_dir per task: a sweep in one step is legitimate)
srun --mpi=none -N 1 -n 2 --cpus-per-task=1 bash -c '"$FT_BIN" "$@" --out_dir "$0/$SLURM_PROCID" 2>"$0.$SLURM_PROCID.err"' \
    "$TMP/nopmi" "${SMALL[@]}" --max_steps 1 </dev/null >"$TMP/nopmi.out" 2>&1
rc=$?
n=$(cat "$TMP"/nopmi.*.err 2>/dev/null | grep -c "warning: this process is one of 2 tasks (SLURM_STEP_NUM_TASKS=2) but joined none")
check "srun --mpi=none -n 2: both tasks trained alone (rc $rc) and each warned ($n warnings)" \
    test $rc = 0 -a "$n" = 2 -a -s "$TMP/nopmi/0/final/model.safetensors" -a -s "$TMP/nopmi/1/final/model.safetensors"

# d. a requeued job (node failure, preemption; here scontrol requeue) runs the script again with
#    the first submission's flags: it must continue from its checkpoint, not start over
out=$TMP/rq
steps=40
t0=$SECONDS
id=$(sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 --time=$JOB_MIN -o "$TMP/rq-%j.out" slurm/finetune_1node.sbatch \
    "${SMALL[@]}" --max_steps $steps --save_every 2 --overwrite_out_dir --out_dir "$out" </dev/null 2>"$TMP/rq.err")
t=0
while [ -n "$id" ] && [ ! -e "$out/checkpoints/step_00000004" ] && [ $t -lt 600 ]; do
    squeue -h -j "$id" 2>/dev/null | grep -q . || break
    sleep 0.2; t=$((t + 1))
done
[ -n "$id" ] && scontrol requeue "$id" 2>"$TMP/rq-requeue.err"
# a requeued job may start again after AuthInfo's cred_expire (30 s in tests/slurm/cluster.sh)
if [ -n "$id" ] && wait_job "$id" 240 && [ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ]; then
    ok "finetune_1node.sbatch requeued after its step-4 checkpoint: job $id COMPLETED in $((SECONDS - t0)) s"
else
    bad "requeued job '$id' $STATE exit $EXIT"; show "$TMP/rq.err"; show "$TMP/rq-requeue.err"; show "$TMP/rq-$id.out" 40
fi
log=$TMP/rq-$id.out
check "the first run was stopped by the requeue" grep -q "CANCELLED AT .* DUE TO JOB REQUEUE" "$log"
check "the requeued run said it continues: --resume auto, without --overwrite_out_dir" \
    grep -q '^finetune_1node: requeued (SLURM_RESTART_COUNT=1): continuing with --resume auto, without --overwrite_out_dir$' "$log"
resumed=$(sed -n 's/^finetune: resumed from .*step_0*\([0-9]*\) at step \([0-9]*\)$/\2/p' "$log")
check "it resumed from its checkpoint at step ${resumed:-?} (>= 4), not from step 1" test "${resumed:-0}" -ge 4
check "--open-mode=append: both runs' logs in the output file (2 headers, step 1 once)" \
    test "$(grep -c "^finetune_1node: job $id on " "$log")" = 2 -a "$(grep -c "^step  *1/$steps " "$log")" = 1
check "steps 1..$steps each logged exactly once in metrics.jsonl across both runs" \
    test "$(train_steps "$out/metrics.jsonl" 2>/dev/null | tr '\n' ' ')" = "$(seq -s ' ' 1 $steps) "
check "final/model.safetensors after the requeued run" test -s "$out/final/model.safetensors"

finish
