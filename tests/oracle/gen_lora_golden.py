#!/usr/bin/env python3
"""Golden data for LoRA, computed by PEFT on Hugging Face transformers (fp32, CPU, eager).

Writes <out>/ (default tests/golden/lora) with
  config.json, model.safetensors        -- the frozen base, an HF checkpoint
  adapter/adapter_config.json,
  adapter/adapter_model.safetensors     -- the initial adapter, as PEFT saves it (its model card
                                           README.md removed)
  golden.safetensors                    -- inputs; the loss and every adapter gradient of
                                           step 0; the loss of each of 3 AdamW steps and every
                                           adapter tensor after them
The adapters target all seven projections (q, k, v, o, gate, up, down) with rank 4 and alpha 8
(scaling 2). PEFT initialises lora_B to zero; here both A and B get 0.1 N(0, 1) so that every
gradient term (dA needs B != 0) is exercised. The base is frozen: only the adapters are given to
torch.optim.AdamW (no clipping, weight decay on every adapter matrix). See tests/oracle/README.md.

Usage:
  python tests/oracle/gen_lora_golden.py --out tests/golden/lora           # generate, then verify
  python tests/oracle/gen_lora_golden.py --out tests/golden/lora --verify  # verify only
"""

import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

import peft
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

IGNORE = -100
SEED = 3001
MODEL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             num_hidden_layers=2, vocab_size=128, rms_norm_eps=1e-5, max_position_embeddings=64,
             hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
B, T, STEPS = 2, 16, 3
OPT = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def build_base(gen):
    cfg = LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      attn_implementation="eager", **MODEL)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        for _, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(1.0 + 0.1 * r if p.ndim == 1 else 0.1 * r)
    return model


def lora_config():
    return peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, bias="none",
                           task_type="CAUSAL_LM")


def adapter_params(pm):
    """Trainable adapter tensors by PEFT's saved name (without the adapter name 'default')."""
    return {n.replace(".default", ""): p for n, p in pm.named_parameters() if p.requires_grad}


def make_batch(gen, V):
    ids = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    labels = ids.clone()
    labels[torch.rand(B, T, generator=gen) < 0.2] = IGNORE
    labels[0, :3] = IGNORE
    return ids, labels


def generate(out):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    base = build_base(gen)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    base.save_pretrained(out, safe_serialization=True)
    pm = peft.get_peft_model(base, lora_config())
    with torch.no_grad():
        for _, p in sorted(adapter_params(pm).items()):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32))
    pm.save_pretrained(os.path.join(out, "adapter"))
    os.remove(os.path.join(out, "adapter", "README.md"))
    os.remove(os.path.join(out, "generation_config.json"))
    ids, labels = make_batch(gen, MODEL["vocab_size"])
    pm.train()
    params = adapter_params(pm)
    opt = torch.optim.AdamW(list(params.values()), **OPT)
    tensors = {"input_ids": ids.to(torch.int32).contiguous(), "labels": labels.to(torch.int32).contiguous()}
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = pm(input_ids=ids, labels=labels).loss
        loss.backward()
        if step == 0:
            tensors["loss"] = f32(loss.reshape(1))
            tensors.update({"grad." + n: f32(p.grad) for n, p in params.items()})
        losses.append(float(loss.detach()))
        opt.step()
    tensors["step_losses"] = torch.tensor(losses, dtype=torch.float32)
    tensors.update({"final." + n: f32(p) for n, p in params.items()})
    info = dict(rank=RANK, alpha=ALPHA, targets=TARGETS, steps=STEPS, opt=OPT, torch=torch.__version__,
                transformers=transformers.__version__, peft=peft.__version__)
    save_file(tensors, os.path.join(out, "golden.safetensors"), metadata={"oracle": json.dumps(info, sort_keys=True)})
    print(f"lora: loss {losses[0]:.6f} -> {losses[-1]:.6f} over {STEPS} steps; {len(params)} adapter tensors; "
          f"files {sorted(os.listdir(out))}")


def verify(out):
    """Reload base + adapter with PeftModel.from_pretrained and recompute loss and gradients."""
    g = load_file(os.path.join(out, "golden.safetensors"))
    base = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    pm = peft.PeftModel.from_pretrained(base, os.path.join(out, "adapter"), is_trainable=True)
    pm.train()
    loss = pm(input_ids=g["input_ids"].long(), labels=g["labels"].long()).loss
    loss.backward()
    assert abs(float(loss) - float(g["loss"][0])) < 1e-6, "lora: reloaded loss differs"
    for n, p in adapter_params(pm).items():
        assert torch.allclose(p.grad, g["grad." + n], rtol=1e-5, atol=1e-7), f"lora: gradient of {n} differs"
    print(f"lora: verified ({len(adapter_params(pm))} adapter gradients, loss {float(loss):.6f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/golden/lora")
    ap.add_argument("--verify", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not a.verify:
        generate(a.out)
    verify(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
