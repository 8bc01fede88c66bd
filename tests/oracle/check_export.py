#!/usr/bin/env python3
"""check_export.py EXPORT_DIR SHARD SEQ_LEN N_GAMES OUR_LOSS

Loads finetune's Hugging Face export with transformers (LlamaForCausalLM, fp32 on CPU), computes
the mean next-token loss over the first N_GAMES games of a FTTOKSHD shard truncated to SEQ_LEN
tokens (as finetune --eval_only does), and compares it with OUR_LOSS. Exit 1 if they differ by
more than 1e-4 relative (both sides compute in fp32 from the same bf16 weights; measured ~1e-7).
"""
import struct
import sys

import numpy as np
import torch
from transformers import LlamaForCausalLM


def read_shard(path):
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != b"FTTOKSHD":
        raise SystemExit(f"{path}: bad magic")
    _version, token_bytes = struct.unpack_from("<II", buf, 8)
    n_docs, n_tokens = struct.unpack_from("<QQ", buf, 32)
    offsets = np.frombuffer(buf, dtype="<u8", count=n_docs + 1, offset=64)
    dtype = "<u2" if token_bytes == 2 else "<u4"
    tokens = np.frombuffer(buf, dtype=dtype, count=n_tokens, offset=64 + 8 * (n_docs + 1))
    return [tokens[offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(n_docs)]


def main():
    export_dir, shard, T, n_games, ours = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    model = LlamaForCausalLM.from_pretrained(export_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for doc in read_shard(shard)[:n_games]:
            ids = torch.tensor(doc[:T + 1])
            inp, tgt = ids[:-1][None, :T], ids[1:][None, :T]
            logits = model(input_ids=inp).logits[0]
            losses = torch.nn.functional.cross_entropy(logits, tgt[0], reduction="sum")
            total += float(losses)
            count += tgt.shape[1]
    theirs = total / count
    rel = abs(theirs - ours) / abs(theirs)
    print(f"transformers val loss {theirs:.6f} vs ours {ours:.6f} (rel {rel:.1e}, {count} tokens)")
    sys.exit(0 if rel <= 1e-4 else 1)


if __name__ == "__main__":
    main()
