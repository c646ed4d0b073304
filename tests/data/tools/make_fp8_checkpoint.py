#!/usr/bin/env python3
"""Converts a bf16 Qwen3 hub checkpoint into the layout of Qwen's FP8 releases, in pure Python (no numpy, no
torch), with exactly kite's quantization (src/quant/fp8.h), so kite's bytes can be checked against it.

Usage:
  make_fp8_checkpoint.py SRC DST [--scale-dtype f32|bf16] [--only-quantized]

Every linear weight in the layers (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj) becomes F8_E4M3 plus
`<name>_scale_inv` [ceil(rows/128), ceil(cols/128)] (F32 by default: the exact float32 scales; bf16 rounds
them, as some releases store them); embed_tokens, the norms and lm_head are copied unchanged. DST gets
config.json with quantization_config added, one model.safetensors, and the other small files of SRC
(tokenizer, generation config) copied. --only-quantized writes only the F8 weights and their scales to
DST/model.safetensors (and no other file): the small test data that kite's fp8_checkpoint_test compares
its own quantization against.

The quantization, per 128x128 block (partial at the edges), in IEEE float32 with round-to-nearest-even:
  amax = max |w| (exact);  amax = max(amax, 1e-4f);  s = amax / 448;  q = e4m3(w / s), saturating at 448.
Python's floats are doubles; a double operation on float32 operands rounded once to float32 equals the
float32 operation (53 >= 2 x 24 + 2 bits), so f32(a / b) below is float32 division exactly.
Speed: about 30 million weights a minute on one core, so a 0.6B-shaped checkpoint (0.44 billion linear
weights) takes about a quarter of an hour; the tiny test checkpoints take a second.
"""
import argparse
import array
import json
import math
import os
import shutil
import struct
import sys

BLOCK = 128
E4M3_MAX = 448.0
LINEAR_SUFFIXES = tuple("%s.weight" % m for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                   "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                   "mlp.down_proj"))
QUANTIZATION_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                       "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": ["lm_head"]}
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}


def f32(x):
    """x rounded to float32 (nearest even)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


MIN_AMAX = f32(1e-4)


def e4m3_from_float(x):
    """kite's fp8_e4m3_from_float: x is a finite float32 value."""
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a > E4M3_MAX:
        return sign | 0x7E
    if a < 2.0 ** -6:
        units = a * 512.0  # exact
        whole = math.floor(units)
        fraction = units - whole
        code = int(whole)
        if fraction > 0.5 or (fraction == 0.5 and code & 1):
            code += 1
        return sign | code
    bits = struct.unpack("<I", struct.pack("<f", a))[0]
    exponent = (bits >> 23) - 127
    mantissa = bits & 0x7FFFFF
    kept, rest = mantissa >> 20, mantissa & 0xFFFFF
    code = ((exponent + 7) << 3) + kept
    if rest > 0x80000 or (rest == 0x80000 and kept & 1):
        code += 1
    return sign | min(code, 0x7E)


def e4m3_to_float(code):
    if code & 0x7F == 0x7F:
        return math.nan
    exponent, mantissa = (code >> 3) & 0xF, code & 7
    value = mantissa * 2.0 ** -9 if exponent == 0 else (8 + mantissa) * 2.0 ** (exponent - 10)
    return -value if code & 0x80 else value


def float_to_bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def f16_to_float(bits):
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def quantize(values, rows, cols, name):
    """values: float32 values row-major. Returns (bytes q, list of float32 scales row-major)."""
    n_block_rows, n_block_cols = -(-rows // BLOCK), -(-cols // BLOCK)
    q = bytearray(rows * cols)
    scales = []
    for bi in range(n_block_rows):
        r0, r1 = bi * BLOCK, min(bi * BLOCK + BLOCK, rows)
        for bj in range(n_block_cols):
            c0, c1 = bj * BLOCK, min(bj * BLOCK + BLOCK, cols)
            amax = 0.0
            for r in range(r0, r1):
                for v in values[r * cols + c0:r * cols + c1]:
                    if not math.isfinite(v):
                        sys.exit("%s: a NaN or infinite weight cannot be quantized" % name)
                    if abs(v) > amax:
                        amax = abs(v)
            s = f32(max(amax, MIN_AMAX) / E4M3_MAX)
            scales.append(s)
            for r in range(r0, r1):
                base = r * cols
                for c in range(c0, c1):
                    q[base + c] = e4m3_from_float(f32(values[base + c] / s))
    return bytes(q), scales


class SafetensorsReader:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.blob = f.read()
        (n,) = struct.unpack("<Q", self.blob[:8])
        self.header = json.loads(self.blob[8:8 + n])
        self.header.pop("__metadata__", None)
        self.base = 8 + n

    def raw(self, name):
        entry = self.header[name]
        begin, end = entry["data_offsets"]
        return self.blob[self.base + begin:self.base + end]

    def floats(self, name):
        entry, raw = self.header[name], self.raw(name)
        dtype = entry["dtype"]
        if dtype == "F32":
            return list(array.array("f", raw))
        halves = array.array("H", raw)
        if dtype == "BF16":  # a bf16 value is the top half of its float32
            return list(array.array("f", array.array("I", [h << 16 for h in halves]).tobytes()))
        if dtype == "F16":
            return [f16_to_float(h) for h in halves]
        sys.exit("%s: dtype %s cannot be quantized" % (name, dtype))


def open_checkpoint(src):
    single = os.path.join(src, "model.safetensors")
    if os.path.exists(single):
        files = [single]
    else:
        index = json.load(open(os.path.join(src, "model.safetensors.index.json")))
        files = [os.path.join(src, shard) for shard in sorted(set(index["weight_map"].values()))]
    tensors = {}
    for path in files:
        reader = SafetensorsReader(path)
        for name in reader.header:
            tensors[name] = reader
    return tensors


def write_safetensors(path, entries):
    """entries: list of (name, dtype, shape, bytes), written in name order, contiguous."""
    header, offset, blobs = {}, 0, []
    for name, dtype, shape, data in sorted(entries):
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def main():
    # safetensors is little-endian, and the arrays above are read in the host's order with 4-byte items.
    if sys.byteorder != "little" or array.array("I").itemsize != 4 or array.array("f").itemsize != 4:
        sys.exit("make_fp8_checkpoint.py: needs a little-endian host with 4-byte C ints and floats")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--scale-dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--only-quantized", action="store_true")
    a = ap.parse_args()
    tensors = open_checkpoint(a.src)
    config = json.load(open(os.path.join(a.src, "config.json")))
    if config.get("quantization_config"):
        sys.exit("%s: already quantized" % a.src)
    tied = config.get("tie_word_embeddings", False)
    os.makedirs(a.dst, exist_ok=True)
    entries = []
    for name in sorted(tensors):
        reader = tensors[name]
        entry = reader.header[name]
        if name == "lm_head.weight" and tied:
            continue  # transformers ignores a stored copy of a tied lm_head
        if name.startswith("model.layers.") and name.endswith(LINEAR_SUFFIXES):
            rows, cols = entry["shape"]
            q, scales = quantize(reader.floats(name), rows, cols, name)
            scale_shape = [-(-rows // BLOCK), -(-cols // BLOCK)]
            if a.scale_dtype == "f32":
                scale_bytes, scale_dtype = struct.pack("<%df" % len(scales), *scales), "F32"
            else:
                scale_bytes = struct.pack("<%dH" % len(scales), *[float_to_bf16(s) for s in scales])
                scale_dtype = "BF16"
            entries.append((name, "F8_E4M3", [rows, cols], q))
            entries.append((name + "_scale_inv", scale_dtype, scale_shape, scale_bytes))
        elif not a.only_quantized:
            entries.append((name, entry["dtype"], entry["shape"], reader.raw(name)))
    write_safetensors(os.path.join(a.dst, "model.safetensors"), entries)
    if a.only_quantized:
        return
    config["quantization_config"] = dict(QUANTIZATION_CONFIG)
    with open(os.path.join(a.dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    for other in sorted(os.listdir(a.src)):
        if other == "config.json" or other.startswith("model") and (other.endswith(".safetensors") or
                                                                   other.endswith(".index.json")):
            continue
        shutil.copy(os.path.join(a.src, other), os.path.join(a.dst, other))


if __name__ == "__main__":
    main()
