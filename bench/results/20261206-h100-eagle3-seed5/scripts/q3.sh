# call 3 (right after q2.sh): the seed-4 mix (carried, compact) and the seed-5 mix merged; the EAGLE-3 head fine-tuned
# on both from the shipped head (16,384-token draft vocabulary), then evaluated (k = 3, 5; 128 prompts, greedy, 256
# tokens) on held-out splits no mix saw; usage: TRAIN_S=<loop seconds> bash .gpu/s/q3.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
W=/root/w/work/self100000-seed5
ls -l $W/mix.npz || exit 1
mkdir -p weights/smollm2-135m-instruct $OUT && cp -rn /root/w/target/. weights/smollm2-135m-instruct/
python3 .gpu/s/merge.py .gpu/m4/mix-seed4.npz $W/mix.npz /root/w/mix45.npz || exit 1
H=/root/w/eagle3-smollm2-135m-instruct
echo "=== [t=$SECONDS] train ${TRAIN_S}s"
timeout $((TRAIN_S + 60)) python3 -m jaxspec train-eagle --model smollm2-135m-instruct --method eagle3 \
  --dataset-cache /root/w/mix45.npz --seq-len 512 --steps 40000 --batch-size 32 --lr 3e-4 --time-budget-s $TRAIN_S \
  --seed 5 --out $H --ttt-steps 5 --draft-vocab-size 16384 --init-from weights/eagle3-smollm2-135m-instruct \
  > /root/w/train.log 2>&1
echo "rc $? t=$SECONDS"
grep -v "it/s\]" /root/w/train.log | tail -8
ls -l $H
cp /root/w/train.log $OUT/
tar cf - -C /root/w eagle3-smollm2-135m-instruct | split -b 15000000 -d -a 1 - $OUT/head.tar.
echo "=== [t=$SECONDS] eval"
timeout $((590 - SECONDS)) python3 bench/acceptance.py --model smollm2-135m-instruct \
  --speculative-config "{\"method\": \"eagle3\", \"model\": \"$H\"}" --k 3,5 \
  --dataset held_out_seed3=/root/data/held_out_seed3.jsonl --dataset held_out_seed4=/root/data/held_out_seed4.jsonl \
  --dataset held_out_seed5=$W/prompts/held_out.jsonl \
  --dataset gsm8k_test=/root/data/gsm8k_test.jsonl --dataset general_chat=bench/prompts/general_chat.jsonl \
  --num-prompts 128 --max-tokens 256 --layer-loop scan --time-budget-s $((580 - SECONDS)) \
  --output-json $OUT/eagle3-acceptance.json > /root/w/eval.log 2>&1
echo "rc $? t=$SECONDS"; tail -9 /root/w/eval.log; cp /root/w/eval.log $OUT/
echo "done t=$SECONDS"
