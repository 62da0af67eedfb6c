# call 1: GGUF part 1 to /root/w; warm-up (the options' step kernels, this tree)
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w /root/m $OUT
cp .gpu/p1/gg.00 /root/w/ && echo "part 1 copied"
[ -d /root/old ] || { mkdir /root/old && tar -xf .gpu/old.tar -C /root/old; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name"
O='{"temperature": 0.0, "logprobs": 5, "presence_penalty": 0.5}'
for run in new greedy; do
  S="$O"; [ $run = greedy ] && S='{"temperature": 0.0}'
  echo "=== [t=$SECONDS] step_time $run"
  PYTHONPATH=. timeout 100 python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 \
    --iters 30 --sampling "$S" --profile-dir /root/m/prof-$run --output-json $OUT/step-$run.json > $OUT/step-$run.log 2>&1
  echo "rc $?"; grep -E "device ms per step" $OUT/step-$run.log | head -1
done
echo "done t=$SECONDS"
