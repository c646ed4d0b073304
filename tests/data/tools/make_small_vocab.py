#!/usr/bin/env python3
"""tests/data/tiny-vocab1k: the tiny checkpoint with a 1,024-id vocabulary, for the tests that run token ids.

tiny's 151,936-id vocabulary is the real Qwen3 tokenizer's; per generated token the CPU backend reads its whole
lm_head (19 MB of float32) and the sampler scans every id, which is most of what the engine tests spend. This
checkpoint has tiny's layers, norms and config unchanged, and embed_tokens (the tied lm_head) cut to its first
1,024 rows. Its tokenizer is Qwen3's own cut to fit: the 256 byte tokens and the first 742 merges (merge i makes
id 256 + i, so ids 0-997 and their text are Qwen3's), then Qwen3's 26 added tokens (<|endoftext|>, <|im_start|>,
<|im_end|>, <tool_call>, <think>, ...) at ids 998-1023 in their order. Any text still encodes (byte-level BPE
falls back to bytes), the chat template is Qwen3's, and bos/eos name <|endoftext|> at its new id.

Standard library only; deterministic (the same bytes on every run):
    python3 tests/data/tools/make_small_vocab.py tests/data/tiny tests/data/tokenizer tests/data/tiny-vocab1k
With --check it writes into a temporary folder and exits 1 unless every file equals OUT's (ctest
small_vocab_data_test: the committed checkpoint is what this script makes of the committed tiny).
"""
import argparse
import filecmp
import json
import os
import struct
import sys
import tempfile

VOCAB_SIZE = 1024


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, dtype, shape, bytes), written in this order."""
    header = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, blob in tensors:
            f.write(blob)


def cut_weights(src, dst, vocab_size):
    header, data = read_safetensors(os.path.join(src, "model.safetensors"))
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        blob, shape = data[begin:end], list(info["shape"])
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            row_bytes = len(blob) // shape[0]
            blob, shape = blob[: vocab_size * row_bytes], [vocab_size] + shape[1:]
        tensors.append((name, info["dtype"], shape, blob))
    write_safetensors(os.path.join(dst, "model.safetensors"), tensors, header.get("__metadata__", {}))


def cut_tokenizer(tokenizer_dir, dst, vocab_size):
    """Returns {old added-token id: new id}."""
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    added = tok["added_tokens"]
    n_text = vocab_size - len(added)
    model = tok["model"]
    assert model["type"] == "BPE"
    vocab = {piece: i for piece, i in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if i < n_text}
    assert sorted(vocab.values()) == list(range(n_text)), "the kept ids are not 0..n-1"
    merges = model["merges"][: n_text - 256]
    for rank, merge in enumerate(merges):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        assert vocab.get(left + right) == 256 + rank and left in vocab and right in vocab, merge
    model["vocab"] = vocab
    model["merges"] = merges
    remap = {}
    for k, token in enumerate(added):
        remap[token["id"]] = n_text + k
        token["id"] = n_text + k
    with open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")

    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {str(remap[int(k)]): v for k, v in config["added_tokens_decoder"].items()}
    with open(os.path.join(dst, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    return remap


def remap_ids(value, remap):
    return [remap[v] for v in value] if isinstance(value, list) else remap[value]


def write(checkpoint, tokenizer, out):
    os.makedirs(out, exist_ok=True)
    cut_weights(checkpoint, out, VOCAB_SIZE)
    remap = cut_tokenizer(tokenizer, out, VOCAB_SIZE)
    for name in ("config.json", "generation_config.json"):
        with open(os.path.join(checkpoint, name), encoding="utf-8") as f:
            config = json.load(f)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if config.get(key) is not None:
                config[key] = remap_ids(config[key], remap)
        if "vocab_size" in config:
            config["vocab_size"] = VOCAB_SIZE
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.write("\n")



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="tests/data/tiny")
    ap.add_argument("tokenizer", help="tests/data/tokenizer (tokenizer.json, tokenizer_config.json)")
    ap.add_argument("out", help="tests/data/tiny-vocab1k")
    ap.add_argument("--check", action="store_true", help="compare with OUT instead of writing it")
    a = ap.parse_args()
    if a.check:
        with tempfile.TemporaryDirectory() as made:
            write(a.checkpoint, a.tokenizer, made)
            names = sorted(os.listdir(made))
            _, differ, missing = filecmp.cmpfiles(made, a.out, names, shallow=False)
            for name in differ + missing:
                print(f"{a.out}/{name}: not what {sys.argv[0]} makes of {a.checkpoint}", file=sys.stderr)
            extra = sorted(set(os.listdir(a.out)) - set(names))
            for name in extra:
                print(f"{a.out}/{name}: not made by {sys.argv[0]}", file=sys.stderr)
            if differ or missing or extra:
                sys.exit(1)
            print(f"{a.out}: {len(names)} files, each what {sys.argv[0]} makes")
        return
    write(a.checkpoint, a.tokenizer, a.out)
    print("wrote", a.out, sorted(os.listdir(a.out)))


if __name__ == "__main__":
    main()
