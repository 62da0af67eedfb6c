# call 1: GGUF part 1 to /root/w; the training step's time and kernels on random SmolLM2-shaped weights (warm-up too)
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w /root/m $OUT
cp .gpu/p1/gg.00 /root/w/ && echo "part 1 copied"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name"
T="python3 bench/train_step_time.py --hf-config smollm2-135m --batch-size 32 --seq-len 512 --iters 20"
run() { n=$1; shift; echo "=== [t=$SECONDS] $n: $*"; PYTHONPATH=. timeout 150 $T "$@" --output-json $OUT/$n.json > /root/m/$n.log 2>&1; echo "rc $?"; grep -v "^W\|^I0\|Warning\|warn" /root/m/$n.log | tail -32; }
run e1 --method eagle --ttt-steps 3 --profile-dir /root/m/p-e1
run e3 --method eagle3 --ttt-steps 5 --profile-dir /root/m/p-e3
run e1-unroll --method eagle --ttt-steps 3 --layer-loop unroll
run e1-ttt1 --method eagle --ttt-steps 1
echo "done t=$SECONDS"
