#!/usr/bin/env python3
"""Golden data for the sampler's next-token distribution (src/sample.c sample_probs), from
transformers' own logits warpers: what generate(do_sample=True, temperature=t, top_k=k,
top_p=p) draws from (TemperatureLogitsWarper, then TopKLogitsWarper, then TopPLogitsWarper,
then a softmax), and for temperature 0 what greedy decoding picks (argmax).

Writes <out>/cases.json (default tests/golden/sample): [{"name", "V", "logits",
"temperature", "top_k", "top_p", "kept", "probs"}]: logits are float32 values (exact in
JSON), kept the ids left with a non-zero probability (ascending), probs their probabilities.
Cases: vocabularies of 1 to 2048 ids, logits drawn from N(0, 2) or rounded to halves (ties,
also at the top-k boundary), every combination of the flags' kinds. A top-p case whose
cumulative probability lies within 1e-5 of 1 - top_p somewhere is drawn again (float32 in
torch vs double in C could round it to either side), and ties are ordered as a stable sort
orders them; a case where transformers' warper disagrees with the stable order is drawn again.

Usage: python tests/oracle/gen_sample_golden.py [--out tests/golden/sample]
Seeded: a rerun with the same torch and transformers writes the same bytes.
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PARAMS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 50, 1.0), (1.0, 1, 1.0), (0.7, 0, 0.9), (1.3, 10, 0.5),
    (0.5, 3, 0.95), (1.0, 0, 0.0), (0.05, 0, 1.0), (100.0, 5, 0.99), (0.0, 0, 1.0), (0.0, 4, 0.3)]
VOCABS = [1, 2, 5, 7, 64, 2048]


def reference(logits, temperature, top_k, top_p):
    """transformers' distribution, and the same with ties in stable order (None if they differ)."""
    scores = torch.tensor(logits, dtype=torch.float32)[None, :]
    if temperature == 0:
        probs = torch.zeros_like(scores)
        probs[0, int(torch.argmax(scores))] = 1
        return probs[0].double().numpy(), True
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    ambiguous = False
    if top_p < 1:
        s, idx = torch.sort(scores, descending=False, stable=True)
        cum = s.softmax(-1).cumsum(-1)
        near = ((cum - (1 - top_p)).abs() < 1e-5) & torch.isfinite(s)
        near[..., -1:] = False   # the most likely id is kept whatever its sum
        ambiguous = bool(near.any())
        remove = cum <= (1 - top_p)
        remove[..., -1:] = False
        stable = scores.masked_fill(remove.scatter(1, idx, remove), -float("inf"))
        scores = TopPLogitsWarper(top_p)(None, scores)
        ambiguous |= not torch.equal(torch.isinf(stable), torch.isinf(scores))
    return scores.softmax(-1)[0].double().numpy(), not ambiguous


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "sample"))
    args = ap.parse_args()
    rng = np.random.default_rng(20261126)
    cases = []
    for V in VOCABS:
        for ties in (False, True):
            for (t, k, p) in PARAMS:
                for _ in range(100):   # redraw an ambiguous case
                    x = rng.normal(0, 2, V)
                    if ties:
                        x = np.round(x * 2) / 2
                    logits = [float(v) for v in x.astype(np.float32)]
                    probs, ok = reference(logits, t, k, p)
                    if ok:
                        break
                else:
                    raise SystemExit(f"V {V} t {t} k {k} p {p}: no unambiguous case in 100 draws")
                kept = [i for i in range(V) if probs[i] > 0]
                cases.append({"name": f"V {V}{' ties' if ties else ''} t {t} k {k} p {p}", "V": V,
                              "logits": logits, "temperature": t, "top_k": k, "top_p": p, "kept": kept,
                              "probs": [float(probs[i]) for i in kept]})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump({"transformers_warpers": "Temperature, TopK, TopP (transformers.generation.logits_process)",
                   "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} cases -> {args.out}/cases.json")


if __name__ == "__main__":
    main()
