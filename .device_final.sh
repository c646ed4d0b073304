# final verification call A: GPU tests and benchmark rows of the committed main
source .device_in/fin/unpack.sh >/dev/null
B=/tmp/f/main
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
for t in cuda_ops_test cuda_e2e_test engine_gpu_test engine_sampling_test bench_gpu_test; do
  [ -x $B/$t ] || { echo "$t missing"; continue; }
  timeout 240 $B/$t > $OUT/$t.log 2>&1; echo "$t exit $?"; grep -E "FAIL|passed|CUDA|cuda" $OUT/$t.log | tail -3
done
timeout 100 $B/attention_prefill_bench 2048 4096 16384 32768 > $OUT/attention.jsonl 2>&1; echo "attn exit $?"; cut -c1-160 $OUT/attention.jsonl
timeout 200 $B/kite bench --dummy qwen3-0.6b-base -p 2048,16384,32000 -n 0 -r 3 -o jsonl > $OUT/pp06.jsonl 2>&1; echo "pp06 exit $?"
timeout 200 $B/kite bench --dummy qwen3-1.7b-base -p 2048,32000 -n 0 -r 3 -o jsonl > $OUT/pp17.jsonl 2>&1; echo "pp17 exit $?"
timeout 120 $B/kite bench --dummy qwen3-0.6b-base --rope-scaling '{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}' -p 0 -n 128 --depth 32768 -r 3 -o jsonl > $OUT/tg_deep.jsonl 2>&1; echo "tgdeep exit $?"
timeout 120 $B/kite bench --dummy qwen3-0.6b-base -p 256 -n 128 --depth 256 -o jsonl > $OUT/base06.jsonl 2>&1; echo "base exit $?"
timeout 120 $B/kite bench --dummy qwen3-0.6b-base -p 0 -n 128 -b 128 --depth 256 -o jsonl > $OUT/b128.jsonl 2>&1; echo "b128 exit $?"
for f in pp06 pp17 tg_deep base06 b128; do python3 -c "
import json,sys
for l in open('$OUT/$f.jsonl'):
    l=l.strip()
    if not l.startswith('{'): print(l[:200]); continue
    r=json.loads(l); print(r['model'], r['test'], 'B', r['batch'], 'd', r['depth'], r.get('tok_s'), r['gate'])
"; done
