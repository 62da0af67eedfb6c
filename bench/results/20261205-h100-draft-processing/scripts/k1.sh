# greedy_pass kernel variants (num_warps, num_stages, TILE_BLOCKS): kernel sums of the options' step, one process each
set -u
export PYTHONUNBUFFERED=1
mkdir -p /root/m $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
S='{"temperature": 0.0, "logprobs": 5, "presence_penalty": 0.5}'
for v in w4s2t64 w8s2t64 w2s2t64 w4s1t64 w4s3t64 w4s2t32 w4s2t128 w4s2t64; do
  w=${v:1:1}; s=${v:3:1}; t=${v:5}
  rm -rf /root/v && mkdir /root/v && cp -r jaxspec bench /root/v/
  sed -i "s/num_warps=4, num_stages=2/num_warps=$w, num_stages=$s/; s/^TILE_BLOCKS = 64/TILE_BLOCKS = $t/" /root/v/jaxspec/engine/greedy_pass.py
  (cd /root/v && PYTHONPATH=. timeout 90 python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 \
    --iters 30 --sampling "$S" --profile-dir /root/m/prof-$v > $OUT/k-$v.log 2>&1)
  echo "$v rc $? t=$SECONDS $(grep -E 'device ms per step' $OUT/k-$v.log | head -1 | cut -c1-40) $(grep jaxspec_greedy_pass $OUT/k-$v.log | head -1)"
done
