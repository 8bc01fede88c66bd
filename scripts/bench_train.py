#!/usr/bin/env python3
"""Training throughput and peak memory of finetune's CPU backend against PyTorch, in one run.

    python scripts/bench_train.py [--steps 8] [--threads 2] [--repeats 1] [--models bundled,25m]
                                  [--bin build/finetune] [--json build/bench_train.json]

Two models, each trained by three programs in turn, every one in its own process:
  bundled  data/model (the tiny chess Llama), batch 8 x 256
  25m      a 25.7M-parameter Llama (hidden 512, 8 layers, 8 heads / 4 kv heads, intermediate
           1408, vocab 2048), created here with transformers (random init, seed 0) in a
           temporary directory, batch 4 x 512
  programs finetune (C, OpenMP + OpenBLAS); PyTorch with transformers' LlamaForCausalLM and
           attention "sdpa" (its default) and "eager"
All sides: fp32 on the CPU, the same thread count (OMP_NUM_THREADS and torch.set_num_threads),
the same batch of full rows, AdamW with weight decay 0.01 and gradient clipping at 1.0;
finetune trains on packed rows of the bundled chess shards, PyTorch on random token ids of
the same shape (the cost of a step does not depend on the token values). The first step of
each program is a warm-up and not timed; the median of the timed steps is reported.
Peak RSS is the whole process's maximum resident set (getrusage of the finished child:
code, libraries, model, optimizer, activations, allocator slack; for finetune also its
checkpoint and export at the end); finetune's own tracked peak during training is listed
beside it.

Also the arithmetic ceiling: each model's FLOPs per step (step_gflop) and the machine's fp32
GEMM rate measured in the same run (PyTorch, a 2048^3 product and a model-shaped one): the
step at that rate with no other cost, hence the largest speedup over PyTorch-sdpa any
program could reach here, and each program's achieved GFLOP/s.

Prints a table and writes the same figures, with the date, the machine, the load average
and the versions, as JSON (--json). Needs torch and transformers (the venv of
tests/oracle/requirements.txt). The machine should be otherwise idle: the load average
before and after is recorded so that a noisy run can be recognised. CPU only; nothing here
says anything about GPU speed.
"""
import argparse
import datetime
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    "bundled": {"batch": 8, "seq": 256},
    "25m": {"batch": 4, "seq": 512, "config": dict(
        hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
        intermediate_size=1408, vocab_size=2048, max_position_embeddings=512, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=3)},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


# ----------------------------------------------------------------------------
# children

def run_child_rss(cmd, env):
    """Run cmd to completion; returns (its stdout, its own peak RSS in MiB, from wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.read()[-2000:]}")
        return out.read(), usage.ru_maxrss / 1024.0


def bench_finetune(a, model_dir, batch, seq, tmp):
    out = os.path.join(tmp, "ft_" + os.path.basename(model_dir))
    cmd = [a.bin, "--model_dir", model_dir, "--data_dir", a.data_dir, "--pack",
           "--batch_size_per_device", str(batch), "--total_batch_size", str(batch),
           "--seq_len", str(seq), "--max_steps", str(a.steps + 1), "--learning_rate", "1e-4",
           "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--max_eval_docs", "1",
           "--peak_tflops", "1", "--save_dtype", "fp32", "--out_dir", out]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    _, rss = run_child_rss(cmd, env)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    train = [r for r in rows if r.get("type") == "train"]
    ms = [r["ms"] for r in train][1:]   # drop the warm-up step
    shutil.rmtree(out, ignore_errors=True)
    # what finetune's own allocator tracking saw during training (params, grads, optimizer,
    # activations, workspace), for comparison with the process's RSS
    return ms, rss, train[-1]["peak_mem_bytes"] / 2**20


def bench_torch(a, model_dir, batch, seq, attn):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch_worker", model_dir, "--attn", attn,
           "--batch", str(batch), "--seq", str(seq), "--steps", str(a.steps), "--threads", str(a.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    out, rss = run_child_rss(cmd, env)
    return json.loads(out.strip().splitlines()[-1])["ms"], rss


def torch_worker(a):
    """Child process: train with PyTorch, print {"ms": [...]} of the timed steps."""
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(a.torch_worker, torch_dtype=torch.float32,
                                             attn_implementation=a.attn)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    V = model.config.vocab_size
    times = []
    for step in range(a.steps + 1):
        ids = torch.randint(0, V, (a.batch, a.seq))
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step > 0:
            times.append(1000 * (time.perf_counter() - t0))
    print(json.dumps({"ms": times}))
    return 0


def make_model_worker(a):
    """Child process: write the 25.7M-parameter Llama (random init, seed 0, HF layout, with the
    bundled tokenizer files) to a.make_model; print its parameter count and the versions."""
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**MODELS["25m"]["config"]))
    model.save_pretrained(a.make_model, safe_serialization=True)
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(a.model_dir, f)):
            shutil.copy(os.path.join(a.model_dir, f), a.make_model)
    torch.set_num_threads(a.threads)
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
                      "transformers": transformers.__version__, "gemm_gflops": gemm_probe(torch)}))
    return 0


def gemm_probe(torch):
    """The machine's fp32 GEMM rate as PyTorch reaches it (GFLOP/s, best of 5): a large square
    product, and the 25.7M model's widest layer product (tokens 2048, hidden 512, intermediate
    2 x 1408: the gate|up GEMM)."""
    rates = {}
    for name, (m, k, n) in (("square_2048", (2048, 2048, 2048)), ("layer_2048x512x2816", (2048, 512, 2816))):
        x, w = torch.rand(m, k), torch.rand(k, n)
        torch.mm(x, w)
        best = min(timed(lambda: torch.mm(x, w)) for _ in range(5))
        rates[name] = round(2 * m * k * n / best / 1e9, 1)
    return rates


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_gflop(cfg, batch, seq):
    """FLOPs of one training step (GFLOP): 6 per matmul parameter per token (forward 2,
    backward 4: the layers' q, k, v, o, gate, up, down and the lm_head), plus causal
    attention: forward Q K^T and P V over half the T x T scores (4 T^2 D H / 2 per sequence
    and layer), backward twice that (dV, dP, dQ, dK). What any implementation must compute;
    recomputation (finetune's attention backward rebuilds the scores) is not counted."""
    C, F, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    H, KVH = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or C // H
    layer = C * H * D + 2 * C * KVH * D + H * D * C + 3 * C * F
    tokens = batch * seq
    matmul = 6 * tokens * (L * layer + C * V)
    attention = 3 * L * batch * 4 * seq * seq * D * H / 2
    return (matmul + attention) / 1e9


def safetensors_numel(path):
    """Parameter count from a .safetensors header (8-byte length, then JSON)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name != "__metadata__":
            total += functools.reduce(lambda x, y: x * y, t["shape"], 1)
    return total


# ----------------------------------------------------------------------------
# report

def machine():
    cpu = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def summarise(tokens, ms, rss, tracked=None):
    med = statistics.median(ms)
    r = {"ms_per_step": round(med, 1), "ms_mean": round(statistics.fmean(ms), 1),
         "ms_all": [round(x, 1) for x in ms], "tokens_per_s": round(1000 * tokens / med),
         "peak_rss_mib": round(rss, 1)}
    if tracked is not None:
        r["tracked_peak_mib"] = round(tracked, 1)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per program (plus one warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of the three programs, interleaved; each program's best round (lowest median "
                         "step) is reported, the others are kept in the JSON (the machine drifts between runs)")
    ap.add_argument("--models", default="bundled,25m", help="comma-separated subset of: " + ",".join(MODELS))
    ap.add_argument("--model_dir", default="data/model", help="the bundled model")
    ap.add_argument("--data_dir", default="data/chess")
    ap.add_argument("--bin", default="build/finetune")
    ap.add_argument("--json", default="build/bench_train.json", help="where the JSON goes")
    ap.add_argument("--torch_worker", help=argparse.SUPPRESS)
    ap.add_argument("--make_model", help=argparse.SUPPRESS)
    ap.add_argument("--attn", default="sdpa", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if a.make_model:
        return make_model_worker(a)
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown model '{m}' (one of {', '.join(MODELS)})")
    if not os.access(a.bin, os.X_OK):
        ap.error(f"--bin: {a.bin} is not an executable (run make first)")

    # the parent stays small (no torch import): a child's peak RSS counts the parent's
    # resident memory at fork, so everything heavy happens in children
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
              "threads": a.threads, "timed_steps": a.steps, "repeats": a.repeats, "load_before": list(os.getloadavg()),
              "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        made = os.path.join(tmp, "llama25m")
        info = json.loads(subprocess.run([sys.executable, os.path.abspath(__file__), "--make_model", made,
                                          "--model_dir", a.model_dir], check=True, capture_output=True,
                                         text=True).stdout.strip().splitlines()[-1])
        report["torch"], report["transformers"] = info["torch"], info["transformers"]
        report["gemm_gflops"] = info["gemm_gflops"]
        for m in models:
            spec = MODELS[m]
            model_dir = made if m == "25m" else a.model_dir
            n = info["params"] if m == "25m" else safetensors_numel(os.path.join(model_dir, "model.safetensors"))
            tokens = spec["batch"] * spec["seq"]
            with open(os.path.join(model_dir, "config.json")) as f:
                gflop = step_gflop(json.load(f), spec["batch"], spec["seq"])
            r = {"params": n, "batch": spec["batch"], "seq": spec["seq"], "gflop_per_step": round(gflop, 1)}
            rounds = {"finetune": [], "torch_sdpa": [], "torch_eager": []}
            for _ in range(a.repeats):   # interleaved: a drift of the machine hits every program alike
                rounds["finetune"].append(summarise(tokens, *bench_finetune(a, model_dir, spec["batch"],
                                                                            spec["seq"], tmp)))
                for attn in ("sdpa", "eager"):
                    rounds["torch_" + attn].append(summarise(tokens, *bench_torch(a, model_dir, spec["batch"],
                                                                                  spec["seq"], attn)))
            for side, runs in rounds.items():
                r[side] = dict(min(runs, key=lambda x: x["ms_per_step"]),
                               rounds_ms_per_step=[x["ms_per_step"] for x in runs])
            for side in rounds:
                r[side]["gflops"] = round(gflop / (r[side]["ms_per_step"] / 1000), 1)
            # the arithmetic ceiling: the step's FLOPs at the machine's best measured GEMM rate,
            # no other cost; the best speedup over PyTorch-sdpa that any program could reach
            peak = info["gemm_gflops"]["square_2048"]
            r["ceiling_ms"] = round(1000 * gflop / peak, 1)
            r["ceiling_speedup_vs_sdpa"] = round(r["torch_sdpa"]["ms_per_step"] / r["ceiling_ms"], 2)
            for attn in ("sdpa", "eager"):
                t = r["torch_" + attn]
                r["speedup_vs_" + attn] = round(r["finetune"]["tokens_per_s"] / t["tokens_per_s"], 2)
                r["rss_ratio_vs_" + attn] = round(r["finetune"]["peak_rss_mib"] / t["peak_rss_mib"], 2)
            report["models"][m] = r
    report["load_after"] = list(os.getloadavg())

    print(f"bench_train: {report['date']}, {report['machine']}, {a.threads} thread(s), "
          f"{a.steps} timed steps, best of {a.repeats} interleaved round(s), fp32 AdamW, torch {report['torch']}, transformers {report['transformers']}")
    print(f"load average before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f}")
    print(f"{'model':<26} {'program':<22} {'ms/step':>9} {'tokens/s':>9} {'peak RSS MiB':>13} {'vs sdpa':>8} {'vs eager':>9}")
    for m, r in report["models"].items():
        label = f"{m} ({r['params'] / 1e6:.1f}M, {r['batch']}x{r['seq']})"
        for side, name in (("finetune", "finetune"), ("torch_sdpa", "PyTorch sdpa"), ("torch_eager", "PyTorch eager")):
            s = r[side]
            extra = ""
            if side == "finetune":
                extra = (f" {r['speedup_vs_sdpa']:>7.2f}x {r['speedup_vs_eager']:>8.2f}x"
                         f"   (RSS {r['rss_ratio_vs_sdpa']:.2f}x / {r['rss_ratio_vs_eager']:.2f}x;"
                         f" tracked {s['tracked_peak_mib']:.0f} MiB)")
            print(f"{label:<26} {name:<22} {s['ms_per_step']:>9.1f} {s['tokens_per_s']:>9} {s['peak_rss_mib']:>13.1f}{extra}")
            label = ""
    g = info["gemm_gflops"]
    print(f"fp32 GEMM rate measured here (PyTorch, {a.threads} thread(s)): {g['square_2048']:.1f} GFLOP/s at 2048^3, "
          f"{g['layer_2048x512x2816']:.1f} at the 25.7M model's gate|up shape")
    for m, r in report["models"].items():
        print(f"{m}: {r['gflop_per_step']:.1f} GFLOP per step (matmuls + causal attention); achieved GFLOP/s: "
              f"finetune {r['finetune']['gflops']:.1f}, sdpa {r['torch_sdpa']['gflops']:.1f}, eager "
              f"{r['torch_eager']['gflops']:.1f}; at the 2048^3 rate with no other cost a step takes "
              f"{r['ceiling_ms']:.1f} ms: at most {r['ceiling_speedup_vs_sdpa']:.2f}x PyTorch-sdpa")
    if os.path.dirname(a.json):
        os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
