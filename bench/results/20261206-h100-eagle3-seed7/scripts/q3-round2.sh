# train call (after the seed-6 and seed-7 data calls): the seed-4 and seed-5 mixes (carried, compact) and those of
# seeds 6 and 7 (on the machine) merged; the EAGLE-3 head fine-tuned on them from the shipped head (16,384-token
# draft vocabulary), then evaluated (k = 3, 5; 128 prompts, greedy, 256 tokens) on held-out splits no mix saw;
# usage: TRAIN_S=<loop seconds> bash .gpu/s6/q3.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
mkdir -p weights/smollm2-135m-instruct $OUT /root/data && cp -rn /root/w/target/. weights/smollm2-135m-instruct/
for f in .gpu/data2/*.xz; do xz -dc $f > /root/data/$(basename $f .xz); done
M=""; for s in 6 7; do [ -f /root/w/work/self100000-seed$s/mix.npz ] && M="$M /root/w/work/self100000-seed$s/mix.npz"; done
ls -l /root/w/mix.npz
H=/root/w/eagle3-smollm2-135m-instruct
echo "=== [t=$SECONDS] train ${TRAIN_S}s"
timeout $((TRAIN_S + 60)) python3 -m jaxspec train-eagle --model smollm2-135m-instruct --method eagle3 \
  --dataset-cache /root/w/mix.npz --seq-len 512 --steps 40000 --batch-size 32 --lr 3e-4 --time-budget-s $TRAIN_S \
  --seed 8 --out $H --ttt-steps 5 --draft-vocab-size 16384 --init-from /root/w/r1 \
  > /root/w/train.log 2>&1
echo "rc $? t=$SECONDS"
grep -v "it/s\]" /root/w/train.log | tail -8
ls -l $H
cp /root/w/train.log $OUT/
tar cf - -C /root/w eagle3-smollm2-135m-instruct | split -b 15000000 -d -a 1 - $OUT/head.tar.
echo "=== [t=$SECONDS] eval"
D=""; for s in 6 7; do f=/root/w/work/self100000-seed$s/prompts/held_out.jsonl; [ -f $f ] && D="$D --dataset held_out_seed$s=$f"; done
timeout $((595 - SECONDS)) python3 bench/acceptance.py --model smollm2-135m-instruct \
  --speculative-config "{\"method\": \"eagle3\", \"model\": \"$H\"}" --k 3,5 \
  --dataset held_out_seed4=/root/data/held_out_seed4.jsonl --dataset held_out_seed5=/root/data/held_out_seed5.jsonl $D \
  --dataset held_out_seed3=/root/data/held_out_seed3.jsonl \
  --dataset gsm8k_test=/root/data/gsm8k_test.jsonl --dataset general_chat=bench/prompts/general_chat.jsonl \
  --num-prompts 128 --max-tokens 256 --layer-loop scan --time-budget-s $((588 - SECONDS)) \
  --output-json $OUT/eagle3-acceptance.json > /root/w/eval.log 2>&1
echo "rc $? t=$SECONDS"; tail -12 /root/w/eval.log; cp /root/w/eval.log $OUT/
echo "done t=$SECONDS"
