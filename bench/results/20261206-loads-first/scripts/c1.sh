# call 1 (issue 19): fused_layer's row-by-row kernels issuing every load before any sum across threads. GPU tests;
# the kernels alone against XLA's ops (kd.py); a step (bench/step_time.py) and the engine at batch 1
# (bench/throughput.py, random SmolLM2 weights, 1,024 tokens, EOS ignored, 3 repeats), fused layers off / on
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=bench/results/20261206-loads-first
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"
echo "=== [t=$SECONDS] gpu tests"
JAX_PLATFORMS=cuda timeout 200 python3 -m pytest -q tests/test_gpu.py -k fused -p no:cacheprovider > $OUT/r/gpu-tests.log 2>&1
echo "tests rc $?"; tail -2 $OUT/r/gpu-tests.log
echo "=== [t=$SECONDS] kernels"
timeout 120 python3 $D/scripts/kd.py > $OUT/r/kd.log 2>&1; echo "kd rc $?"; cp $OUT/kd.json $OUT/r/ 2>/dev/null
grep -v Warning $OUT/r/kd.log | tail -5
S="python3 bench/step_time.py --hf-config smollm2-135m --context 512 --iters 30 --batches 1 --k 0"
for f in 0 1; do
  echo "=== [t=$SECONDS] step_time fused=$f"
  JAXSPEC_FUSED_DECODE=$f timeout 100 $S --output-json $OUT/r/st-f$f.json > $OUT/r/st-f$f.log 2>&1; echo "rc $?"
  grep "^B=" $OUT/r/st-f$f.log
done
T="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --repeats 3"
E='{"num_speculative_tokens": 3}'
for f in 1 0; do
  echo "=== [t=$SECONDS] fused=$f plain"
  JAXSPEC_FUSED_DECODE=$f timeout 90 $T --output-json $OUT/r/tp-plain-f$f.json > $OUT/r/tp-plain-f$f.log 2>&1; echo "rc $?"
  echo "=== [t=$SECONDS] fused=$f eagle k=3"
  JAXSPEC_FUSED_DECODE=$f timeout 100 $T --speculative-config "$E" --synthetic-acceptance 0.6 --output-json $OUT/r/tp-eagle-f$f.json > $OUT/r/tp-eagle-f$f.log 2>&1; echo "rc $?"
done
for f in $OUT/r/tp-*.json; do python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
for p in d['points']:
    print(sys.argv[1].rsplit('/', 1)[1], p['mode'], round(p['output_tokens_per_s'], 1),
          [round(v, 1) for v in p.get('repeats_output_tokens_per_s') or []], round(p['wall_per_step_ms'], 3), p['outputs_sha256'][:12])
" $f; done
echo "done t=$SECONDS"
