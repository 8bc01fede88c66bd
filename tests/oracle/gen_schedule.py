#!/usr/bin/env python3
"""Learning rates of transformers' schedulers, for tests/test_schedule.c.

For each case (schedule, total steps, warmup steps, peak rate) it steps the scheduler
transformers' Trainer would build -- get_linear_schedule_with_warmup,
get_cosine_schedule_with_warmup or get_constant_schedule_with_warmup -- over a one-parameter
SGD optimizer and records the rate of every optimizer step 0 .. total-1 (get_last_lr()
before optimizer step k is the rate step k uses). Writes tests/golden/schedule/lr.json
(floats printed with Python's shortest round-trip repr, so the C side reads the exact
doubles). Deterministic: no randomness; reruns write identical bytes.

    python tests/oracle/gen_schedule.py --out tests/golden/schedule/lr.json
"""
import argparse
import json
import os

import torch
import transformers
from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                          get_linear_schedule_with_warmup)

# (schedule, total steps, warmup steps, peak learning rate); finetune derives the warmup
# steps as floor(--warmup_fraction x total), so e.g. 120 steps x 0.1 = 12 (the first case: the
# schedule `make run` used until 2026-11-23)
CASES = [
    ("linear", 120, 12, 5e-3),
    ("linear", 10, 0, 1e-5),
    ("linear", 7, 3, 3e-4),
    ("linear", 4, 4, 1e-3),   # warmup over the whole run
    ("linear", 1, 0, 2e-2),
    ("cosine", 120, 12, 5e-3),
    ("cosine", 10, 0, 1e-5),
    ("cosine", 7, 3, 3e-4),
    ("cosine", 33, 5, 1.0),
    ("constant", 10, 3, 1e-3),
    ("constant", 5, 0, 2e-2),
]


def rates(kind, total, warmup, peak):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=peak)
    if kind == "linear":
        sched = get_linear_schedule_with_warmup(opt, warmup, total)
    elif kind == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, warmup, total)
    else:
        sched = get_constant_schedule_with_warmup(opt, warmup)
    out = []
    for _ in range(total):
        out.append(float(sched.get_last_lr()[0]))
        opt.step()
        sched.step()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/schedule/lr.json")
    args = ap.parse_args()
    doc = {
        "generator": "tests/oracle/gen_schedule.py, transformers %s, torch %s"
                     % (transformers.__version__, torch.__version__.split("+")[0]),
        "cases": [{"schedule": k, "total_steps": n, "warmup_steps": w, "learning_rate": lr, "lr": rates(k, n, w, lr)}
                  for k, n, w, lr in CASES],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", args.out, "(%d cases)" % len(CASES))


if __name__ == "__main__":
    main()
