# Ran on this session's tree with the persistent layer applied: git apply scripts/persistent_layer.patch, cp scripts/grid_sync.py
# jaxspec/models/, cp scripts/test_grid_sync.py tests/ (not landed: see README.md).
# call 2: (a) the grid-barrier probe; (b) tests/test_gpu.py's grid_sync test and fused-layer test at SmolLM2's
# head shapes (the persistent layer equal to the five kernels bit for bit, both against XLA); (c) the engine at
# batch 1 (random SmolLM2 weights, 1,024 tokens): five kernels a layer (F), the persistent layer without (P0) and
# with (P1) its MLP weights loaded before the barriers, alternating, one process each: plain x2 each, EAGLE k = 3
# at synthetic acceptance 0.6 x1 for F and P1.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
echo "=== [t=$SECONDS] barrier"
timeout 120 python3 bench/results/20261207-grid-barrier/scripts/barrier.py 2>&1 | grep -v Warn | tee $OUT/r/barrier.log | tail -20
echo "=== [t=$SECONDS] test_gpu"
JAX_PLATFORMS=cuda PYTHONPATH=. timeout 200 python3 -m pytest -x -q tests/test_gpu.py -k "grid_sync or (fused_layers and 576)" -p no:cacheprovider > $OUT/r/test_gpu.log 2>&1; echo "rc $?"; tail -5 $OUT/r/test_gpu.log
T="bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --repeats 3"
E='{"num_speculative_tokens": 3}'
HUNG=0
run() {  # persistent flag, prefetch flag, output name, extra args (persistent runs skipped once one timed out)
  echo "=== [t=$SECONDS] $3"
  [ $1 = 1 ] && [ $HUNG = 1 ] && { echo skipped; return; }
  JAXSPEC_PERSISTENT_LAYER=$1 JAXSPEC_PERSISTENT_PREFETCH=$2 PYTHONPATH=. timeout 100 python3 $T "${@:4}" --output-json $OUT/r/$3.json > $OUT/r/$3.log 2>&1; rc=$?; echo "rc $rc"
  [ $1 = 1 ] && [ $rc = 124 ] && HUNG=1; return 0
}
run 1 1 plain-P1-1
run 0 1 plain-F-1
run 1 0 plain-P0-1
run 0 1 plain-F-2
run 1 1 plain-P1-2
run 1 0 plain-P0-2
run 1 1 eagle-P1 --speculative-config "$E" --synthetic-acceptance 0.6
run 0 1 eagle-F --speculative-config "$E" --synthetic-acceptance 0.6
for f in $OUT/r/*.json; do python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
for p in d['points']:
    print(sys.argv[1].rsplit('/', 1)[1], p['mode'], round(p['output_tokens_per_s'], 1),
          [round(v, 1) for v in p.get('repeats_output_tokens_per_s') or []], round(p['wall_per_step_ms'], 3),
          {k: round(v, 3) for k, v in p.items() if 'host' in k and isinstance(v, float)})
" $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
