#!/usr/bin/env bash
# test_cli.sh BUILD_DIR: the finetune binary's flag handling and error reporting.
# Every bad input must give exactly one line on stderr naming the flag or file, and a
# non-zero exit code.
set -u
build="${1:-build}"
. "$(dirname "$0")/lib.sh" test_cli

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

help=$("$bin" --help); rc=$?
[ $rc -eq 0 ] && ok "--help exits 0" || bad "--help exit $rc"
for f in --model_dir --data_dir --out_dir --resume --eval_only --batch_size_per_device --total_batch_size --seq_len --pack \
         --gradient_checkpointing --learning_rate --lr_schedule --warmup_fraction --weight_decay --max_grad_norm \
         --max_steps --epochs --seed --eval_every --save_every --save_total_limit --save_dtype --no_fsdp --dp_shard --collective_timeout; do
  printf '%s\n' "$help" | grep -q -- "$f .*(default: " && ok "--help lists $f with its default" || bad "--help does not list $f with its default"
done

# --version: the source revision the Makefile recorded (git describe, or "unknown" outside a
# checkout), its backends and launchers, and the build's configuration (9 "  name: value" lines
# under "built with:", from build/build_config.h); nothing else runs
ver=$("$bin" --version 2>&1); rc=$?
[ $rc -eq 0 ] && grep -qE '^finetune ([0-9a-f]{7,}|v?[0-9][^ ]*|unknown)(-dirty)?$' <<<"$(head -1 <<<"$ver")" \
  && grep -q "^backends: cpu (fp32" <<<"$ver" && grep -q "^launchers: single process" <<<"$ver" && grep -qx "built with:" <<<"$ver" \
  && [ "$(grep -cE '^  (compiler|CFLAGS|LDLIBS|MPI|PMI2|CUDA|BLAS|DEPS_PREFIX|sanitizers): ' <<<"$ver")" = 9 ] \
  && [ "$(grep -c . <<<"$ver")" = 13 ] \
  && ok "--version: $(head -1 <<<"$ver")" || bad "--version exit $rc: $ver"
if git rev-parse --git-dir >/dev/null 2>&1; then
  rev=$(git rev-parse --short=7 HEAD)
  grep -q "^finetune .*$rev" <<<"$(head -1 <<<"$ver")" && ok "--version names this checkout's commit $rev" || bad "--version '$(head -1 <<<"$ver")', HEAD is $rev"
fi
printf '%s\n' "$help" | grep -q -- "--version" && ok "--help lists --version" || bad "--help does not list --version"
# --help=markdown and --help=env (docs/flags.md, docs/environment.md: tests/test_gen_docs.sh)
for kind in markdown:"# finetune flags" env:"# Environment variables"; do
  out=$("$bin" --help="${kind%%:*}" 2>&1); rc=$?
  [ $rc -eq 0 ] && [ "$(head -1 <<<"$out")" = "${kind#*:}" ] && ok "--help=${kind%%:*} exits 0 with its heading" \
    || bad "--help=${kind%%:*}: rc $rc, first line '$(head -1 <<<"$out")'"
done
expect_error "flag --help: 'bogus' is not one of markdown|env" --help=bogus

expect_error "unknown flag '--bogus'" --bogus
expect_error "flag --fp8 needs --device cuda" --eval_only --fp8
expect_error "--batch_size_per_device: 0 is out of range" --eval_only --batch_size_per_device 0
# the bounds exactly as the flag takes them (%g printed 1048576 as 1.04858e+06, and --beta2's
# upper bound 0.999999999 as 1: "1 is out of range [0, 1]")
expect_error "--seq_len: 1 is out of range [2, 1048576]" --eval_only --seq_len 1
expect_error "--beta2: 1 is out of range [0, 0.999999999]" --eval_only --beta2 1
expect_error "--seq_len: 'abc' is not an integer" --eval_only --seq_len abc
expect_error "--seq_len needs a value" --eval_only --seq_len
expect_error "--eval_only: 'maybe' is not true/false" --eval_only=maybe
# the estimate's device and placement flags (--dry_run_device names one device of the table,
# and only a dry run's --auto plans for it)
expect_error "flag --dry_run_device: 'b200' is part of no device name or of more than one; the devices: A100-SXM4-80GB, H100-SXM5-80GB, H200-SXM-141GB" \
  --dry_run --auto --dry_run_device b200
expect_error "flag --dry_run_device: 'sxm' is part of no device name" --dry_run --auto --dry_run_device sxm
expect_error "flag --dry_run_device is for --dry_run --auto" --dry_run --dry_run_device h200
expect_error "flag --dry_run_device is for --dry_run --auto" --auto --dry_run_device h200
expect_error "--dry_run_gpus_per_node: -1 is out of range [0, 4096]" --dry_run --dry_run_gpus_per_node -1
expect_error "$tmp/none/config.json" --eval_only --model_dir "$tmp/none"
mkdir -p "$tmp/m"; echo '[1,2]' > "$tmp/m/config.json"
expect_error "$tmp/m/config.json" --eval_only --model_dir "$tmp/m"
cp tests/golden/mha/config.json "$tmp/m/config.json" || bad "cannot copy tests/golden/mha/config.json"
expect_error "no val shards" --eval_only --model_dir "$tmp/m" --data_dir "$tmp" --seq_len 32
expect_error "exceeds the model's max_position_embeddings" --eval_only --model_dir tests/golden/mha --seq_len 100000
# a path past PATH_MAX: one line saying so (ft_path), never a truncated path created
long="$tmp/$(printf 'x%.0s' $(seq 1 4200))"
err=$("$bin" --max_steps 1 --out_dir "$long" 2>&1 >/dev/null); rc=$?
if [ $rc -ne 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == *"path too long (4"* ]] && [ ! -e "$long" ]
then ok "--out_dir past PATH_MAX -> ${err:0:80}..."; else bad "--out_dir past PATH_MAX -> rc=$rc, stderr: ${err:0:200}"; fi

# --profile: per step, the phase totals and each phase's ops (about 1 s)
prof=$("$bin" --profile --max_steps 2 --seq_len 32 --batch_size_per_device 2 --total_batch_size 2 --max_eval_docs 2 \
       --out_dir "$tmp/prof" 2>&1); rc=$?
[ $rc -eq 0 ] && ok "--profile run exits 0" || bad "--profile run exit $rc: $(printf '%s' "$prof" | tail -1)"
[ "$(printf '%s\n' "$prof" | grep -c '^profile step [12] (ms, op ms/calls): .* = forward .* + backward .* + optimizer .* + comm .* + other')" -eq 2 ] \
  && ok "--profile prints the phase totals of each step" \
  || bad "--profile: no 'profile step N ... = forward + backward + optimizer + comm + other' line per step"
for want in "forward .*attention_fwd" "backward .*attention_bwd" "optimizer .*adamw"; do
  printf '%s\n' "$prof" | grep -Eq "^  $want" && ok "--profile op line '$want'" || bad "--profile: no op line matching '$want'"
done

# scripts/plot_metrics.py (make run's curves): --help prints the usage, bad input gives one line
# naming the file and exits non-zero (it used to crash: '--help/metrics.jsonl' not found, a raw
# traceback for a missing OUT_DIR or a missing matplotlib)
out=$(python3 scripts/plot_metrics.py --help 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^usage: plot_metrics.py OUT_DIR \[PNG\]" <<<"$out" && ok "plot_metrics.py --help: usage, exit 0" \
  || bad "plot_metrics.py --help: rc $rc: $(head -2 <<<"$out")"
pm_err() {   # pm_err SUBSTRING OUT_DIR: one line containing SUBSTRING, exit non-zero
  local err rc
  err=$(python3 scripts/plot_metrics.py "$2" 2>&1 >/dev/null); rc=$?
  [ $rc -ne 0 ] && [ "$(grep -c . <<<"$err")" = 1 ] && [[ "$err" == *"$1"* ]] && ok "plot_metrics.py: $err" \
    || bad "plot_metrics.py $2: rc $rc, '$err' (want one line with '$1')"
}
pm_err "$tmp/none/metrics.jsonl: No such file or directory" "$tmp/none"
mkdir -p "$tmp/pm" && echo '{"type":"eval","step":0,"val_loss":7.5}' > "$tmp/pm/metrics.jsonl"
pm_err "$tmp/pm/metrics.jsonl: no training steps to plot" "$tmp/pm"
echo 'not json' >> "$tmp/pm/metrics.jsonl"
pm_err "$tmp/pm/metrics.jsonl: line 2: not a metrics record" "$tmp/pm"
printf '%s\n' '{"type":"train","step":1,"loss":7.6,"lr":1e-3,"grad_norm":2.0}' > "$tmp/pm/metrics.jsonl"
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 scripts/plot_metrics.py "$tmp/pm" >/dev/null 2>&1 && [ -s "$tmp/pm/metrics.png" ] && ok "plot_metrics.py wrote a PNG" \
    || bad "plot_metrics.py on a valid metrics.jsonl wrote no PNG"
else
  pm_err "plot_metrics: needs matplotlib (pip install matplotlib)" "$tmp/pm"
fi

finish
