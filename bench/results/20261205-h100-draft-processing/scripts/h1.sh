# call 1: GGUF part 1 to /root/w; warm-up; the GPU tests of the extended step; the options' step kernels with the
# draft head's processed rollout (this tree) against d257358 (before it), and greedy's (step_time --profile-dir)
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w /root/m $OUT
cp .gpu/p1/gg.00 /root/w/ && echo "part 1 copied"
[ -d /root/old ] || { mkdir /root/old && tar -xf .gpu/old.tar -C /root/old; }
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name"
echo "=== [t=$SECONDS] pytest"
JAX_PLATFORMS=cuda PYTHONPATH=. timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k greedy_pass > $OUT/pytest.log 2>&1
echo "rc $?"; tail -2 $OUT/pytest.log
O='{"temperature": 0.0, "logprobs": 5, "presence_penalty": 0.5}'
for run in new old greedy; do
  t=$PWD; S="$O"; [ $run = old ] && t=/root/old; [ $run = greedy ] && S='{"temperature": 0.0}'
  echo "=== [t=$SECONDS] step_time $run"
  (cd $t && PYTHONPATH=. timeout 100 python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 \
    --iters 30 --sampling "$S" --profile-dir /root/m/prof-$run --output-json $OUT/step-$run.json > $OUT/step-$run.log 2>&1)
  echo "rc $?"; grep -E "device ms per step" $OUT/step-$run.log | head -1
done
echo "done t=$SECONDS"
