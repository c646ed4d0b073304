# final verification call B: a 100,000-token prompt with YaRN against transformers; process start to first token
source .device_in/fin/unpack.sh >/dev/null
tok=/tmp/kite-tokdir; mkdir -p $tok && cp tests/data/tokenizer/tokenizer.json tests/data/tokenizer/tokenizer_config.json $tok/ && cp -r configs $tok/configs
python3 tests/data/tools/make_checkpoint.py qwen3-0.6b-base /tmp/q06 --tokenizer-dir $tok > $OUT/make.log 2>&1; echo "make exit $?"
KITE_LIBRARY=/tmp/f/main/libkite.so PYTHONPATH=python timeout 300 python3 tests/data/tools/long_prompt_check.py /tmp/q06 --tokens 100000 --out $OUT/long_prompt.json > $OUT/long.log 2>&1; echo "long exit $?"; tail -c 1500 $OUT/long.log
python3 -c "
import random; random.seed(3); w='alpha beta gamma delta river stone cloud paper window garden silver music'.split()
open('/tmp/long.txt','w').write(' '.join(random.choice(w) for _ in range(99000)))"
for i in 1 2 3; do s=$(date +%s.%N); /tmp/f/main/kite run --model /tmp/q06 --prompt-file /tmp/long.txt --max-tokens 1 --backend cuda --json > $OUT/ttft.$i.json 2>$OUT/ttft.$i.err; rc=$?; e=$(date +%s.%N); echo "ttft run $i exit $rc $(python3 -c "print(round($e-$s,3))") s prompt_tokens $(python3 -c "import json;print(len(json.load(open('$OUT/ttft.$i.json'))['prompt_tokens']))" 2>/dev/null)"; done
