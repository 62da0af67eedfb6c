# call D (right after c.sh): kernel time per step, random SmolLM2 weights, EAGLE-1 k = 3, 96 rows, greedy vs the options
export PYTHONPATH=.
for j in '{"temperature": 0.0}' '{"temperature": 0.0, "logprobs": 5, "presence_penalty": 0.5}'; do
  echo "=== [t=$SECONDS] $j"
  timeout 150 python3 bench/step_time.py --hf-config smollm2-135m --k 3 --batches 96 --context 512 --iters 40 \
    --profile-dir /root/prof --sampling "$j" > /root/p.log 2>&1
  echo rc $?; cat /root/p.log >> $OUT/profile.log; grep -E "^B=|kernel|total" /root/p.log | head -5
done
