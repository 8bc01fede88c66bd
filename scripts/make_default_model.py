#!/usr/bin/env python3
"""Create the tiny default Llama (randomly initialised, fp32) next to the chess tokenizer.

Run with a Python that has torch + transformers + safetensors (e.g. /opt/oracle-venv/bin/python)
after scripts/train_tokenizer.py has written <out>/tokenizer.json.

Architecture (defaults): hidden 128, 4 layers, 4 heads (head_dim 32), 2 KV heads (GQA),
SwiGLU intermediate 352, RMSNorm eps 1e-5, RoPE theta 10000, 512 positions, untied
embeddings, vocab = tokenizer size, bos/eos/pad ids from the tokenizer. Standard HF init
(normal(0, 0.02) for linear/embedding weights, ones for norms) with a fixed torch seed.

Writes <out>/config.json, <out>/generation_config.json and <out>/model.safetensors (fp32).

Example:
  /opt/oracle-venv/bin/python scripts/make_default_model.py --out data/model
"""
import argparse
import hashlib
import json
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/model")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv_heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=352)
    ap.add_argument("--max_pos", type=int, default=512)
    ap.add_argument("--rope_theta", type=float, default=10000.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--init_std", type=float, default=0.02,
                    help="std of the normal init (tests use a large one so the loss depends on every token)")
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()

    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in ("<s>", "</s>", "<pad>", "<unk>")}
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=args.hidden,
        intermediate_size=args.intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        hidden_act="silu", max_position_embeddings=args.max_pos, initializer_range=args.init_std,
        rms_norm_eps=1e-5, use_cache=True, tie_word_embeddings=False,
        rope_theta=args.rope_theta, attention_bias=False, attention_dropout=0.0,
        mlp_bias=False, bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"], torch_dtype="float32")
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(args.out, safe_serialization=True)
    # transformers 5 keeps rope_theta only inside "rope_parameters"; also write the classic
    # top-level key (transformers 4 and simple config readers look there). Same value.
    cfg_path = os.path.join(args.out, "config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    saved.setdefault("rope_theta", args.rope_theta)
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in os.listdir(args.out):
        os.chmod(os.path.join(args.out, name), 0o644)

    # Sanity checks: reload, same logits, fp32 tensors, expected config fields.
    from safetensors import safe_open
    st_path = os.path.join(args.out, "model.safetensors")
    with safe_open(st_path, "pt") as f:
        names = list(f.keys())
        dtypes = {f.get_tensor(k).dtype for k in names}
    assert dtypes == {torch.float32}, dtypes
    assert "lm_head.weight" in names, "lm_head must be stored (untied)"
    m2 = LlamaForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32).eval()
    x = torch.tensor([[ids["<s>"]] + tok.encode("e2e4 e7e5 g1f3").ids])
    with torch.no_grad():
        a, b = model(x).logits, m2(x).logits
    assert torch.equal(a, b), "reloaded model differs"
    assert m2.config.rope_parameters["rope_theta"] == args.rope_theta
    with open(st_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    print(json.dumps({"params": n_params, "tensors": len(names),
                      "safetensors_bytes": os.path.getsize(st_path), "safetensors_sha256": sha,
                      "initial_loss_uniform": round(float(torch.log(torch.tensor(float(cfg.vocab_size)))), 4),
                      "config": saved}, indent=2))


if __name__ == "__main__":
    main()
