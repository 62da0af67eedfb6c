# call 3 (issue 19, item 1): a plan equal to the one its resident buffers hold is not written again (one dispatch
# less a step). The engine at batch 1 (random SmolLM2 weights, fused layers, the defaults), before (this tree with
# scripts/model_runner_before.py, HEAD's: not kept, it is `git show c679262:jaxspec/engine/model_runner.py`) and after, alternating, one process each: plain (3 repeats) x2 each, EAGLE
# k = 3 at synthetic acceptance 0.6 (3 repeats) x1 each; which buffers move (scripts/addr.py); then hd.py (the dispatch breakdown, host events) after
set -u
export PYTHONUNBUFFERED=1
D=bench/results/20261206-h200-status
mkdir -p $OUT/r
rm -rf /root/base && mkdir -p /root/base && cp -r jaxspec bench /root/base/ && for x in models weights pyproject.toml Makefile; do ln -s $PWD/$x /root/base/$x; done && cp $D/scripts/model_runner_before.py /root/base/jaxspec/engine/model_runner.py
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
T="bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
E='{"num_speculative_tokens": 3}'
run() {  # tree name, output name, extra args
  local dir=$PWD; [ $1 = before ] && dir=/root/base
  echo "=== [t=$SECONDS] $2"
  (cd $dir && PYTHONPATH=$dir timeout 120 python3 $T "${@:3}" --output-json $OUT/r/$2.json > $OUT/r/$2.log 2>&1); echo "rc $?"
}
run before plain-before-1 --repeats 3
run after plain-after-1 --repeats 3
run before plain-before-2 --repeats 3
run after plain-after-2 --repeats 3
run after eagle-after --repeats 3 --speculative-config "$E" --synthetic-acceptance 0.6
run before eagle-before --repeats 3 --speculative-config "$E" --synthetic-acceptance 0.6
for f in $OUT/r/*.json; do python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
for p in d['points']:
    print(sys.argv[1].rsplit('/', 1)[1], p['mode'], round(p['output_tokens_per_s'], 1),
          [round(v, 1) for v in p.get('repeats_output_tokens_per_s') or []], round(p['wall_per_step_ms'], 3),
          {k: round(v, 3) for k, v in p.items() if 'host' in k and isinstance(v, float)})
" $f; done
for t in after before; do
  dir=$PWD; [ $t = before ] && dir=/root/base
  echo "=== [t=$SECONDS] addr $t"
  (cd $dir && PYTHONPATH=$dir N=30 timeout 90 python3 $OLDPWD/$D/scripts/addr.py 2>&1 | grep -v Warn | tail -2)
done
P=--xla_enable_command_buffers_during_profiling=true
echo "=== [t=$SECONDS] hd after"
JAXSPEC_FUSED_DECODE=1 XLA_FLAGS="$P" PYTHONPATH=. timeout 150 python3 $D/scripts/hd.py after > $OUT/r/hd-after.log 2>&1; echo "rc $?"
grep -v Warn $OUT/r/hd-after.log | grep -A24 "^== " | head -24
cp $OUT/hd-*.json $OUT/r/ 2>/dev/null; rm -f $OUT/hd-*.json; cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
