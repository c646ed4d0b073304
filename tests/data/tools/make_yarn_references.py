#!/usr/bin/env python3
"""transformers' YaRN rope parameters and end-to-end outputs of the tiny checkpoints with YaRN, as JSON.

Runs where torch + transformers exist (the GPU machine):
  python3 make_yarn_references.py TESTS_DATA_DIR OUTDIR
Writes OUTDIR/rope_params.json: for each config below, transformers' inv_freq (float32), attention_scaling and
cos/sin at a few positions (float32, attention scaling applied), or the error transformers raises; and
OUTDIR/<name>.reference.json (tests/data/tools/reference.py's format) for the tiny checkpoints with YaRN configs
(their weights are tests/data/tiny and tests/data/tiny-untied; only config.json differs: OUTDIR/<name>.config.json).
"""
import json, os, shutil, subprocess, sys, torch, transformers
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 1024, "num_attention_heads": 16,
         "num_key_value_heads": 8, "num_hidden_layers": 2, "intermediate_size": 3072, "vocab_size": 151936,
         "model_type": "qwen3", "rope_theta": 1000000, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6}

def cfg(base, **kw):
    d = dict(base); d.update(kw); return d

ROPE_CASES = {
    "qwen3_doc_factor4_orig32768_max40960": cfg(QWEN3, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 32768}),
    "qwen3_factor4_orig32768_max131072": cfg(QWEN3, max_position_embeddings=131072,
                                             rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 32768}),
    "factor4_no_orig_max32768": cfg(QWEN3, max_position_embeddings=32768,
                                    rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "legacy_type_factor2_beta16_2": cfg(QWEN3, max_position_embeddings=32768,
                                        rope_scaling={"type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 2}),
    "mscale1_all1_factor4": cfg(QWEN3, max_position_embeddings=32768,
                                rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "mscale07_all1_factor8": cfg(QWEN3, max_position_embeddings=32768,
                                 rope_scaling={"rope_type": "yarn", "factor": 8.0, "mscale": 0.707, "mscale_all_dim": 1.0}),
    "attention_factor12_truncate_false": cfg(QWEN3, max_position_embeddings=32768,
                                            rope_scaling={"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.2,
                                                          "truncate": False}),
    "rope_parameters_layout_factor8_orig4096": {k: v for k, v in cfg(QWEN3, max_position_embeddings=32768,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 8.0,
                         "original_max_position_embeddings": 4096}).items() if k != "rope_theta"},
    "factor1": cfg(QWEN3, max_position_embeddings=32768, rope_scaling={"rope_type": "yarn", "factor": 1.0}),
    "factor05": cfg(QWEN3, max_position_embeddings=32768, rope_scaling={"rope_type": "yarn", "factor": 0.5}),
    "beta_fast_below_slow": cfg(QWEN3, max_position_embeddings=32768,
                                rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 32}),
    "head_dim32_theta1e6_factor4_orig1024": cfg(QWEN3, head_dim=32, max_position_embeddings=4096,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}),
    "head_dim16_theta1e4_factor2_trunc_false": cfg(QWEN3, head_dim=16, rope_theta=10000.0, max_position_embeddings=2048,
        rope_scaling={"type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 2, "truncate": False}),
}
POSITIONS = [0, 1, 7, 1000, 4095, 5000, 32767, 40000, 131071]

def rope_case(d):
    try:
        c = Qwen3Config.from_dict(dict(d))
        r = Qwen3RotaryEmbedding(config=c)
        x = torch.zeros(1, 1, dtype=torch.float32)
        pos = torch.tensor([POSITIONS])
        cos, sin = r(x, pos)
        half = cos.shape[-1] // 2
        return {"config": d, "standardized": getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None),
                "inv_freq": r.inv_freq.float().tolist(), "attention_scaling": float(r.attention_scaling),
                "positions": POSITIONS, "cos": cos[0, :, :half].tolist(), "sin": sin[0, :, :half].tolist()}
    except Exception as e:  # what transformers refuses is as much a reference as what it computes
        return {"config": d, "error": f"{type(e).__name__}: {e}"}

def main():
    data, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    res = {"transformers": transformers.__version__, "torch": torch.__version__,
           "cases": {k: rope_case(v) for k, v in ROPE_CASES.items()}}
    json.dump(res, open(os.path.join(out, "rope_params.json"), "w"), indent=1, default=str)
    print("wrote rope_params.json")
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog near the riverbank at dawn, number %d." % i
                            for i in range(120)])
    prompts = ["The capital of France is", "Hello", long_prompt]
    variants = {
        "tiny-yarn": ("tiny", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                "original_max_position_embeddings": 1024})),
        "tiny-untied-yarn": ("tiny-untied", lambda c: c["rope_parameters"].update(
            {"rope_type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 2, "truncate": False,
             "attention_factor": 1.1})),
        "tiny-yarn-legacy-type": ("tiny", lambda c: c.update(rope_scaling={"type": "yarn", "factor": 2.0,
                                                                            "mscale": 0.8, "mscale_all_dim": 1.0})),
    }
    for name, (src, edit) in variants.items():
        d = os.path.join("/tmp", name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(os.path.join(data, src), d)
        c = json.load(open(os.path.join(d, "config.json")))
        edit(c)
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
        shutil.copy(os.path.join(d, "config.json"), os.path.join(out, name + ".config.json"))
        args = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.py"), d,
                os.path.join(out, name + ".reference.json"), "--steps", "32", "--topk", "5",
                "--dtype", "float32", "--device", "cpu"]
        for p in prompts:
            args += ["--prompt", p]
        subprocess.run(args, check=True)
    print("done")

if __name__ == "__main__":
    main()
