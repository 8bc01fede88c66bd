#!/usr/bin/env python3
"""check_export.py EXPORT_DIR SHARD SEQ_LEN N_GAMES OUR_LOSS [ADAPTER_DIR]

Loads finetune's Hugging Face export with transformers (LlamaForCausalLM, fp32 on CPU), computes
the mean next-token loss over the first N_GAMES games of a FTTOKSHD shard truncated to SEQ_LEN
tokens (as finetune --eval_only does), and compares it with OUR_LOSS. Exit 1 if they differ by
more than 1e-4 relative (both sides compute in fp32 from the same bf16 weights; measured ~1e-7).
With ADAPTER_DIR, EXPORT_DIR is the base model and ADAPTER_DIR a PEFT LoRA adapter (finetune
--lora_rank's export), applied with peft.PeftModel.from_pretrained.
"""
import os
import sys
import warnings

import torch
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from token_shard import shard_docs  # noqa: E402  (the one FTTOKSHD reader)


def main():
    warnings.filterwarnings("ignore")   # library deprecation notices are not the check's output
    export_dir, shard, T, n_games, ours = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    model = LlamaForCausalLM.from_pretrained(export_dir, dtype=torch.float32, attn_implementation="eager")
    if len(sys.argv) > 6:
        import peft
        model = peft.PeftModel.from_pretrained(model, sys.argv[6])
        n = sum(1 for name, _ in model.named_parameters() if "lora_" in name)
        assert n > 0, f"{sys.argv[6]}: no LoRA tensors were loaded"
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for doc in shard_docs(shard)[:n_games]:
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
