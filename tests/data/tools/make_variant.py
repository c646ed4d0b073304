#!/usr/bin/env python3
"""A second small Qwen3 test checkpoint, in the layout transformers 5 writes (rope_parameters, dtype),
untied, sharded. Usage: make_variant.py OUTDIR [--tokenizer-dir DIR] [--seed N]"""
import argparse, json, os, shutil, torch
from transformers import Qwen3Config, Qwen3ForCausalLM

CFG = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
       "bos_token_id": 151643, "eos_token_id": [151643, 151645], "head_dim": 16, "hidden_act": "silu",
       "hidden_size": 32, "initializer_range": 0.2, "intermediate_size": 64, "max_position_embeddings": 2048,
       "max_window_layers": 3, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 3,
       "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
       "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
       "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--seed", type=int, default=4321)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    m = Qwen3ForCausalLM(Qwen3Config.from_dict(dict(CFG))).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_((1.0 + 0.1 * torch.randn_like(p.float())).to(p.dtype))
    m.save_pretrained(a.out, safe_serialization=True, max_shard_size="10MB")
    cfg = dict(CFG)
    theta = cfg.pop("rope_theta")
    cfg.pop("torch_dtype")
    cfg["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    cfg["dtype"] = "bfloat16"
    cfg["transformers_version"] = "5.0.0"
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer_dir, f), a.out)
    print("wrote", a.out, sorted(os.listdir(a.out)))

if __name__ == "__main__":
    main()
