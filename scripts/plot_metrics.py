#!/usr/bin/env python3
"""plot_metrics.py OUT_DIR [PNG]: render finetune's OUT_DIR/metrics.jsonl as a PNG.

Top: training loss per optimizer step and validation loss at each evaluation.
Bottom: learning rate and gradient norm. Needs matplotlib (pip install matplotlib).
When a run was resumed, the last record of each step wins.
"""
import argparse
import json
import os


def read_metrics(path):
    """train and eval records of metrics.jsonl by step (the last of a step wins), or SystemExit
    with one line naming the file and what is wrong."""
    train, evals = {}, {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                    (train if r["type"] == "train" else evals)[r["step"]] = r
                except (ValueError, KeyError, TypeError) as e:
                    raise SystemExit(f"plot_metrics: {path}: line {n}: not a metrics record ({e})")
    except OSError as e:
        raise SystemExit(f"plot_metrics: {path}: {e.strerror} (OUT_DIR is finetune's --out_dir)")
    if not train:
        raise SystemExit(f"plot_metrics: {path}: no training steps to plot")
    return train, evals


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].replace("\n", " "),
                                 usage="plot_metrics.py OUT_DIR [PNG]")
    ap.add_argument("out_dir", metavar="OUT_DIR", help="a finetune --out_dir (reads OUT_DIR/metrics.jsonl)")
    ap.add_argument("png", metavar="PNG", nargs="?", help="output image (default OUT_DIR/metrics.png)")
    a = ap.parse_args()
    png = a.png or os.path.join(a.out_dir, "metrics.png")
    train, evals = read_metrics(os.path.join(a.out_dir, "metrics.jsonl"))
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot_metrics: needs matplotlib (pip install matplotlib)")
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
