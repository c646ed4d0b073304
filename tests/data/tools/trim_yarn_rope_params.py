#!/usr/bin/env python3
"""tests/data/yarn/rope_params.json from make_yarn_references.py's rope_params.json, smaller: every case's config,
standardized parameters, inv_freq and attention scaling (or error), and cos / sin only for the cases in KEEP_ANGLES.

  python3 trim_yarn_rope_params.py OUTDIR/rope_params.json tests/data/yarn/rope_params.json
"""
import json, sys

KEEP_ANGLES = {"qwen3_doc_factor4_orig32768_max40960", "attention_factor12_truncate_false",
               "head_dim16_theta1e4_factor2_trunc_false"}

def main():
    full = json.load(open(sys.argv[1]))
    for name, case in full["cases"].items():
        if name not in KEEP_ANGLES:
            for key in ("positions", "cos", "sin"):
                case.pop(key, None)
    with open(sys.argv[2], "w") as out:
        json.dump(full, out, separators=(",", ":"))
        out.write("\n")

if __name__ == "__main__":
    main()
