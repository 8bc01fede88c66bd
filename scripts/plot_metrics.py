#!/usr/bin/env python3
"""plot_metrics.py OUT_DIR [PNG]: render finetune's OUT_DIR/metrics.jsonl as a PNG.

Top: training loss per optimizer step and validation loss at each evaluation.
Bottom: learning rate and gradient norm. Needs matplotlib (pip install matplotlib).
When a run was resumed, the last record of each step wins.
"""
import json
import sys


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out_dir = sys.argv[1]
    png = sys.argv[2] if len(sys.argv) > 2 else f"{out_dir}/metrics.png"
    train, evals = {}, {}
    with open(f"{out_dir}/metrics.jsonl") as f:
        for line in f:
            r = json.loads(line)
            (train if r["type"] == "train" else evals)[r["step"]] = r
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = sorted(train)
    ax1.plot(steps, [train[s]["loss"] for s in steps], label="train loss")
    es = sorted(evals)
    ax1.plot(es, [evals[s]["val_loss"] for s in es], "o-", label="validation loss")
    ax1.set_ylabel("loss (nats/token)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(steps, [train[s]["lr"] for s in steps], color="tab:green", label="learning rate")
    ax2.set_ylabel("learning rate")
    ax3 = ax2.twinx()
    ax3.plot(steps, [train[s]["grad_norm"] for s in steps], color="tab:red", alpha=0.6, label="grad norm")
    ax3.set_ylabel("grad norm (pre-clip)")
    ax2.set_xlabel("optimizer step")
    ax2.grid(alpha=0.3)
    h2, l2 = ax2.get_legend_handles_labels()
    h3, l3 = ax3.get_legend_handles_labels()
    ax2.legend(h2 + h3, l2 + l3, loc="upper right")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
