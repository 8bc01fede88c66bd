#!/usr/bin/env python3
"""GPU training throughput, MFU and peak memory of finetune against PyTorch baselines on the same
jobs, measured in one run on one GPU (issue 12 item 8; the strong baselines: issue 37 item 1).

Run on an NVIDIA H200 and an NVIDIA H100 (2026-11-26, programs finetune, torch, torch_fsdp;
figures and how they were cross-checked in docs/results/2026-11-26-h200.md and -h100.md: one
FLOP count for every program, finetune's step within 5% of --dry_run's time model, its tracked
peak within its memory plan). torch_compile, liger and the 7b32 jobs have not run on a GPU yet.
Its bookkeeping is tested without a GPU (tests/test_first_light.sh: a fake nvidia-smi and a
fake trainer; the PyTorch workers on the CPU).

    python scripts/bench_gpu.py [--jobs bundled,7b,7b32] [--programs finetune,torch,...]
                                [--steps 10] [--layers auto|N] [--batch_7b 4] [--seq 512]
                                [--bin build/finetune] [--json build/bench_gpu.json]
                                [--deadline_s SECONDS] [--wheels .deps/root/wheels]
    python scripts/bench_gpu.py --plan_only [--gpu_name NAME --gpu_mem_gib GIB]

Jobs (each trained by every program in turn, each program in its own process):
  bundled  data/model (the tiny chess Llama), batch 16 x 512
  7b       CodeLlama-7b's width (data/configs/codellama-7b: hidden 4096, intermediate 11008,
           32 heads of 128, vocab 32016) with as many layers as fit next to PyTorch's 18 bytes
           per parameter (--layers auto: the estimate below; --layers N to override), random
           weights (transformers, seed 0) written once in bf16 to a temporary directory;
           batch --batch_7b x --seq
  7b32     the same at all 32 layers (6.74B parameters) with activation checkpointing
           (finetune --gradient_checkpointing; PyTorch: each decoder layer checkpointed),
           batch --batch_7b x --seq. Each program is planned by the fit estimate (train_bytes:
           16 bytes per parameter, 18 for eager torch) against 0.85 of the device memory, and
           skipped with the estimate as its reason where it does not fit (--plan_only shows
           it): on an H200 all but eager torch at batch 16 fit, on an 80 GB H100 none
Programs:
  finetune       build/finetune --device cuda (bf16 storage, fp32 master weights and AdamW),
                 one rank, on packed rows of the bundled chess shards
  torch          transformers' LlamaForCausalLM, attn_implementation "sdpa", fp32 weights with
                 torch.autocast(bfloat16), torch.optim.AdamW(fused=True): the seed tutorial's
                 setup, eager (kept for continuity with the 2026-11-26 figures)
  torch_fsdp     the same model wrapped in PyTorch FSDP1 (one rank; each decoder layer a unit,
                 MixedPrecision bf16 parameters and reductions over fp32 shards), fused AdamW
  torch_compile  the strong baseline (torchtitan's setup on one GPU): FSDP2 fully_shard on each
                 decoder layer and the root, world of 1 over NCCL, MixedPrecisionPolicy(bf16
                 parameters, fp32 reductions) over fp32 master weights, torch.compile of each
                 decoder layer (after activation checkpointing, before fully_shard, torchtitan's
                 order; 2 warm-up steps), fused AdamW, SDPA restricted to its fastest backend
                 on this GPU and shape (cuDNN, flash or memory-efficient, each timed alone
                 first; the JSON's "setup" names the one used and the probe's times);
                 reshard_after_forward only in the 7b32 jobs (one rank: it saves memory only)
  liger          torch_compile plus Liger's kernels (liger_kernel.transformers.
                 apply_liger_kernel_to_llama: RMSNorm, SwiGLU, RoPE, fused linear +
                 cross-entropy, so no logits tensor)
  finetune_fp8, finetune_bf16_moments
                 finetune with --fp8 (issue 37 item 4: FP8 GEMMs; goal >= 1.3x finetune's
                 tokens/s at batch 16) and with --optimizer_moments bf16 (item 3), compared
                 with plain finetune ("finetune_fp8_speedup", ...); each runs only when
                 `finetune --help` lists its flag, else "not run: this binary has no --fp8"
All: the same batch of full rows, lr 1e-4, weight decay 0.01, gradient clipping at 1.0. PyTorch
trains on random token ids of the same shape (a step's cost does not depend on the values).
The warm-up steps (1; 2 for the compiled programs) are not timed; the median of the timed
steps is reported.

What the machine must have: torch with CUDA and transformers (tests/oracle/requirements.txt)
in the Python that runs this script, and nvidia-smi. They are too large to carry (torch with
its CUDA libraries is gigabytes; a device call carries 64 MiB): the lent GPU machine's image
has them (torch 2.11 + cu130, transformers 5.17, triton 3.6, 2026-11). Before any program a
probe imports them (and liger_kernel) in a child: where torch or CUDA is missing, each PyTorch
program is recorded as "not run: <reason>" and finetune still runs. liger_kernel (pure Python,
~1 MB) travels in the kit: scripts/gpu_bundle.sh puts its wheel under .deps/root/wheels
(--wheels), installed here into a temporary folder when the image lacks it; without it the
liger program is "not run: liger_kernel not importable ...". A program that fails in its setup
or compilation (torch.compile, Liger, memory) is likewise "not run: <program>: <stage> failed:
<error>"; the others go on.

Figures, per job and program: ms per step, tokens/s, MFU = model FLOPs per step / (step time x
the GPU's dense bf16 peak), with the SAME numerator for every program (6 x matmul parameters,
lm_head included, + 6 x layers x seq x hidden for causal attention, per token; no recompute
counted, so checkpointing lowers MFU); peak device memory of the process as nvidia-smi reports
it (sampled every 0.2 s: context, allocator cache and workspaces included, the same measure for
every program), plus each program's own figure (finetune: its tracked peak; PyTorch:
torch.cuda.max_memory_reserved). Ratios finetune / each baseline, and finetune / the FASTEST
baseline (the most tokens/s of the job; "fastest_baseline"), from the same run. finetune is
stopped (SIGKILL) once its timed steps are logged, so it writes no checkpoint (16 bytes per
parameter of disk, not part of the benchmark).

The goals (issue 37 item 2, on an H100 or H200, judged on each 7b job): finetune >= 1.25 x the
fastest baseline's tokens/s, peak memory <= 1.0 x that baseline's, bf16 MFU >= 60% at batch 16
and >= 50% at batch 4. The report says met / not met for each; nothing is claimed before a
GPU run. Writes the figures with the date, the device, the driver, the versions and the
commit as JSON (--json), after every program ("complete": false until the end), so a run cut
short keeps what it measured. --deadline_s bounds the whole run (a GPU lease is short): a
program gets at most what is left, and one that cannot start with MIN_PROGRAM_S left is
recorded as not run, naming the deadline; so is one whose estimated time (EST_S: warm-up and
torch.compile included) exceeds what is left, while a shorter one after it may still run: the
order of --programs is the priority. A program that runs out of device memory is "not run: out
of memory: ..." (a shape that does not fit is no failure of the benchmark). --md writes the
report as Markdown too (scripts/bench_results/'s form); --kit_lines JSON prints a report's
one-line-per-program summary for tests/gpu/first_light.sh.
"""
import argparse
import datetime
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("finetune", "torch", "torch_fsdp", "torch_compile", "liger", "finetune_fp8", "finetune_bf16_moments")
BASELINES = ("torch", "torch_fsdp", "torch_compile", "liger")   # what finetune is compared with (goals: the fastest)
# finetune with an optional flag (issue 37 items 3 and 4), run only where `finetune --help` lists
# the flag (else "not run: this binary has no --fp8"); compared with plain finetune, not a baseline
VARIANTS = {"finetune_fp8": ["--fp8"], "finetune_bf16_moments": ["--optimizer_moments", "bf16"]}
GOAL_FP8_SPEEDUP = 1.3   # issue 37 item 4: --fp8 >= 1.3x our own bf16 tokens/s at 7B width, batch 16
COMPILED = ("torch_compile", "liger")   # FSDP2 + torch.compile per decoder layer (fsdp2_worker)
JOBS = ("bundled", "7b", "7b32")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")
# dense bf16 peaks (TFLOP/s) by a substring of the device name, most specific first
PEAKS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0), ("A100", 312.0))
# issue 37 item 2: tokens/s against the FASTEST baseline, peak memory against the same baseline,
# bf16 MFU by batch (at 7B width, seq 512: batch 16 and batch 4)
GOAL_SPEEDUP, GOAL_MEMORY, GOAL_MFU_B16, GOAL_MFU_B4 = 1.25, 1.0, 0.60, 0.50
FIT_FRACTION = 0.85   # of the device memory, for the fit estimates below
# training bytes per parameter of the PyTorch programs (fit estimate): fp32 weight 4 + fp32
# grad 4 + AdamW 8, + 2 for autocast's bf16 weight copies (eager torch); FSDP's bf16 gathered
# weights are one unit's at a time
BYTES_PER_PARAM = {"finetune": 16, "torch": 18, "torch_fsdp": 16, "torch_compile": 16, "liger": 16,
                   "finetune_fp8": 16, "finetune_bf16_moments": 12}
LIGER_VERSION = "0.8.5"   # the wheel scripts/gpu_bundle.sh carries (py3-none-any; needs torch, triton)
MIN_PROGRAM_S = 20   # with less left before --deadline_s, a program is not started
# the seconds a program takes from start to its last timed step (5 timed steps), warm-up,
# loading and compilation included, at the 8-layer 7b job on an H100/H200 (ESTIMATES: finetune
# and eager torch from the 2026-11-26 runs, ~10-20 s; torch.compile's warm-up unmeasured, taken
# as a minute), plus EST_S_PER_BPARAM per billion parameters (loading, the 7b32 jobs): with
# --deadline_s a program whose estimate exceeds what is left is not started (a shorter one after
# it may still run), so the budget goes to the programs in --programs order that can finish
EST_S = {"finetune": 20, "finetune_fp8": 20, "finetune_bf16_moments": 20, "torch": 25, "torch_fsdp": 25,
         "torch_compile": 70, "liger": 75}
EST_S_PER_BPARAM = 4
EST_WRITE_S_PER_BPARAM = 6   # writing a job's random model (init on the GPU, bf16 safetensors to disk)


# ----------------------------------------------------------------------------
# the jobs: shapes, FLOPs, the layer count that fits

def config_shapes(cfg):
    """(L, C, F, V, QD, KVD) of an HF Llama config dict."""
    L, C, F, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H = cfg["num_attention_heads"]
    D = cfg.get("head_dim") or C // H
    return L, C, F, V, H * D, cfg.get("num_key_value_heads", H) * D


def layer_params(cfg):
    _, C, F, _, QD, KVD = config_shapes(cfg)
    return C * (QD + 2 * KVD) + QD * C + 3 * C * F + 2 * C   # projections + the two norms


def flops_per_token(cfg, seq):
    """Model FLOPs per token of a training step: 6 x matmul params (lm_head included) + causal
    attention 6 x L x T x (heads x head dim) (QK^T and PV, halved by the mask, x3 for backward)."""
    L, C, F, V, QD, KVD = config_shapes(cfg)
    matmul = L * (C * (QD + 2 * KVD) + QD * C + 3 * C * F) + V * C
    return 6 * matmul + 6 * L * seq * QD


def train_bytes(cfg, layers, tokens, per_param, checkpointed):
    """Device bytes of PyTorch training `layers` layers of cfg's width on `tokens` tokens per
    step. An ESTIMATE: per_param bytes per parameter (BYTES_PER_PARAM); activations per token per
    layer 2 x (12 C + 6 F) bytes (bf16 saved tensors, RMSNorm's fp32 upcasts), or with activation
    checkpointing 4 C per layer (its fp32 input) plus one layer's full set (the recompute); the
    root: embeddings and lm_head at per_param bytes and (N, V) logits at 10 bytes (bf16, fp32
    upcast, fp32 grad); 1.5 GiB for the context and workspaces."""
    _, C, F, V, _, _ = config_shapes(cfg)
    full = tokens * 2 * (12 * C + 6 * F)
    per_layer = per_param * layer_params(cfg) + (tokens * 4 * C if checkpointed else full)
    root = per_param * (2 * V * C + C) + tokens * V * 10 + 1.5 * 2**30 + (full if checkpointed else 0)
    return layers * per_layer + root


def auto_layers(cfg, mem_bytes, tokens):
    """Layers of the 7B-width model that fit PyTorch's autocast training (the heavier side,
    18 bytes per parameter, no checkpointing) in FIT_FRACTION of the device memory (the
    estimate of train_bytes). --layers N overrides it when it is wrong."""
    per_layer = train_bytes(cfg, 1, tokens, 18, False) - train_bytes(cfg, 0, tokens, 18, False)
    root = train_bytes(cfg, 0, tokens, 18, False)
    return max(1, min(cfg["num_hidden_layers"], int((FIT_FRACTION * mem_bytes - root) // per_layer)))


def fit_notes(cfg, tokens, mem_bytes, checkpointed):
    """program -> None (fits) or why not, by train_bytes (finetune at 16 bytes per parameter:
    bf16 weights 2 + fp32 master 4 + AdamW 8 + bf16 grads 2; its own planner is the authority
    when it runs)."""
    out = {}
    for prog, per_param in BYTES_PER_PARAM.items():

        need = train_bytes(cfg, cfg["num_hidden_layers"], tokens, per_param, checkpointed)
        out[prog] = None if need <= FIT_FRACTION * mem_bytes else (
            f"does not fit: estimated {need / 2**30:.1f} GiB > {FIT_FRACTION} x {mem_bytes / 2**30:.1f} GiB "
            f"({per_param} bytes per parameter{', activation checkpointing' if checkpointed else ''}; "
            f"bench_gpu.py's fit estimate)")
    return out


def job_names(a):
    """The job names of --jobs and --batch_7b: 7b and 7b32 once per batch ("7b" the first,
    "7b_bN" the others; "7b32", "7b32_bN")."""
    batches = a.batch_7b if isinstance(a.batch_7b, list) else [a.batch_7b]
    names = []
    for name in a.jobs:
        names += [name] if name == "bundled" else [name] + [f"{name}_b{b}" for b in batches[1:]]
    return names, batches


def plan_jobs(a, gpu_mem_bytes):
    """The jobs to run: name -> {config, batch, seq, layers note, checkpointing, fit}."""
    jobs = {}
    seq = a.seq
    names, batches = job_names(a)
    for name in names:
        if name == "bundled":
            cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
            jobs[name] = {"config": cfg, "batch": 16, "seq": min(seq, cfg.get("max_position_embeddings", seq)),
                          "model_dir": a.model_dir, "layers_from": "the bundled model", "checkpointing": False}
            continue
        cfg = json.load(open(os.path.join(REPO, "data", "configs", "codellama-7b", "config.json")))
        base, _, b = name.partition("_b")
        batch = int(b) if b else batches[0]
        tokens = max(batches) * seq   # the same layers (one model) for every batch: the largest must fit
        full = base == "7b32"   # all of CodeLlama-7b's layers, with activation checkpointing
        if full:
            layers, how = cfg["num_hidden_layers"], "full depth, activation checkpointing"
        elif a.layers == "auto":
            layers, how = auto_layers(cfg, gpu_mem_bytes, tokens), "auto (estimate, see --help)"
        else:
            layers, how = int(a.layers), "--layers"
        cfg = dict(cfg, num_hidden_layers=layers, max_position_embeddings=max(seq, 512), torch_dtype="bfloat16")
        cfg.pop("transformers_version", None)
        jobs[name] = {"config": cfg, "batch": batch, "seq": seq, "model_dir": None, "layers_from": how,
                      "checkpointing": full}
        if full:   # (the other 7b jobs fit by construction of their layer count)
            jobs[name]["fit"] = fit_notes(cfg, batch * seq, gpu_mem_bytes, True)
    for j in jobs.values():
        j["params"] = (j["config"]["num_hidden_layers"] * layer_params(j["config"])
                       + (1 if j["config"].get("tie_word_embeddings") else 2) * j["config"]["vocab_size"]
                       * j["config"]["hidden_size"] + j["config"]["hidden_size"])
        j["flops_per_step"] = flops_per_token(j["config"], j["seq"]) * j["batch"] * j["seq"]
    return jobs


# ----------------------------------------------------------------------------
# the device

def gpu_info():
    """{name, mem_bytes, driver} of GPU 0 from nvidia-smi, or raises RuntimeError saying why not."""
    if not shutil.which("nvidia-smi"):
        raise RuntimeError("nvidia-smi not found")
    r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits",
                        "-i", "0"], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError("nvidia-smi: " + (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}"))
    name, mem_mib, driver = [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]
    return {"name": name, "mem_bytes": int(float(mem_mib)) * 2**20, "driver": driver}


def peak_tflops(name, override):
    if override:
        return override
    for key, tf in PEAKS:
        if key in name:
            return tf
    return None


class MemSampler:
    """The largest device memory nvidia-smi reports for one process id, sampled every 0.2 s."""

    def __init__(self, pid):
        self.pid, self.peak_mib, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                    "--format=csv,noheader,nounits"], capture_output=True, text=True)
            except OSError:   # no nvidia-smi: the peak stays 0 (reported as unmeasured)
                return
            for line in r.stdout.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                    self.peak_mib = max(self.peak_mib, int(parts[1]))
            self._stop.wait(0.2)

    def stop(self):
        self._stop.set()
        self._t.join()
        return self.peak_mib


# ----------------------------------------------------------------------------
# the programs (each in its own process)

def finetune_cmd(a, job, model_dir, out, steps, extra=()):
    b, s = job["batch"], job["seq"]
    return [a.bin, "--device", "cuda", "--model_dir", model_dir, "--data_dir", a.data_dir, "--pack",
            "--batch_size_per_device", str(b), "--total_batch_size", str(b), "--seq_len", str(s),
            "--max_steps", str(steps), "--learning_rate", "1e-4", "--weight_decay", "0.01",
            "--max_grad_norm", "1.0", "--max_eval_docs", "1", "--eval_every", "0", "--save_every", "0",
            "--sample_tokens", "0", "--out_dir", out] + (["--gradient_checkpointing"] if job["checkpointing"] else []) + list(extra)


def run_finetune_profile(a, job, model_dir, tmp, limit):
    """finetune --profile on the job for 3 steps (a separate run: profiling synchronises around
    every op, so its times are not the benchmark's): the last step's profile lines."""
    out = os.path.join(tmp, "ft_prof")
    shutil.rmtree(out, ignore_errors=True)
    cmd = finetune_cmd(a, job, model_dir, out, 3) + ["--profile"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"finetune --profile: stopped at its {limit:.0f} s limit")
    finally:
        shutil.rmtree(out, ignore_errors=True)   # its checkpoint and export: not needed
    lines, block = (r.stdout + r.stderr).splitlines(), []
    for i, l in enumerate(lines):
        if l.startswith("profile step"):
            block = [l] + [m for m in lines[i + 1:i + 6] if m.startswith("  ")]
    if r.returncode != 0 or not block:
        raise RuntimeError(f"finetune --profile: rc {r.returncode}, no profile: {(r.stdout + r.stderr)[-800:]}")
    return block


def finetune_help(binary):
    """The text of `BINARY --help` ("" when it cannot be run)."""
    try:
        r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def variant_guard(a):
    """{variant: why it cannot run} for the finetune variants in a.programs whose flag the
    binary's --help does not list (a capability check: the flags arrive on other branches)."""
    wanted = [p for p in a.programs if p in VARIANTS]
    text = finetune_help(a.bin) if wanted else ""
    why = {}
    for prog in wanted:
        flag = VARIANTS[prog][0]
        if not any(l.split()[:1] == [flag] for l in text.splitlines()):
            why[prog] = f"this binary has no {flag} ({a.bin} --help does not list it)"
    return why


def estimate_s(prog, job):
    """A program's estimated seconds on a job, warm-up included (EST_S)."""
    return EST_S[prog] + EST_S_PER_BPARAM * job["params"] / 1e9


def start_refusal(left, deadline, prog, job):
    """Why a program is not started with `left` seconds before --deadline_s (None: start it)."""
    if left is None:
        return None
    need = max(MIN_PROGRAM_S, estimate_s(prog, job))
    if left >= need:
        return None
    return (f"not started: {max(left, 0):.0f} s left of --deadline_s {deadline:.0f}, it needs ~{need:.0f} s "
            f"(warm-up included; bench_gpu.py's estimate): dropped to fit the budget")


def out_of_memory(text):
    """The first line of text that says the device ran out of memory, or None."""
    for line in text.splitlines():
        low = line.lower()
        if "out of memory" in low or "outofmemoryerror" in low or "cudaerrormemoryallocation" in low:
            return line.strip()[:300]
    return None


def run_finetune(a, job, model_dir, tmp, limit, extra=()):
    out = os.path.join(tmp, "ft_out")
    shutil.rmtree(out, ignore_errors=True)
    cmd = finetune_cmd(a, job, model_dir, out, a.steps + 3, extra)
    metrics = os.path.join(out, "metrics.jsonl")
    with open(os.path.join(tmp, "ft.log"), "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        mem = MemSampler(p.pid)
        train, deadline = [], time.time() + limit
        while p.poll() is None and time.time() < deadline:
            time.sleep(0.5)
            if os.path.exists(metrics):
                train = [json.loads(l) for l in open(metrics) if '"type":"train"' in l]
                if len(train) >= a.steps + 1:
                    break
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)   # no checkpoint: SIGTERM would save one
            p.wait()
        peak = mem.stop()
    if os.path.exists(metrics):   # (again: it may have ended between two polls)
        train = [json.loads(l) for l in open(metrics) if '"type":"train"' in l]
    if len(train) < a.steps + 1:
        tail = open(os.path.join(tmp, "ft.log")).read()[-1500:]
        if out_of_memory(tail):
            raise NotRun(f"out of memory: {out_of_memory(tail)}")
        # --fp8 on a GPU before Hopper/Ada, or on the CPU backend (src/fp8_linear.c, options.c)
        refused = [l for l in tail.splitlines() if "flag --fp8" in l and "FP8 tensor cores" in l]
        if refused:
            raise NotRun(f"finetune refuses --fp8 here: {refused[0].strip()[:300]}")
        raise RuntimeError(f"finetune logged {len(train)} of {a.steps + 1} steps (rc {p.returncode}):\n{tail}")
    train = train[:a.steps + 1]
    out = {"ms": [r["ms"] for r in train[1:]], "device_peak_mib": peak,
           "own_peak_mib": max(r["peak_mem_bytes"] for r in train) / 2**20, "own_peak_what": "tracked arena peak"}
    if "arena_bytes" in train[-1]:   # the device arena (sized from the plan) and how far the run reached into it
        out["arena_mib"] = round(train[-1]["arena_bytes"] / 2**20, 1)
        out["arena_high_water_mib"] = round(max(r.get("arena_high_water_bytes", 0) for r in train) / 2**20, 1)
    return out


class NotRun(Exception):
    """A program that could not be had (a missing wheel, torch.compile failing): recorded as
    {"not_run": reason}, not as a failure of the benchmark."""


def run_torch(a, job, model_dir, tmp, program, limit, env_extra=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch_worker", program, "--worker_model", model_dir,
           "--worker_batch", str(job["batch"]), "--worker_seq", str(job["seq"]), "--steps", str(a.steps),
           "--worker_ckpt", "1" if job["checkpointing"] else "0"]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000),
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", **(env_extra or {}))
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        mem = MemSampler(p.pid)
        try:
            p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        peak = mem.stop()
        out.seek(0)
        text = out.read()
    if p.returncode != 0 and out_of_memory(text):   # a shape that does not fit: not a failure of the kit
        raise NotRun(f"{program}: out of memory: {out_of_memory(text)}")
    if p.returncode != 0:
        why = f"stopped at its {limit:.0f} s limit" if p.returncode == -signal.SIGKILL else f"rc {p.returncode}"
        raise RuntimeError(f"{program} failed ({why}):\n{text[-1500:]}")
    # the worker's result is its last line that is a JSON object: PyTorch may print warnings
    # after it (at exit, to stderr, which is merged here)
    lines = [l for l in text.splitlines() if l.startswith("{")]
    try:
        r = json.loads(lines[-1])
    except (IndexError, ValueError) as e:
        raise RuntimeError(f"{program}: no result line ({e}):\n{text[-1500:]}")
    if "not_run" in r:
        raise NotRun(r["not_run"])
    out = {"ms": r["ms"], "device_peak_mib": peak, "own_peak_mib": r["reserved_mib"],
           "own_peak_what": "torch.cuda.max_memory_reserved", "torch": r["torch"], "transformers": r["transformers"]}
    out["setup"] = {k: r[k] for k in ("sdpa_backend", "sdpa_probe_ms", "compile", "warmup_steps", "liger_kernel",
                                      "reshard_after_forward", "checkpointing", "dtype") if k in r}
    return out


PROBE = """
import importlib.util, json
r = {}
try:
    import torch, transformers
    r.update(torch=torch.__version__, transformers=transformers.__version__, cuda=torch.cuda.is_available())
except Exception as e:
    r["torch_error"] = f"{type(e).__name__}: {e}"
try:
    if importlib.util.find_spec("liger_kernel") is None:
        raise ImportError("No module named 'liger_kernel'")
    import liger_kernel.transformers
    from importlib.metadata import version
    r["liger_kernel"] = version("liger-kernel")
except Exception as e:
    r["liger_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(r))
"""


def probe_python(env):
    """What sys.executable can import (PROBE's JSON), or {"torch_error": why} if it says nothing."""
    try:
        r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
        return json.loads([l for l in r.stdout.splitlines() if l.startswith("{")][-1])
    except (IndexError, ValueError, OSError, subprocess.TimeoutExpired) as e:
        return {"torch_error": f"the import probe failed: {e}", "liger_error": "the import probe failed"}


def preflight(a, tmp):
    """Whether the PyTorch programs can run here, before any is started: (probe, {program: why
    not}, environment additions for the liger worker). torch and transformers must be in
    sys.executable's environment (too large to carry: the GPU machine's image has them);
    liger_kernel, when missing, is installed from the kit's wheel (--wheels, filled by
    scripts/gpu_bundle.sh) into a temporary folder on PYTHONPATH."""
    if not any(p in BASELINES for p in a.programs):
        return {}, {}, {}
    env, extra = dict(os.environ), {}
    probe = probe_python(env)
    wheels = sorted(f for f in (os.listdir(a.wheels) if os.path.isdir(a.wheels) else [])
                    if f.startswith("liger_kernel-") and f.endswith(".whl"))
    if "liger" in a.programs and "liger_error" in probe and "torch_error" not in probe and wheels:
        site = os.path.join(tmp, "site")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--target", site, os.path.join(a.wheels, wheels[-1])], capture_output=True, text=True)
        if r.returncode == 0:
            extra = {"PYTHONPATH": site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")}
            probe = dict(probe_python(dict(env, **extra)), liger_from=wheels[-1])
        else:
            probe["liger_error"] += f"; installing {wheels[-1]} failed: {(r.stderr.strip() or '?').splitlines()[-1]}"
    why = {}
    for p in BASELINES:
        if "torch_error" in probe:
            why[p] = (f"torch/transformers not importable by {sys.executable}: {probe['torch_error']} "
                      "(the GPU machine must have them: see --help)")
        elif not probe.get("cuda") and a.worker_device.startswith("cuda"):
            why[p] = f"torch {probe.get('torch')} sees no CUDA device (a CPU build?)"
    if "liger_error" in probe:   # its own reason first: the one the kit can fix
        kit = (f"; no liger_kernel wheel in {a.wheels} (scripts/gpu_bundle.sh carries liger-kernel {LIGER_VERSION} "
               "there)" if not wheels else f"; {wheels[-1]} not installed: torch does not import"
               if "torch_error" in probe else "")
        why["liger"] = f"liger_kernel not importable: {probe['liger_error']}{kit}"
    return probe, why, extra


def train_steps(a, model, opt, dev, clip, warmup, torch):
    """The timed loop shared by the workers: warmup + a.steps steps on random token ids of
    (a.worker_batch, a.worker_seq), labels = ids; ms of the timed steps."""
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    V = model.config.vocab_size
    times = []
    for step in range(warmup + a.steps):
        ids = torch.randint(0, V, (a.worker_batch, a.worker_seq), device=dev)
        sync()
        t0 = time.perf_counter()
        if a.torch_worker in COMPILED:   # FSDP2 casts the parameters to bf16 itself
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        clip()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= warmup:
            times.append(1000 * (time.perf_counter() - t0))
    return times


def worker_result(a, times, dev, model, torch, extra):
    import transformers
    reserved = torch.cuda.max_memory_reserved(dev) / 2**20 if dev.type == "cuda" else 0.0
    p = next(model.parameters())
    dtype = str(getattr(p, "_local_tensor", p).dtype)   # FSDP2: a DTensor over the fp32 shard
    return dict({"ms": times, "reserved_mib": reserved, "dtype": dtype, "checkpointing": bool(a.worker_ckpt),
                 "torch": torch.__version__, "transformers": transformers.__version__}, **extra)


def torch_worker(a):
    """Child: train a.worker_model with PyTorch (plain autocast or FSDP1), print the step times."""
    if a.torch_worker in COMPILED:
        return fsdp2_worker(a)
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    # --worker_device cpu: the same code on the CPU (tests/test_first_light.sh rehearses it
    # there with the device's torch/transformers versions; gloo instead of NCCL, no timing)
    dev = torch.device(a.worker_device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    # dtype=, not torch_dtype= (deprecated in transformers 5; both honoured by 5.17 and 5.23):
    # the checkpoint is bf16 and transformers 5 loads a checkpoint's dtype when none is named
    model = LlamaForCausalLM.from_pretrained(a.worker_model, dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    if a.worker_ckpt:   # activation checkpointing per decoder layer (the 7b32 jobs)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if a.torch_worker == "torch_fsdp":
        import functools
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
        model = FSDP(model, auto_wrap_policy=policy, mixed_precision=mp, device_id=dev, use_orig_params=True)
        clip = lambda: model.clip_grad_norm_(1.0)   # noqa: E731
    else:
        model.to(dev)
        clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # noqa: E731
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    times = train_steps(a, model, opt, dev, clip, 1, torch)
    result = worker_result(a, times, dev, model, torch, {"warmup_steps": 1})
    if a.torch_worker == "torch_fsdp":
        dist.destroy_process_group()   # else NCCL warns at exit
    print(json.dumps(result))
    return 0


def pick_sdpa_backend(torch, a, cfg, dev):
    """The fastest SDPA backend on this device for the job's attention shape (bf16, causal,
    forward + backward; cuDNN, flash, memory-efficient each tried alone, 3 warm-up and 10 timed
    calls), made the only one enabled: (name, {name: ms or why not}). On the CPU: the default."""
    if dev.type != "cuda":
        return "default (cpu)", {}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    H = cfg.num_attention_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    q, k, v = (torch.randn(a.worker_batch, H, a.worker_seq, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    probe = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                for i in range(13):
                    if i == 3:
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
                torch.cuda.synchronize()
            probe[name] = round((time.perf_counter() - t0) * 100, 3)   # ms per call (10 calls)
        except RuntimeError as e:
            probe[name] = "unavailable: " + str(e).splitlines()[0][:120]
    timed = {n: ms for n, ms in probe.items() if isinstance(ms, float)}
    if not timed:
        return "default (no backend ran alone)", probe
    best = min(timed, key=timed.get)
    torch.backends.cuda.enable_cudnn_sdp(best == "cudnn")
    torch.backends.cuda.enable_flash_sdp(best == "flash")
    torch.backends.cuda.enable_mem_efficient_sdp(best == "efficient")
    torch.backends.cuda.enable_math_sdp(False)   # no silent fallback: a step it cannot take fails
    return best, probe


def fsdp2_worker(a):
    """Child: torch_compile and liger, the strong baselines (torchtitan's single-GPU setup):
    FSDP2 fully_shard on each decoder layer and the root over a world of 1 (NCCL on a GPU,
    gloo on the CPU), MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32
    master weights, torch.compile per decoder layer (after activation checkpointing, before
    fully_shard, as torchtitan orders them), fused AdamW, SDPA on its fastest backend; liger:
    Liger's RMSNorm, SwiGLU, RoPE and fused linear + cross-entropy patched in first. What cannot
    be had (no liger_kernel, compilation failing, no memory) prints {"not_run": why}, exit 0."""
    stage = "import torch/transformers"
    try:
        import torch
        from transformers import LlamaForCausalLM
        extra = {"compile": "per decoder layer" if a.worker_compile else "off (--worker_compile 0)"}
        if a.torch_worker == "liger":
            stage = "liger_kernel"
            import liger_kernel
            from liger_kernel.transformers import apply_liger_kernel_to_llama
            # before the model is built: it patches transformers' Llama classes
            apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                        fused_linear_cross_entropy=True)
            extra["liger_kernel"] = getattr(liger_kernel, "__version__", None) or liger_version()
        stage = "setup"
        model, dev, opt, clip, extra2 = fsdp2_setup(a, torch, LlamaForCausalLM)
        extra.update(extra2)
        stage = "warm-up steps (compilation)"
        warmup = 2 if a.worker_compile else 1   # the first compiles forward and backward; the second settles
        train_steps(a, model, opt, dev, clip, warmup, torch)
        stage = "timed steps"
        times = train_steps(a, model, opt, dev, clip, 0, torch)
    except Exception as e:   # noqa: BLE001: any failure is reported as this program's reason
        line = (str(e).strip().splitlines() or [""])[0][:300]
        print(json.dumps({"not_run": f"{a.torch_worker}: {stage} failed: {type(e).__name__}: {line}"}))
        return 0
    result = worker_result(a, times, dev, model, torch, dict(extra, warmup_steps=warmup))
    import torch.distributed as dist
    dist.destroy_process_group()
    print(json.dumps(result))
    return 0


def liger_version():
    from importlib.metadata import version
    return version("liger-kernel")


def fsdp2_setup(a, torch, LlamaForCausalLM):
    """The model, device, optimizer and clipping of fsdp2_worker, and what to report of it."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    dev = torch.device(a.worker_device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1)
    model = LlamaForCausalLM.from_pretrained(a.worker_model, dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    backend, probe = pick_sdpa_backend(torch, a, model.config, dev)
    model.to(dev)
    layers = model.model.layers
    if a.worker_compile:   # every layer's graph is the same: let none fall back to eager for a recompile limit
        import torch._dynamo
        for k in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, k):
                setattr(torch._dynamo.config, k, max(getattr(torch._dynamo.config, k), 8 * len(layers)))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # one rank: resharding after forward only saves memory; kept where checkpointing says memory is short
    reshard = bool(a.worker_ckpt)
    for i in range(len(layers)):
        layer = layers[i]
        if a.worker_ckpt:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
            layer = checkpoint_wrapper(layer, preserve_rng_state=False)
        if a.worker_compile:
            layer = torch.compile(layer)
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
        layers[i] = layer
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # noqa: E731
    return model, dev, opt, clip, {"sdpa_backend": backend, "sdpa_probe_ms": probe, "reshard_after_forward": reshard}


def make_model_worker(a):
    """Child: write the 7B-width model (random init, seed 0, bf16) described by a.make_model's
    config.json to that directory, with the bundled tokenizer files."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with open(os.path.join(a.make_model, "config.json")) as f:
        cfg = LlamaConfig(**json.load(f))
    # initialised on the GPU when there is one: billions of random numbers take minutes on
    # the CPU, well under a second there (the values differ, the benchmark does not care)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(a.make_model)   # safetensors (transformers 5 ignores safe_serialization=)
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(a.model_dir, f)):
            shutil.copy(os.path.join(a.model_dir, f), a.make_model)
    return 0


# ----------------------------------------------------------------------------
# report

def measured(r):
    """Whether a program's result holds figures (not an error, not a 'not run')."""
    return bool(r) and "ms_per_step" in r


def summarise(job, r, peak_flops):
    med = statistics.median(r["ms"])
    tokens = job["batch"] * job["seq"]
    out = {"ms_per_step": round(med, 2), "ms_all": [round(x, 2) for x in r["ms"]],
           "tokens_per_s": round(1000 * tokens / med, 1), "device_peak_mib": r["device_peak_mib"],
           "own_peak_mib": round(r["own_peak_mib"], 1), "own_peak_what": r["own_peak_what"]}
    if peak_flops:
        out["mfu"] = round(job["flops_per_step"] / (med / 1000 * peak_flops), 4)
    for k in ("arena_mib", "arena_high_water_mib", "setup"):
        if k in r:
            out[k] = r[k]
    return out


def compare(res):
    """finetune / baseline ratios of one job (same run): against each baseline that measured,
    and against the fastest of them (the most tokens/s; named in res["fastest_baseline"])."""
    ft = res.get("finetune")
    ratios = {}
    res.pop("fastest_baseline", None)
    if not measured(ft):
        return ratios
    done = [p for p in BASELINES if measured(res.get(p))]
    for prog in done:
        t = res[prog]
        ratios["speedup_vs_" + prog] = round(ft["tokens_per_s"] / t["tokens_per_s"], 3)
        if t["device_peak_mib"]:
            ratios["memory_ratio_vs_" + prog] = round(ft["device_peak_mib"] / t["device_peak_mib"], 3)
    for prog in VARIANTS:   # finetune with --fp8 / bf16 moments against plain finetune
        if measured(res.get(prog)):
            ratios[prog + "_speedup"] = round(res[prog]["tokens_per_s"] / ft["tokens_per_s"], 3)
            if ft["device_peak_mib"]:
                ratios[prog + "_memory_ratio"] = round(res[prog]["device_peak_mib"] / ft["device_peak_mib"], 3)
    if done:
        fastest = max(done, key=lambda p: res[p]["tokens_per_s"])
        res["fastest_baseline"] = fastest
        ratios["speedup_vs_fastest"] = ratios["speedup_vs_" + fastest]
        if "memory_ratio_vs_" + fastest in ratios:
            ratios["memory_ratio_vs_fastest"] = ratios["memory_ratio_vs_" + fastest]
    return ratios


def goal_mfu(batch):
    """The bf16 MFU goal of a job's batch (issue 37 item 2: 60% at batch 16, 50% at batch 4)."""
    return GOAL_MFU_B16 if batch >= 16 else GOAL_MFU_B4


def print_plan(gpu, jobs, a):
    print(f"bench_gpu: {gpu['name']}, {gpu['mem_bytes'] / 2**30:.1f} GiB, peak "
          f"{peak_tflops(gpu['name'], a.peak_tflops) or 'unknown (--peak_tflops)'} TFLOP/s bf16")
    for name, j in jobs.items():
        c = j["config"]
        print(f"  job {name}: {c['num_hidden_layers']} layers ({j['layers_from']}), hidden {c['hidden_size']}, "
              f"vocab {c['vocab_size']}, {j['params'] / 1e9:.3f}B parameters, batch {j['batch']} x {j['seq']}, "
              f"{j['flops_per_step'] / 1e12:.2f} TFLOP per step; programs {', '.join(a.programs)}")
        for prog in a.programs:
            if prog in j.get("fit", {}):
                print(f"    {prog}: " + (j["fit"][prog] and "skipped: " + j["fit"][prog] or "fits (estimate)"))


def print_report(report):
    print(f"\nbench_gpu: {report['date']}, {report['device']['name']} (driver {report['device']['driver']}), "
          f"commit {report['commit']}, {report['timed_steps']} timed steps (median reported).")
    print(f"{'job':<28} {'program':<21} {'ms/step':>9} {'tokens/s':>10} {'MFU':>7} {'dev MiB':>9} {'own MiB':>9}")
    for name, res in report["jobs"].items():
        label = f"{name} ({res['params'] / 1e9:.2f}B, {res['batch']}x{res['seq']})"
        for prog in report["programs"]:
            r = res.get(prog, {})
            if "error" in r:
                print(f"{label:<28} {prog:<21} FAILED: {r['error'].splitlines()[0]}")
            elif "not_run" in r:
                print(f"{label:<28} {prog:<21} not run: {r['not_run']}")
            elif r:
                mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
                print(f"{label:<28} {prog:<21} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>10.0f} {mfu:>7} "
                      f"{r['device_peak_mib']:>9} {r['own_peak_mib']:>9.0f}"
                      + (f"  sdpa {r['setup']['sdpa_backend']}" if "sdpa_backend" in r.get("setup", {}) else ""))
            label = ""
        for k, v in res["ratios"].items():
            print(f"  {k}: {v:.3f}" + (f" ({res['fastest_baseline']})" if k.endswith("_fastest") else ""))
        ft = res.get("finetune", {})
        if "arena_high_water_mib" in ft:   # how much of the arena's margin over the plan the run used
            print(f"  finetune device arena: high-water {ft['arena_high_water_mib']:.0f} MiB of "
                  f"{ft['arena_mib']:.0f} MiB")
        for line in res.get("finetune_profile", []):
            print("  finetune " + line if line.startswith("profile") else "  " + line)
    for line in report["goals"]:
        print("goal " + line)


def program_row(name, res, prog):
    """One Markdown table row of a job's program: its figures, or why it has none."""
    r = res.get(prog, {})
    head = f"| {name} | {res['params'] / 1e9:.2f}B, {res['layers']} layers, {res['batch']} x {res['seq']} | {prog} |"
    if "error" in r:
        return head + " FAILED | | | | | " + r["error"].splitlines()[0].replace("|", "\\|") + " |"
    if not measured(r):
        return head + " not run | | | | | " + r.get("not_run", "not reached").replace("|", "\\|") + " |"
    mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
    note = f"sdpa {r['setup']['sdpa_backend']}" if "sdpa_backend" in r.get("setup", {}) else ""
    return (head + f" {r['ms_per_step']:.1f} | {r['tokens_per_s']:.0f} | {mfu} | {r['device_peak_mib']} | "
            f"{r['own_peak_mib']:.0f} ({r['own_peak_what']}) | {note} |")


def write_markdown(report, path, argv):
    """The report as Markdown (scripts/bench_results/'s form): the machine, the command, one
    row per job and program (figures, or "not run"/"FAILED" with the reason), ratios, goals."""
    dev = report["device"]
    lines = [f"# bench_gpu: {report['date']}, {dev['name']}", "",
             "Written by scripts/bench_gpu.py --md; the figures are medians of the timed steps (warm-up "
             "excluded), MFU with one FLOP count for every program.", "", "| | |", "|---|---|",
             f"| device | {dev['name']} ({dev['mem_bytes'] / 2**30:.1f} GiB), driver {dev['driver']}, "
             f"{report['peak_tflops_bf16'] or '?'} TFLOP/s bf16 peak |",
             f"| commit | {report['commit']} |",
             f"| software | torch {report.get('torch', '-')}, transformers {report.get('transformers', '-')}, "
             f"liger_kernel {report.get('python', {}).get('liger_kernel', '-')} |",
             f"| timed steps | {report['timed_steps']} per program |",
             f"| time | {report.get('seconds', '?')} s of --deadline_s {report['deadline_s'] or 'none'}"
             f"{'' if report['complete'] else ' (cut short)'} |",
             f"| command | `{' '.join(argv)}` |", "",
             "| job | shape | program | ms/step | tokens/s | MFU | device peak MiB | own peak MiB | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, res in report["jobs"].items():
        lines += [program_row(name, res, prog) for prog in report["programs"]]
    lines += ["", "## Ratios (finetune / baseline; variants / finetune)", ""]
    if not any(res.get("ratios") for res in report["jobs"].values()):
        lines.append("(none: no baseline or variant was measured beside finetune)")
    for name, res in report["jobs"].items():
        for k, v in res.get("ratios", {}).items():
            lines.append(f"- {name} {k}: {v:.3f}" + (f" ({res['fastest_baseline']})" if k.endswith("_fastest") else ""))
    lines += ["", "## Goals (issue 37)", ""] + ["- " + g for g in report["goals"]]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def kit_lines(path):
    """first_light.sh's bench check: one line per job and program of the JSON at path ("ok   ",
    "skip " with the reason it did not run, "FAIL " with its error), the goals, and a summary
    line; exit 1 when a program failed (a "not run" is no failure), 2 when there is no report."""
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"bench: no report: {e}")
        return 2
    n = {"ok": 0, "skip": 0, "FAIL": 0}
    for name, res in report["jobs"].items():
        for prog in report["programs"]:
            r = res.get(prog, {"not_run": "not reached (the run was cut short)"})
            if "error" in r:
                kind, text = "FAIL", "failed: " + r["error"].splitlines()[0]
            elif measured(r):
                mfu = f", MFU {100 * r['mfu']:.1f}%" if "mfu" in r else ""
                kind, text = "ok", f"{r['tokens_per_s']:.0f} tokens/s{mfu}, peak {r['device_peak_mib']} MiB"
            else:
                kind, text = "skip", "not run: " + r.get("not_run", "?")
            n[kind] += 1
            print(f"{kind:<4} {name} {prog} (batch {res['batch']}, {res['layers']} layers): {text}")
    for g in report.get("goals", []):
        print("goal " + g)
    print(f"bench: {n['ok']} measured, {n['skip']} not run, {n['FAIL']} failed"
          + ("" if report.get("complete") else " (cut short: the figures so far)"))
    return 1 if n["FAIL"] else 0


def goals(report):
    """The issue's goals, judged on each 7b job (else the first job); one line per goal and job."""
    names = [n for n in report["jobs"] if n.startswith("7b")] or list(report["jobs"])[:1]
    out = []
    for name in names:
        out += [(f"{name}: " if len(names) > 1 else "") + line for line in job_goals(report["jobs"][name])]
    return out or ["not judged: no job ran"]


def job_goals(res):
    """The goal verdicts of one job's results (against the fastest baseline that ran)."""
    if not res or not measured(res.get("finetune")):
        return ["not judged: finetune did not run"]
    ft, r, out = res["finetune"], res.get("ratios", {}), []
    best = res.get("fastest_baseline")
    if best:
        out.append(f"tokens/s >= {GOAL_SPEEDUP}x the fastest baseline ({best}): {r['speedup_vs_fastest']:.2f}x, "
                   f"{'met' if r['speedup_vs_fastest'] >= GOAL_SPEEDUP else 'NOT met'}")
    else:
        out.append(f"tokens/s >= {GOAL_SPEEDUP}x the fastest baseline: not judged (no baseline ran)")
    if "mfu" in ft:
        g = goal_mfu(res.get("batch", 0))
        out.append(f"MFU >= {100 * g:.0f}% (batch {res.get('batch')}): {100 * ft['mfu']:.1f}%, "
                   f"{'met' if ft['mfu'] >= g else 'NOT met'}")
    if "memory_ratio_vs_fastest" in r:
        out.append(f"peak memory <= {GOAL_MEMORY}x the fastest baseline's ({best}): "
                   f"{r['memory_ratio_vs_fastest']:.2f}x, {'met' if r['memory_ratio_vs_fastest'] <= GOAL_MEMORY else 'NOT met'}")
    if "finetune_fp8_speedup" in r and res.get("batch", 0) >= 16:
        out.append(f"--fp8 >= {GOAL_FP8_SPEEDUP}x our bf16 tokens/s (batch {res['batch']}): "
                   f"{r['finetune_fp8_speedup']:.2f}x, {'met' if r['finetune_fp8_speedup'] >= GOAL_FP8_SPEEDUP else 'NOT met'}")
    return out


def git_commit():
    r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="bundled,7b,7b32", help="comma-separated subset of: " + ",".join(JOBS))
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated subset of: " + ",".join(PROGRAMS))
    ap.add_argument("--steps", type=int, default=10, help="timed steps per program (plus one warm-up)")
    ap.add_argument("--layers", default="auto", help="layers of the 7b job: auto (fit estimate) or a number")
    ap.add_argument("--batch_7b", default="4", help="sequences per step of the 7b job; a comma-separated list "
                    "runs it at each (one model: jobs 7b, 7b_bN, ...)")
    ap.add_argument("--profile_finetune", action="store_true", help="after each job's finetune run, one more "
                    "of 3 steps with --profile (ms per op; not the timed run)")
    ap.add_argument("--seq", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--peak_tflops", type=float, default=0, help="the GPU's dense bf16 peak (0: by device name)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per program before it is killed")
    ap.add_argument("--deadline_s", type=float, default=0, help="seconds for the whole run (0: none); "
                    "programs that cannot start in time are recorded as not run")
    ap.add_argument("--model_dir", default=os.path.join(REPO, "data", "model"))
    ap.add_argument("--data_dir", default=os.path.join(REPO, "data", "chess"))
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "finetune"))
    ap.add_argument("--json", default=os.path.join(REPO, "build", "bench_gpu.json"))
    ap.add_argument("--md", help="also write the report as Markdown here (scripts/bench_results/'s form: "
                    "the figures, ratios, goals, every program not run with its reason, the command)")
    ap.add_argument("--wheels", default=os.path.join(REPO, ".deps", "root", "wheels"),
                    help="where the kit's liger_kernel wheel is (scripts/gpu_bundle.sh), installed into a "
                    "temporary folder when liger_kernel is not importable")
    ap.add_argument("--plan_only", action="store_true", help="print the jobs and layer counts, run nothing "
                    "(no GPU needed with --gpu_name and --gpu_mem_gib)")
    ap.add_argument("--gpu_name", help="with --plan_only: the device name to plan for")
    ap.add_argument("--gpu_mem_gib", type=float, help="with --plan_only: the device memory to plan for")
    for hidden in ("--torch_worker", "--worker_model", "--make_model", "--kit_lines"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--worker_batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker_seq", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker_device", default="cuda:0", help=argparse.SUPPRESS)
    ap.add_argument("--worker_ckpt", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker_compile", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker or a.make_model or a.kit_lines:
        return ap, a
    a.jobs = [j for j in a.jobs.split(",") if j]
    a.programs = [p for p in a.programs.split(",") if p]
    for j in a.jobs:
        if j not in JOBS:
            ap.error(f"--jobs: unknown job '{j}' (one of {', '.join(JOBS)})")
    for p in a.programs:
        if p not in PROGRAMS:
            ap.error(f"--programs: unknown program '{p}' (one of {', '.join(PROGRAMS)})")
    if not a.jobs or not a.programs:
        ap.error("--jobs and --programs need at least one entry each")
    if a.deadline_s < 0 or a.timeout <= 0:
        ap.error("--deadline_s must be >= 0 and --timeout > 0")
    try:
        a.batch_7b = [int(b) for b in a.batch_7b.split(",")]
    except ValueError:
        ap.error(f"--batch_7b: '{a.batch_7b}' is not a comma-separated list of numbers")
    if len(set(a.batch_7b)) != len(a.batch_7b):
        ap.error("--batch_7b: a batch is named twice")
    if a.steps < 1 or min(a.batch_7b) < 1 or a.seq < 2:
        ap.error("--steps, --batch_7b must be >= 1 and --seq >= 2")
    if a.layers != "auto" and not (a.layers.isdigit() and 1 <= int(a.layers) <= 32):
        ap.error(f"--layers: '{a.layers}' is not auto or a number in [1, 32]")
    if (a.gpu_name is None) != (a.gpu_mem_gib is None):
        ap.error("--gpu_name and --gpu_mem_gib go together (with --plan_only)")
    if a.gpu_name is not None and not a.plan_only:
        ap.error("--gpu_name/--gpu_mem_gib are for --plan_only (a run measures the GPU it finds)")
    return ap, a


def main():
    ap, a = parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if a.make_model:
        return make_model_worker(a)
    if a.kit_lines:
        return kit_lines(a.kit_lines)
    if a.gpu_name is not None:
        gpu = {"name": a.gpu_name, "mem_bytes": int(a.gpu_mem_gib * 2**30), "driver": "none (planned)"}
    else:
        try:
            gpu = gpu_info()
        except RuntimeError as e:
            print(f"bench_gpu: no usable GPU on this machine ({e}); this benchmark needs an NVIDIA GPU "
                  f"(--plan_only --gpu_name NAME --gpu_mem_gib GIB plans without one)", file=sys.stderr)
            return 1
    jobs = plan_jobs(a, gpu["mem_bytes"])
    print_plan(gpu, jobs, a)
    if a.plan_only:
        return 0
    if "finetune" in a.programs and not os.access(a.bin, os.X_OK):
        ap.error(f"--bin: {a.bin} is not an executable (make first)")
    peak = peak_tflops(gpu["name"], a.peak_tflops)
    start = time.time()

    def left():   # seconds before --deadline_s (None: no deadline)
        return a.deadline_s - (time.time() - start) if a.deadline_s else None

    def limit():  # a program's time limit: --timeout, or what is left when that is less
        lft = left()
        return a.timeout if lft is None else max(1.0, min(a.timeout, lft - 5))

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": gpu,
              "peak_tflops_bf16": peak, "commit": git_commit(), "timed_steps": a.steps, "programs": a.programs,
              "deadline_s": a.deadline_s or None, "complete": False,
              "note": "medians of the timed steps; MFU with one FLOP count for every program", "jobs": {}}

    def save():
        report["goals"] = goals(report)
        if os.path.dirname(a.json):
            os.makedirs(os.path.dirname(a.json), exist_ok=True)
        with open(a.json + ".tmp", "w") as f:
            json.dump(report, f, indent=1)
        os.replace(a.json + ".tmp", a.json)

    late = f"not started: under {MIN_PROGRAM_S} s left of --deadline_s {a.deadline_s:.0f}"
    written = {}   # config (JSON) -> the model directory written for it
    with tempfile.TemporaryDirectory() as tmp:
        report["python"], cannot, liger_env = preflight(a, tmp)
        cannot.update(variant_guard(a))
        for prog, why in cannot.items():
            if prog in a.programs:
                print(f"bench_gpu: {prog} not run: {why}", flush=True)
        for name, job in jobs.items():
            skips = {p: job.get("fit", {}).get(p) or cannot.get(p) for p in a.programs}
            res = {"params": job["params"], "batch": job["batch"], "seq": job["seq"],
                   "layers": job["config"]["num_hidden_layers"], "flops_per_step": job["flops_per_step"],
                   "checkpointing": job["checkpointing"]}
            report["jobs"][name] = res
            model_dir, why_not = job["model_dir"], None
            key = json.dumps(job["config"], sort_keys=True)
            if model_dir is None and key in written:   # another batch of the same model
                model_dir = written[key]
            todo = [p for p in a.programs if not skips[p]]
            need = (EST_WRITE_S_PER_BPARAM * job["params"] / 1e9 + min(estimate_s(p, job) for p in todo)
                    if todo and model_dir is None else 0)
            if left() is not None and left() < max(MIN_PROGRAM_S, need):
                why_not = (late if left() < MIN_PROGRAM_S else f"not started: {left():.0f} s left of --deadline_s "
                           f"{a.deadline_s:.0f}, writing the model and its quickest program need ~{need:.0f} s "
                           "(bench_gpu.py's estimate): dropped to fit the budget")
            elif model_dir is None and not all(skips.values()):   # (none to run: no model)
                model_dir = os.path.join(tmp, "model_" + name)
                os.makedirs(model_dir)
                with open(os.path.join(model_dir, "config.json"), "w") as f:   # closed before the child reads it
                    json.dump(job["config"], f, indent=1)
                print(f"bench_gpu: {name}: writing the model ...", flush=True)
                t0 = time.time()
                try:
                    subprocess.run([sys.executable, os.path.abspath(__file__), "--make_model", model_dir,
                                    "--model_dir", a.model_dir], check=True, timeout=limit())
                    res["model_write_s"] = round(time.time() - t0, 1)
                    written[key] = model_dir
                except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
                    why_not = f"writing the model failed: {e}"
            for prog in a.programs:
                if why_not is None and left() is not None and left() < MIN_PROGRAM_S:
                    why_not = late
                dropped = None if why_not or skips[prog] else start_refusal(left(), a.deadline_s, prog, job)
                if why_not is not None or skips[prog] or dropped:
                    res[prog] = {"not_run": why_not or skips[prog] or dropped}
                    continue
                print(f"bench_gpu: {name}: {prog} ...", flush=True)
                try:
                    lim = limit()
                    r = (run_finetune(a, job, model_dir, tmp, lim, VARIANTS.get(prog, ()))
                         if prog == "finetune" or prog in VARIANTS
                         else run_torch(a, job, model_dir, tmp, prog, lim, liger_env if prog == "liger" else None))
                    res[prog] = summarise(job, r, peak * 1e12 if peak else None)
                    if prog == "finetune" and a.profile_finetune and (left() is None or left() > MIN_PROGRAM_S):
                        print(f"bench_gpu: {name}: finetune --profile ...", flush=True)
                        try:
                            res["finetune_profile"] = run_finetune_profile(a, job, model_dir, tmp, limit())
                        except (RuntimeError, OSError) as e:
                            res["finetune_profile"] = [f"failed: {e}"]
                    for k in ("torch", "transformers"):
                        if k in r:
                            report[k] = r[k]
                except NotRun as e:
                    res[prog] = {"not_run": str(e)}
                    print(f"bench_gpu: {name}: {prog} not run: {e}", flush=True)
                except (RuntimeError, OSError, ValueError, KeyError) as e:
                    res[prog] = {"error": str(e)}
                res["ratios"] = compare(res)
                save()
            res["ratios"] = compare(res)
            later = [j for j in list(jobs.values())[list(jobs).index(name) + 1:]
                     if json.dumps(j["config"], sort_keys=True) == key]
            if model_dir and model_dir != job["model_dir"] and not later:
                shutil.rmtree(model_dir, ignore_errors=True)
    report["complete"] = True
    report["seconds"] = round(time.time() - start, 1)
    save()
    print_report(report)
    print(f"wrote {a.json}")
    if a.md:
        write_markdown(report, a.md, ["python3", os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])
        print(f"wrote {a.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
