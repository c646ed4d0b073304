#!/usr/bin/env python3
"""transformers' reference outputs for an FP8 checkpoint in Qwen's layout, as JSON: the same JSON as
reference.py, with the FP8 weights dequantized by transformers itself (FineGrainedFP8Config(dequantize=True):
w = q x weight_scale_inv per 128x128 block, then the forward in --dtype), so no fp8 kernel is needed.

Runs where torch + transformers (>= 4.53, which has FineGrainedFP8Config.dequantize) exist: the GPU machine.
Usage:
  python3 fp8_reference.py CKPT OUT.json --prompt "text" [--prompt ...] [--steps 32] [--topk 5]
                           [--dtype float32|bfloat16] [--device cpu|cuda]
kite's counterpart: `kite run --model CKPT --weights fp8 --backend cpu` computes on q x scale_inv in float32
(--dtype float32 here); `--weights bf16` rounds the dequantized weights to bf16 (--dtype bfloat16 here).
"""
import argparse, json, torch
from transformers import AutoModelForCausalLM, FineGrainedFP8Config
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt"); ap.add_argument("out")
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.ckpt + "/tokenizer.json")
    m = AutoModelForCausalLM.from_pretrained(a.ckpt, dtype=getattr(torch, a.dtype),
                                             quantization_config=FineGrainedFP8Config(dequantize=True))
    m = m.to(a.device).eval()
    res = []
    with torch.no_grad():
        for p in a.prompt or ["The capital of France is"]:
            ids = tok.encode(p, add_special_tokens=False).ids
            x = torch.tensor([ids], device=a.device)
            lp = torch.log_softmax(m(x).logits[0].float(), -1)
            top = torch.topk(lp[-1], a.topk)
            steps, cur = [], x
            for _ in range(a.steps):
                l = torch.log_softmax(m(cur).logits[0, -1].float(), -1)
                t = torch.topk(l, a.topk)
                steps.append({"token": int(t.indices[0]), "top_ids": t.indices.tolist(),
                              "top_logprobs": t.values.tolist()})
                cur = torch.cat([cur, t.indices[:1].view(1, 1)], 1)
            res.append({"prompt": p, "prompt_ids": ids, "prompt_argmax": lp.argmax(-1).tolist(),
                        "last_top_ids": top.indices.tolist(), "last_top_logprobs": top.values.tolist(),
                        "greedy": [s["token"] for s in steps], "steps": steps})
    json.dump({"ckpt": a.ckpt, "dtype": a.dtype, "device": a.device, "results": res}, open(a.out, "w"))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
