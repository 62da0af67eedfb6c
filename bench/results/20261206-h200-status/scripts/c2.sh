# call 2 (issue 19): the engine at batch 1, plain with XLA's layers (3 repeats), and with EAGLE k = 3 at synthetic acceptance 0.6 (5 repeats), fused layers on
# / off, one process each; Llama-3-8B shapes: the plain step at batch 1-32 and the k = 2 verify+draft step at 96 rows
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
T="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
E='{"num_speculative_tokens": 3}'
echo "=== [t=$SECONDS] fused=0 plain"
JAXSPEC_FUSED_DECODE=0 timeout 90 $T --repeats 3 --output-json $OUT/r/tp-plain-f0.json > $OUT/r/tp-plain-f0.log 2>&1; echo "rc $?"
for f in 1 0; do
  echo "=== [t=$SECONDS] fused=$f eagle k=3"
  JAXSPEC_FUSED_DECODE=$f timeout 110 $T --repeats 5 --speculative-config "$E" --synthetic-acceptance 0.6 --output-json $OUT/r/tp-eagle-f$f.json > $OUT/r/tp-eagle-f$f.log 2>&1; echo "rc $?"
done
for f in $OUT/r/tp-*.json; do python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
for p in d['points']:
    print(sys.argv[1].rsplit('/', 1)[1], p['mode'], round(p['output_tokens_per_s'], 1),
          [round(v, 1) for v in p.get('repeats_output_tokens_per_s') or []], round(p['wall_per_step_ms'], 3),
          {k: round(v, 3) for k, v in p.items() if 'host' in k and isinstance(v, float)})
" $f; done
echo "=== [t=$SECONDS] 8B plain step, batch 1-32"
timeout 200 python3 bench/step_time.py --hf-config llama-3-8b --context 512 --iters 30 --batches 1,8,32 --k 0 --output-json $OUT/r/st8b.json > $OUT/r/st8b.log 2>&1; echo "rc $?"
grep "^B=" $OUT/r/st8b.log
echo "=== [t=$SECONDS] 8B k=2 at 96 rows"
timeout 150 python3 bench/step_time.py --hf-config llama-3-8b --context 512 --iters 20 --batches 96 --k 2 --output-json $OUT/r/st8b-k2.json > $OUT/r/st8b-k2.log 2>&1; echo "rc $?"
grep "^B=" $OUT/r/st8b-k2.log
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
