# call 3 (right after q2.sh): the EAGLE-3 head fine-tuned alone on the seed-4 mix from the shipped head, with a
# 16,384-token draft vocabulary (8,192 before), then evaluated (k = 3, 5; 128 prompts, greedy, 256 tokens);
# usage: TRAIN_S=<loop seconds> bash .gpu/q3.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
W=/root/w/work/self100000-seed4
ls -l $W/mix.npz || exit 1
mkdir -p weights/smollm2-135m-instruct && cp -rn /root/w/target/. weights/smollm2-135m-instruct/
H=/root/w/eagle3-smollm2-135m-instruct
echo "=== [t=$SECONDS] train ${TRAIN_S}s"
timeout $((TRAIN_S + 60)) python3 -m jaxspec train-eagle --model smollm2-135m-instruct --method eagle3 \
  --dataset-cache $W/mix.npz --seq-len 512 --steps 20000 --batch-size 32 --lr 3e-4 --time-budget-s $TRAIN_S --seed 4 \
  --out $H --ttt-steps 5 --draft-vocab-size 16384 --init-from weights/eagle3-smollm2-135m-instruct > /root/w/train.log 2>&1
echo "rc $? t=$SECONDS"
grep -v "it/s\]" /root/w/train.log | tail -8
ls -l $H
cp /root/w/train.log $OUT/
tar cf - -C /root/w eagle3-smollm2-135m-instruct | split -b 15000000 -d -a 1 - $OUT/head.tar.
echo "=== [t=$SECONDS] eval"
timeout $((575 - SECONDS)) python3 bench/acceptance.py --model smollm2-135m-instruct \
  --speculative-config "{\"method\": \"eagle3\", \"model\": \"$H\"}" --k 3,5 \
  --dataset held_out_seed4=$W/prompts/held_out.jsonl --dataset held_out_seed3=/root/data/held_out_seed3.jsonl \
  --dataset gsm8k_test=/root/data/gsm8k_test.jsonl --dataset general_chat=bench/prompts/general_chat.jsonl \
  --num-prompts 128 --max-tokens 256 --layer-loop scan --time-budget-s $((560 - SECONDS)) \
  --output-json $OUT/eagle3-acceptance.json > /root/w/eval.log 2>&1
echo "rc $? t=$SECONDS"; tail -20 /root/w/eval.log; cp /root/w/eval.log $OUT/
echo "done t=$SECONDS"
