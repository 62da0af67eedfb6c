# call 1 (issue 19, item 1): where a batch-1 dispatch's host time goes now (scripts/hd.py: the dispatch breakdown,
# the host's traced events per dispatch, a cProfile of ModelRunner.decode; XLA's optimized HLO of the fused step
# dumped), fused layers on / off; the same with XLA's graphs of any size; then the engine at batch 1, plain, fused (3 repeats)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=bench/results/20261206-h200-status
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"; date -u
# jax.profiler turns XLA's command buffers off while it traces unless told otherwise: keep them, if this XLA knows the flag
P=--xla_enable_command_buffers_during_profiling=true
XLA_FLAGS=$P python3 -c "import jax.numpy as jnp; print(jnp.ones(3).sum())" > /dev/null 2>&1 || P=
echo "profiling flag: '$P'"
echo "=== [t=$SECONDS] hd fused=1 (XLA dump)"
JAXSPEC_FUSED_DECODE=1 XLA_FLAGS="--xla_dump_to=/root/dump --xla_dump_hlo_as_text $P" timeout 200 python3 $D/scripts/hd.py f1 > $OUT/r/hd-f1.log 2>&1; echo "rc $?"
grep -v Warn $OUT/r/hd-f1.log | grep -A70 "^== " | head -75
(cd /root/dump && ls -S | grep -i "after_optimizations\|thunk" | head -6 | xargs tar czf $OUT/r/dump.tgz; ls -S | head -12)
echo "=== [t=$SECONDS] hd fused=0"
JAXSPEC_FUSED_DECODE=0 XLA_FLAGS="$P" timeout 150 python3 $D/scripts/hd.py f0 > $OUT/r/hd-f0.log 2>&1; echo "rc $?"
grep -v Warn $OUT/r/hd-f0.log | grep -A30 "^== " | head -30
echo "=== [t=$SECONDS] hd fused=1, XLA graphs of any size"
JAXSPEC_FUSED_DECODE=1 XLA_FLAGS="$P --xla_gpu_graph_min_graph_size=1" timeout 150 python3 $D/scripts/hd.py f1g1 > $OUT/r/hd-f1g1.log 2>&1; echo "rc $?"
grep -v Warn $OUT/r/hd-f1g1.log | grep -A16 "^== " | head -16
cp $OUT/hd-*.json $OUT/r/
T="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
for f in 1; do
  echo "=== [t=$SECONDS] fused=$f plain"
  JAXSPEC_FUSED_DECODE=$f timeout 90 $T --repeats 3 --output-json $OUT/r/tp-plain-f$f.json > $OUT/r/tp-plain-f$f.log 2>&1; echo "rc $?"
done
for f in $OUT/r/tp-*.json; do python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
for p in d['points']:
    print(sys.argv[1].rsplit('/', 1)[1], p['mode'], round(p['output_tokens_per_s'], 1),
          [round(v, 1) for v in p.get('repeats_output_tokens_per_s') or []], round(p['wall_per_step_ms'], 3),
          {k: round(v, 3) for k, v in p.items() if 'host' in k and isinstance(v, float)})
" $f; done
rm -f $OUT/hd-*.json; cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
