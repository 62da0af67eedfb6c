# call 1: the greedy kernel compiled on the GPU against the XLA path (pytest); the
# options' step kernels with it on / off, and greedy's (step_time --profile-dir)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/m $OUT
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape, jax.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name"
echo "=== [t=$SECONDS] pytest"
JAX_PLATFORMS=cuda timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k greedy_pass > $OUT/pytest.log 2>&1
echo "rc $?"; tail -3 $OUT/pytest.log
O='{"temperature": 0.0, "logprobs": 5, "presence_penalty": 0.5}'
for run in 1 0 greedy; do
  on=$run; S="$O"; [ $run = greedy ] && { on=1; S='{"temperature": 0.0}'; }
  echo "=== [t=$SECONDS] step_time $run"
  JAXSPEC_GREEDY_PASS=$on timeout 110 python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 \
    --iters 30 --sampling "$S" --profile-dir /root/m/prof-$run --output-json $OUT/step-options-$run.json > $OUT/step-options-$run.log 2>&1
  echo "rc $?"; grep -E "device ms per step" $OUT/step-options-$run.log | head -1
  grep -A6 "by kernel" $OUT/step-options-$run.log | head -7 | grep -E "greedy_pass|convert|fusion"
done
echo "done t=$SECONDS"
