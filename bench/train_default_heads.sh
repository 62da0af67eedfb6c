#!/usr/bin/env bash
# Train the embedded default's EAGLE-1 and EAGLE-3 heads on GSM8K train questions (the target regenerates the
# answers), then measure each head's acceptance on 200 GSM8K test questions it never saw (greedy, k = 3,
# 256 new tokens). Run on a GPU machine from the repository root:
#     DATA=path/to/gsm8k BUDGET=300 bash bench/train_default_heads.sh
# The data is generated once; with two or more GPUs the two heads then train at the same time, one per GPU.
# BUDGET (seconds per head's training loop) shortens the schedule to what fits; STEPS is the most it runs.
# DEADLINE (seconds after this script starts) sets BUDGET so that training ends by then, whatever the data took.
set -euo pipefail
DATA=${DATA:-../shared/data}
PROMPTS=${PROMPTS:-7473}      # all GSM8K train questions
ANSWER=${ANSWER:-384}         # longest regenerated answer
STEPS=${STEPS:-8000}
BATCH=${BATCH:-32}
GEN_BATCH=${GEN_BATCH:-256}   # sequences the target generates at once
BUDGET=${BUDGET:-}
DEADLINE=${DEADLINE:-}
EVAL_PROMPTS=${EVAL_PROMPTS:-200}
EVAL_TOKENS=${EVAL_TOKENS:-256}
WEIGHTS=${WEIGHTS:-weights}  # where the heads go
CACHE="$WEIGHTS/.cache/gsm8k-train-smollm2.npz"
GPUS=$(python3 -c "import jax; print(sum(d.platform == 'gpu' for d in jax.devices()))")

python3 -m jaxspec fetch smollm2-135m-instruct
python3 -m jaxspec train-eagle --model smollm2-135m-instruct --data "$DATA/gsm8k_train.jsonl" \
    --num-prompts "$PROMPTS" --max-tokens "$ANSWER" --seq-len 512 --gen-batch "$GEN_BATCH" \
    --dataset-cache "$CACHE" --data-only

if [ -n "$DEADLINE" ]; then
  BUDGET=$((DEADLINE - SECONDS - 25))  # 25 s: loading the target and the data before the loop starts
  echo "training budget: $BUDGET s per head"
fi

train() {  # method, draft vocabulary, extra flags
  python3 -m jaxspec train-eagle --model smollm2-135m-instruct --method "$1" --dataset-cache "$CACHE" \
      --seq-len 512 --steps "$STEPS" --batch-size "$BATCH" --lr 3e-4 --draft-vocab-size "$2" \
      ${BUDGET:+--time-budget-s "$BUDGET"} --ckpt-dir "$WEIGHTS/.cache/ckpt-$1" --ckpt-every 2000 \
      --out "$WEIGHTS/$1-smollm2-135m-instruct" "${@:3}"
}
accept() {  # method
  python3 bench/acceptance.py --model smollm2-135m-instruct --dataset "$DATA/gsm8k_test.jsonl" \
      --num-prompts "$EVAL_PROMPTS" --max-tokens "$EVAL_TOKENS" --max-num-seqs "$EVAL_PROMPTS" \
      --decode-buckets "$((EVAL_PROMPTS < 64 ? EVAL_PROMPTS : 64)),$EVAL_PROMPTS" --layer-loop scan \
      --output-json "$WEIGHTS/$1-smollm2-135m-instruct/acceptance.json" \
      --speculative-config "{\"method\": \"$1\", \"model\": \"$WEIGHTS/$1-smollm2-135m-instruct\", \"num_speculative_tokens\": 3}"
}
# EAGLE-3: a 4096-token draft vocabulary (97 % of GSM8K's tokens) keeps the bf16 head near 15 MB; four
# training-time-test steps cover k = 3.
if [ "$GPUS" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; train eagle3 4096 --ttt-steps 4 && accept eagle3) & e3=$!
  (export CUDA_VISIBLE_DEVICES=1; train eagle 0 && accept eagle) & e1=$!
  rc=0; wait $e3 || rc=$?; wait $e1 || rc=$?; exit $rc
else
  train eagle3 4096 --ttt-steps 4 && accept eagle3
  train eagle 0 && accept eagle
fi
