# call 1 (its part (a), the grid-barrier probe, ran in call 2: bench/results/20261207-grid-barrier/); (b) EAGLE k = 3 at
# batch 1, synthetic acceptance 0.6, before (c679262's model_runner.py: the plan written every step) and after
# (0456a8e: an unchanged plan not written), alternating, 3 pairs, one process each (scripts/model_runner_before.py
# is not kept: `git show c679262:jaxspec/engine/model_runner.py`); (c) page_lookahead 0 vs 64
# (the default) at 24 and 96 prompts, k = 3, synthetic 0.6, one process each, alternating.
set -u
export PYTHONUNBUFFERED=1
D=bench/results/20261207-status
mkdir -p $OUT/r
rm -rf /root/base && mkdir -p /root/base && cp -r jaxspec bench /root/base/ && for x in models weights pyproject.toml Makefile; do ln -s $PWD/$x /root/base/$x; done && cp $D/scripts/model_runner_before.py /root/base/jaxspec/engine/model_runner.py
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u

# (the barrier probe ran in call 2)
T="bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 1024 --ignore-eos --prefill-buckets 128"
E='{"num_speculative_tokens": 3}'
run() {  # tree name, output name, extra args
  local dir=$PWD; [ $1 = before ] && dir=/root/base
  echo "=== [t=$SECONDS] $2"
  (cd $dir && PYTHONPATH=$dir timeout 120 python3 $T "${@:3}" --output-json $OUT/r/$2.json > $OUT/r/$2.log 2>&1); echo "rc $?"
}
B1="--num-prompts 1 --decode-buckets 1 --repeats 3 --synthetic-acceptance 0.6"
for i in 1 2 3; do run after eagle-after-$i $B1 --speculative-config "$E"; run before eagle-before-$i $B1 --speculative-config "$E"; done
T="bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048"
for n in 24 96; do
  L="--num-prompts $n --decode-buckets $n --repeats 3 --synthetic-acceptance 0.6"
  run after look64-$n $L --speculative-config "$E"; run after look0-$n $L --speculative-config "$E" --page-lookahead 0
done
for f in $OUT/r/*.json; do python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
for p in d['points']:
    print(sys.argv[1].rsplit('/', 1)[1], p['mode'], round(p['output_tokens_per_s'], 1),
          [round(v, 1) for v in p.get('repeats_output_tokens_per_s') or []], round(p['wall_per_step_ms'], 3),
          {k: round(v, 3) for k, v in p.items() if 'host' in k and isinstance(v, float)})
" $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
