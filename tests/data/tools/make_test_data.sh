#!/usr/bin/env bash
# Makes the checkpoints and transformers references under tests/data. Runs on a machine with torch,
# transformers and tokenizers (the GPU machine): bash tests/data/tools/make_test_data.sh OUTDIR
# make_checkpoint.py and reference.py are copies of the project's shared device scripts.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: make_test_data.sh OUTDIR}
tok=$here/../tokenizer   # tokenizer.json + tokenizer_config.json (the real Qwen3 files)
mkdir -p "$out"

# 1. tiny: make_checkpoint.py's own tiny shape (tied embeddings, hub-format config, one file).
python3 "$here/make_checkpoint.py" tiny "$out/tiny" --seed 1234 --tokenizer-dir "$tok"

# 2. tiny-untied: grouped-query attention (4 heads over 2 kv heads), head_dim larger than
#    hidden/heads, three layers, an untied lm_head, the newer transformers config layout
#    (rope_parameters, dtype) and two shards with an index.
python3 "$here/make_variant.py" "$out/tiny-untied" --tokenizer-dir "$tok"

prompts=(--prompt "The capital of France is"
         --prompt "Hello"
         --prompt "def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)"
         --prompt "北京是中国的首都，也是一座历史悠久的城市。"
         --prompt "In the beginning the Universe was created. This has made a lot of people very angry and been widely regarded as a bad move. Many races believe that it was created by some sort of god, though the Jatravartid people of Viltvodyle VI believe that the entire Universe was in fact sneezed out of the nose of a being called the Great Green Arkleseizure. The Jatravartids, who live in perpetual fear of the time they call The Coming of The Great White Handkerchief, are small blue creatures with more than fifty arms each, who are therefore unique in being the only race in history to have invented the aerosol deodorant before the wheel.")
for name in tiny tiny-untied; do
  python3 "$here/reference.py" "$out/$name" "$out/$name.reference.json" "${prompts[@]}" --steps 32 --topk 5 \
    --dtype float32 --device cpu
done

# 3. The fp8 test data (pure Python; runs anywhere, seconds): the F8_E4M3 linear weights and scales of tiny and
#    tiny-untied in Qwen's FP8 layout, which fp8_checkpoint_test compares kite's own quantization against and
#    assembles into whole FP8 checkpoints. Made from the committed checkpoints:
#      for name in tiny tiny-untied; do
#        python3 tests/data/tools/make_fp8_checkpoint.py tests/data/$name /tmp/$name-fp8 --only-quantized
#        cp /tmp/$name-fp8/model.safetensors tests/data/fp8/$name.quantized.safetensors
#      done
#      python3 tests/data/tools/make_fp8_checkpoint.py tests/data/tiny /tmp/tiny-fp8-bf16 --only-quantized \
#        --scale-dtype bf16
#      cp /tmp/tiny-fp8-bf16/model.safetensors tests/data/fp8/tiny.quantized-bf16-scales.safetensors
for name in tiny tiny-untied; do
  python3 "$here/make_fp8_checkpoint.py" "$out/$name" "$out/fp8/$name" --only-quantized
  mv "$out/fp8/$name/model.safetensors" "$out/fp8/$name.quantized.safetensors" && rmdir "$out/fp8/$name"
done
python3 "$here/make_fp8_checkpoint.py" "$out/tiny" "$out/fp8/tiny-bf16" --only-quantized --scale-dtype bf16
mv "$out/fp8/tiny-bf16/model.safetensors" "$out/fp8/tiny.quantized-bf16-scales.safetensors" && rmdir "$out/fp8/tiny-bf16"

# 4. tiny-vocab1k (pure Python; runs anywhere, a second): tiny with its embedding cut to the first 1,024 rows and
#    Qwen3's tokenizer cut to fit (the 256 byte tokens, the first 742 merges, the 26 added tokens at 998-1023),
#    for the tests that run token ids only. Made from the committed files:
#      python3 tests/data/tools/make_small_vocab.py tests/data/tiny tests/data/tokenizer tests/data/tiny-vocab1k
python3 "$here/make_small_vocab.py" "$out/tiny" "$tok" "$out/tiny-vocab1k"
