#!/usr/bin/env python3
"""Predicted throughput at scale: `finetune --dry_run` for CodeLlama-7b, CodeLlama-34b and
Llama-2-70b on 8, 64 and 512 H100s, at seq 512 (packed rows, 8 per GPU per step) and seq 4096
(1 per GPU per step), as flat FSDP, HSDP (shards of 8 GPUs: one node) and --auto.

    python3 scripts/predict_scale.py [--bin build/finetune] [--models a,b] [--gpus 8,64,512]
                                     [--seqs 512,4096] > table.md

Every figure is the step-time timeline's H100 row of the dry run's report (src/plan_timeline.c):
a PREDICTION from published peaks, the measured one-GPU GEMM fraction and an assumed fabric,
never a measurement. Prints a Markdown table: model, GPUs, seq, plan (the flags that differ),
whether it fits an 80 GB GPU, step ms, tokens/s per GPU, MFU, and the binding resource (the
timeline's busiest lane). Exits non-zero, naming the job, when a dry run fails or its report
lacks the row. The configs are data/configs/<model>/config.json (architecture only).
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW_TOKENS = {512: 8, 4096: 1}   # sequences per GPU per step at each seq length (4096 tokens)
NODE = 8                         # GPUs per node: the HSDP shard group
TIMELINE_ROW = re.compile(r"^  H100-SXM5-80GB +([0-9.]+) +([0-9.]+) +([0-9]+) +([0-9.]+)% .* (\S+)$")
CHOSEN = re.compile(r"^  chosen: +(.*?): [0-9]+ tokens/s/GPU")


def dry_run(binary, model, gpus, seq, extra):
    """The report of one dry run (stdout and stderr); raises RuntimeError naming the job."""
    per_gpu = ROW_TOKENS[seq]
    cmd = [binary, "--dry_run", "--device", "cuda", "--model_dir", os.path.join(REPO, "data", "configs", model),
           "--world_size", str(gpus), "--seq_len", str(seq), "--total_batch_size", str(per_gpu * gpus)] + extra
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stdout.strip().splitlines()[-1:]))
    return r.stdout


def parse(report, job):
    """(step ms, tokens/s/GPU, MFU %, binding, fits, chosen flags or None) of a report."""
    row = next((m for m in map(TIMELINE_ROW.match, report.splitlines()) if m), None)
    if not row:
        raise RuntimeError("%s: no timeline row for the H100 in the report" % job)
    fits = re.search(r"^fits an 80 GB GPU [^:]*: (yes|NO)", report, re.M)
    chosen = next((m.group(1) for m in map(CHOSEN.match, report.splitlines()) if m), None)
    return (float(row.group(1)), int(row.group(3)), float(row.group(4)), row.group(5),
            bool(fits and fits.group(1) == "yes"), chosen)


def plans(gpus, seq):
    """(name, extra flags) of the plans of one shape."""
    batch = ["--batch_size_per_device", str(ROW_TOKENS[seq])]
    out = [("FSDP", batch)]
    if gpus > NODE:
        out.append(("HSDP %d x %d" % (NODE, gpus // NODE), batch + ["--dp_shard", str(NODE)]))
    out.append(("--auto", ["--auto"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "finetune"))
    ap.add_argument("--models", default="codellama-7b,codellama-34b,llama-2-70b")
    ap.add_argument("--gpus", default="8,64,512")
    ap.add_argument("--seqs", default="512,4096")
    a = ap.parse_args()
    print("| model | GPUs | seq | plan | fits 80 GB | step ms | tokens/s/GPU | MFU | binding |")
    print("|---|---:|---:|---|---|---:|---:|---:|---|")
    try:
        for model in a.models.split(","):
            for gpus in map(int, a.gpus.split(",")):
                for seq in map(int, a.seqs.split(",")):
                    for name, extra in plans(gpus, seq):
                        job = "%s on %d GPUs, seq %d, %s" % (model, gpus, seq, name)
                        ms, tps, mfu, binding, fits, chosen = parse(dry_run(a.bin, model, gpus, seq, extra), job)
                        plan = "--auto: `%s`" % chosen if chosen else "%s, batch %d per GPU" % (name, ROW_TOKENS[seq])
                        print("| %s | %d | %d | %s | %s | %.0f | %d | %.1f%% | %s |" % (
                            model, gpus, seq, plan, "yes" if fits else "no", ms, tps, mfu, binding))
    except RuntimeError as e:
        print("predict_scale: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
