# issue 19 item 1 / 17 / 20: the step's output written into a donated buffer that keeps its address (no CUDA-graph
# re-record per launch) against HEAD; one process each, alternating; random SmolLM2 weights
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
use() { cp .gpu/head/$1step.py jaxspec/engine/step.py; cp .gpu/head/$1model_runner.py jaxspec/engine/model_runner.py; cp .gpu/head/$1engine.py jaxspec/bench/engine.py; }
S="python3 bench/step_time.py --hf-config smollm2-135m --context 512 --iters 30 --breakdown"
T="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --prefill-buckets 2048"
for v in new head; do
  [ $v = new ] && use new_ || use ""
  for cfg in "b1|--batches 1 --k 0" "b96|--batches 96 --k 3" "b96opt|--batches 96 --k 3 --sampling {\"logprobs\":5,\"presence_penalty\":0.5}"; do
    name=${cfg%%|*}; args=${cfg#*|}
    echo "=== [t=$SECONDS] $v $name"; timeout 120 $S $args > $OUT/r/st-$v-$name.log 2>&1; grep -E "^B=|dispatch parts" $OUT/r/st-$v-$name.log
  done
done
for v in new head new head; do
  [ $v = new ] && use new_ || use ""
  echo "=== [t=$SECONDS] $v engine"
  timeout 150 $T --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 > $OUT/r/tp1-$v.log 2>&1; grep -E "^Throughput|ms/step" $OUT/r/tp1-$v.log | head -2
  timeout 150 $T --num-prompts 96 --max-tokens 512 --ignore-eos --speculative-config '{"num_speculative_tokens": 3}' --synthetic-acceptance 0.6 --decode-buckets 96 --repeats 3 > $OUT/r/tp96-$v.log 2>&1; grep -E "^Throughput|ms/step" $OUT/r/tp96-$v.log | tail -2
done
use new_
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
