#!/usr/bin/env python3
"""A long prompt with YaRN through kite's CUDA backend against transformers bf16, on the GPU machine.

  KITE_LIBRARY=build/libkite.so PYTHONPATH=python python3 long_prompt_check.py CKPT_DIR [--tokens 100000]
      [--forced-at 64000] [--steps 16] [--out FILE.json]

CKPT_DIR: a Qwen3 checkpoint in the hub layout (make_checkpoint.py); its config.json gets Qwen's documented YaRN
setting (rope_scaling {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}) unless it
has one. The prompt is --tokens random ids (seeded). Checks, by DESIGN.md's near-tie rule (identical until the
first difference, and there each side's token in the other's top-5):
  1. greedy: --steps tokens after the whole prompt, kite against transformers (bf16, sdpa, cuda);
  2. teacher-forced: the next token after each of 32 prefixes ending at --forced-at + i (i < 32): kite's greedy
     token against transformers' argmax of the prompt's logits at that position (each compared on its own).
Exit 0 when both hold; the JSON says what each side produced."""
import argparse, json, os, sys, time
import torch
from transformers import AutoModelForCausalLM

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def ensure_yarn(ckpt):
    path = os.path.join(ckpt, "config.json")
    cfg = json.load(open(path))
    if not cfg.get("rope_scaling") and not (cfg.get("rope_parameters") or {}).get("rope_type") == "yarn":
        cfg["rope_scaling"] = dict(YARN)
        json.dump(cfg, open(path, "w"), indent=2)
    return cfg


def top5_transformers(logits):
    t = torch.topk(logits.float(), 5)
    return t.indices.tolist()


def near_tie_compare(a_tokens, a_top5, b_tokens, b_top5):
    """Identical until the first difference; there each side's token in the other's top-5."""
    for i, (x, y) in enumerate(zip(a_tokens, b_tokens)):
        if x != y:
            return {"first_difference": i, "ok": x in b_top5[i] and y in a_top5[i]}
    return {"first_difference": None, "ok": True}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--tokens", type=int, default=100000)
    ap.add_argument("--forced-at", type=int, default=64000)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cfg = ensure_yarn(a.ckpt)
    g = torch.Generator().manual_seed(a.seed)
    prompt = torch.randint(0, cfg["vocab_size"], (a.tokens,), generator=g).tolist()
    forced = [a.forced_at + i for i in range(32)]
    if forced[-1] + 1 >= a.tokens:
        sys.exit("long_prompt_check: --forced-at + 32 must lie inside the prompt")

    # transformers: the prompt once (hidden states, the lm_head only where needed), then greedy with its cache.
    m = AutoModelForCausalLM.from_pretrained(a.ckpt, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    with torch.no_grad():
        ids = torch.tensor([prompt], device="cuda")
        out = m.model(input_ids=ids, use_cache=True)
        hidden = out.last_hidden_state[0]
        forced_top5 = [top5_transformers(m.lm_head(hidden[p])) for p in forced]
        cache = out.past_key_values
        logits = m.lm_head(hidden[-1])
        hf_tokens, hf_top5 = [], []
        for _ in range(a.steps):
            top = top5_transformers(logits)
            hf_tokens.append(top[0])
            hf_top5.append(top)
            step = m(input_ids=torch.tensor([[top[0]]], device="cuda"), past_key_values=cache, use_cache=True)
            cache = step.past_key_values
            logits = step.logits[0, -1]
    del m, out, hidden, cache
    torch.cuda.empty_cache()

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
    import kite
    with kite.Model(a.ckpt, backend="cuda") as model:
        t0 = time.time()
        c = model.generate(prompt, max_tokens=a.steps, logprobs=5, ignore_eos=True)
        greedy_s = time.time() - t0
        kite_tokens = list(c.tokens)
        kite_top5 = [[t for t, _ in step.top] for step in c.logprobs]
        forced_runs = model.generate_batch([prompt[:p + 1] for p in forced], max_tokens=1, logprobs=5, ignore_eos=True)
    greedy = near_tie_compare(kite_tokens, kite_top5, hf_tokens, hf_top5)
    forced_results = []
    for p, run, hf in zip(forced, forced_runs, forced_top5):
        k_tok, k_top = run.tokens[0], [t for t, _ in run.logprobs[0].top]
        forced_results.append({"position": p, "kite": k_tok, "transformers": hf[0],
                               "ok": k_tok == hf[0] or (k_tok in hf and hf[0] in k_top)})
    result = {"tokens": a.tokens, "rope_scaling": cfg.get("rope_scaling"), "steps": a.steps,
              "greedy": {"kite": kite_tokens, "transformers": hf_tokens, **greedy, "kite_seconds": round(greedy_s, 3)},
              "forced": {"positions": [forced[0], forced[-1]],
                         "identical": sum(r["kite"] == r["transformers"] for r in forced_results),
                         "near_ties": sum(r["kite"] != r["transformers"] and r["ok"] for r in forced_results),
                         "failures": [r for r in forced_results if not r["ok"]]}}
    ok = greedy["ok"] and not result["forced"]["failures"]
    result["ok"] = ok
    text = json.dumps(result)
    print(text)
    if a.out:
        open(a.out, "w").write(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
