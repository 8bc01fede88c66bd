#!/usr/bin/env python3
"""Training throughput of finetune's CPU backend against PyTorch, measured in the same run.

    python scripts/bench_train.py [--steps 20] [--batch 8] [--seq 256] [--threads 2]
                                  [--model_dir data/model] [--bin build/finetune]

Both sides train the same checkpoint in fp32 on the CPU with the same thread count, batch
and sequence length, with AdamW: finetune on packed rows of the bundled chess shards
(`--pack`, every row full length), PyTorch (transformers' LlamaForCausalLM, eager attention)
on random token ids of the same shape. The first step of each is a warm-up and not timed.
Prints ms per step and tokens/s of each, and their ratio. Needs torch and transformers (the
venv of tests/oracle/requirements.txt). This is a CPU measurement; nothing here says
anything about GPU speed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def bench_finetune(a, tmp):
    out = os.path.join(tmp, "ft")
    cmd = [a.bin, "--model_dir", a.model_dir, "--data_dir", a.data_dir, "--pack",
           "--batch_size_per_device", str(a.batch), "--total_batch_size", str(a.batch),
           "--seq_len", str(a.seq), "--max_steps", str(a.steps + 1), "--learning_rate", "1e-4",
           "--max_eval_docs", "1", "--peak_tflops", "1", "--out_dir", out]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    ms = [r["ms"] for r in rows if r.get("type") == "train"][1:]   # drop the warm-up step
    return sum(ms) / len(ms)


def bench_torch(a):
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(a.model_dir, torch_dtype=torch.float32, attn_implementation="eager")
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
            times.append(time.perf_counter() - t0)
    return 1000 * sum(times) / len(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model_dir", default="data/model")
    ap.add_argument("--data_dir", default="data/chess")
    ap.add_argument("--bin", default="build/finetune")
    a = ap.parse_args()
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    tokens = a.batch * a.seq
    with tempfile.TemporaryDirectory() as tmp:
        ft = bench_finetune(a, tmp)
    pt = bench_torch(a)
    print(f"bench_train: {a.model_dir}, batch {a.batch} x seq {a.seq}, {a.threads} thread(s), "
          f"{a.steps} timed steps (fp32, CPU, AdamW)")
    print(f"  finetune (C, OpenMP + OpenBLAS)  {ft:9.1f} ms/step  {1000 * tokens / ft:9.0f} tokens/s")
    print(f"  PyTorch (transformers, eager)    {pt:9.1f} ms/step  {1000 * tokens / pt:9.0f} tokens/s")
    print(f"  ratio: finetune is {pt / ft:.2f}x PyTorch's throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
