# call A: GGUF part 1 to /root/w; the GPU tests; the training step with cuDNN attention and one target softmax
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/w /root/m $OUT
cp .gpu/p1/gg.00 /root/w/ && echo "part 1 copied"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
JAX_PLATFORMS=cuda PYTHONPATH=. timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k cudnn 2>&1 | tail -4
T="python3 bench/train_step_time.py --hf-config smollm2-135m --batch-size 32 --seq-len 512 --iters 20"
run() { n=$1; shift; echo "=== [t=$SECONDS] $n: $*"; PYTHONPATH=. timeout 150 $T "$@" --output-json $OUT/$n.json > /root/m/$n.log 2>&1; echo "rc $?"; grep -v "^W\|^I0\|Warning\|warn" /root/m/$n.log | tail -${TAIL:-3}; }
TAIL=14 run e1 --method eagle --ttt-steps 3 --profile-dir /root/m/p-e1 --top 10
TAIL=14 run e3 --method eagle3 --ttt-steps 5 --profile-dir /root/m/p-e3 --top 10
run e1-xla --method eagle --ttt-steps 3 --attn-impl xla
echo "done t=$SECONDS"
