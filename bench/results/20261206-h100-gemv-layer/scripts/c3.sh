# call 3: wider column blocks for the one-token kernels (kg.py wide); then the engine end to end at batch 1
# (bench/throughput.py, random SmolLM2 weights, 1,024 tokens, EOS ignored, 3 repeats), fused layers off / on
# (one-token forwards: KernelConfig.fused_decode_tokens 1): no speculation at 1 and 8 scheduler steps a dispatch,
# EAGLE k = 3 at synthetic acceptance 0.6 (the head's one-token passes fused, the 4-token verify XLA's)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=bench/results/20261206-h100-gemv-layer
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
timeout 150 python3 $D/scripts/kg.py wide > $OUT/r/kg2.log 2>&1; echo "kg2 rc $?"; cp $OUT/kg-1.json $OUT/r/ 2>/dev/null
grep -v Warning $OUT/r/kg2.log | tail -8
T="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --repeats 3"
E='{"num_speculative_tokens": 3}'
for f in 0 1; do
  echo "=== [t=$SECONDS] fused=$f plain M=1"
  JAXSPEC_FUSED_DECODE=$f timeout 100 $T --output-json $OUT/r/tp-plain-m1-f$f.json > $OUT/r/tp-plain-m1-f$f.log 2>&1; echo "rc $?"
  echo "=== [t=$SECONDS] fused=$f plain M=8"
  JAXSPEC_FUSED_DECODE=$f timeout 100 $T --num-scheduler-steps 8 --output-json $OUT/r/tp-plain-m8-f$f.json > $OUT/r/tp-plain-m8-f$f.log 2>&1; echo "rc $?"
  echo "=== [t=$SECONDS] fused=$f eagle k=3"
  JAXSPEC_FUSED_DECODE=$f timeout 120 $T --speculative-config "$E" --synthetic-acceptance 0.6 --output-json $OUT/r/tp-eagle-f$f.json > $OUT/r/tp-eagle-f$f.log 2>&1; echo "rc $?"
done
for f in $OUT/r/tp-*.json; do python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
for p in d['points']:
    print(sys.argv[1].rsplit('/', 1)[1], p['mode'], 'async' if p['async'] else 'sync', round(p['output_tokens_per_s'], 1),
          p.get('repeats_output_tokens_per_s'), round(p['wall_per_step_ms'], 3), p['outputs_sha256'][:12])
" $f; done
echo "done t=$SECONDS"
