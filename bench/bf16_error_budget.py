#!/usr/bin/env python3
"""How far a bf16 engine's logits sit from float32: Hugging Face transformers run in bfloat16 against the
same checkpoint in float32 (both on the GPU, TF32 off), teacher-forced over a random prompt.

Usage: bf16_error_budget.py CKPT [CKPT ...] [--tokens 128] [--out FILE.jsonl]
Prints, per checkpoint, the relative L2 error of the bf16 logits at every prompt position (worst, median,
last). kite's correctness gate (relative L2 of its GPU logits against its float32 CPU backend) is read
against these numbers: see docs/BENCHMARKS.md."""
import argparse, json, statistics, torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("ckpt", nargs="+")
ap.add_argument("--tokens", type=int, default=128)
ap.add_argument("--out", default=None)
a = ap.parse_args()
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
rows = []
for path in a.ckpt:
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    ids = torch.randint(0, ref.config.vocab_size, (1, a.tokens), device="cuda")
    with torch.no_grad():
        l32 = ref(ids).logits[0].float()
    del ref
    torch.cuda.empty_cache()
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        l16 = m(ids).logits[0].float()
    del m
    torch.cuda.empty_cache()
    err = ((l16 - l32).norm(dim=-1) / l32.norm(dim=-1)).tolist()
    row = {"test": "bf16_vs_fp32_logits_rel_l2", "peer": "transformers", "model": path, "tokens": a.tokens,
           "worst": round(max(err), 5), "median": round(statistics.median(err), 5), "last": round(err[-1], 5),
           "gpu": torch.cuda.get_device_name(0)}
    rows.append(row)
    print(json.dumps(row), flush=True)
if a.out:
    with open(a.out, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
