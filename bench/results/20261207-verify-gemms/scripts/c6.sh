# call 6 (issue 19): does the host's block in a multi-step dispatch's launch depend on the CUDA graph's size? Call 2:
# EAGLE k = 3 at batch 1 with 4 steps a dispatch (a 1,884-node graph) ran 1.842 ms a step back to back against
# 1.228 ms of kernels. Here bench/step_time.py back to back with graphs of other sizes: EAGLE M = 2 (~940 nodes),
# plain (the fused layer, ~172 nodes a step) M = 4 (~690), M = 8 (~1,380) and M = 1. Random SmolLM2 weights.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for c in "3 2" "0 4" "0 8" "0 1"; do
  set -- $c; f=$OUT/r/step-k$1-m$2
  echo "=== [t=$SECONDS] step_time k=$1 M=$2"
  PYTHONPATH=. timeout 80 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 32 --batches 1 --k $1 --num-steps $2 --output-json $f.json > $f.log 2>&1; echo "rc $?"
  grep " step " $f.log | grep -v "^\["
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"
