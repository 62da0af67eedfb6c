# issue 19 item 1 / issue 17: what the host does to launch one step: dispatch breakdown and host-side trace events
# (CUDA API calls) per step; random SmolLM2 weights, context 512; batch 1 plain (Pallas and XLA attention), batch
# 96 EAGLE k = 3 greedy and with logprobs=5 + presence_penalty=0.5
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p $OUT/r
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
S="python3 bench/step_time.py --hf-config smollm2-135m --context 512 --iters 30 --breakdown"
run() { name=$1; shift; echo "=== [t=$SECONDS] $name"; timeout 150 $S --profile-dir /root/prof-$name --output-json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1
  grep -E "^B=|dispatch parts" $OUT/r/$name.log | grep -v "by kernel" | head -3; python3 .gpu/hostapi.py /root/prof-$name > $OUT/r/$name.host.txt 2>&1; head -16 $OUT/r/$name.host.txt; }
run b1-pallas --batches 1 --k 0
run b1-xla --batches 1 --k 0 --attn-impl xla
run b96-greedy --batches 96 --k 3
run b96-options --batches 96 --k 3 --sampling '{"logprobs": 5, "presence_penalty": 0.5}'
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
