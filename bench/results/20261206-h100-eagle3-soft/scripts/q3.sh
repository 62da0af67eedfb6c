# train call: the four Magpie mixes (seeds 6 and 7 on the machine since calls 1 and 2, seeds 4 and 5 carried) merged as the
# thirty-fifth session did (merge.py, shuffle seed 5); the EAGLE-3 head fine-tuned from $INIT with $FLAGS
# (e.g. --soft-labels), then evaluated (k = 3, 5; 128 prompts, greedy, 256 tokens) on held-out splits no mix saw;
# usage: TAG=<name> INIT=<head dir> SEED=<n> TRAIN_S=<loop seconds> FLAGS="..." bash .gpu/s8/q3.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
mkdir -p weights/smollm2-135m-instruct $OUT && cp -rn /root/w/target/. weights/smollm2-135m-instruct/
if [ ! -f /root/w/mix.npz ]; then
  python3 .gpu/s8/merge.py .gpu/keep/mix-seed4.npz .gpu/keep/mix-seed5.npz /root/w/mix-seed6.npz \
    /root/w/mix-seed7.npz /root/w/mix.npz || exit 1
fi
H=/root/w/$TAG
echo "=== [t=$SECONDS] train ${TRAIN_S}s from $INIT, $FLAGS"
timeout $((TRAIN_S + 60)) python3 -m jaxspec train-eagle --model smollm2-135m-instruct --method eagle3 \
  --dataset-cache /root/w/mix.npz --seq-len 512 --steps 40000 --batch-size 32 --lr 3e-4 --time-budget-s $TRAIN_S \
  --seed $SEED --out $H --ttt-steps 5 --draft-vocab-size 16384 --init-from $INIT $FLAGS > /root/w/train-$TAG.log 2>&1
echo "rc $? t=$SECONDS"
grep -v "it/s\]" /root/w/train-$TAG.log | tail -4
cp /root/w/train-$TAG.log $OUT/
tar cf - -C /root/w $TAG | split -b 15000000 -d -a 1 - $OUT/head.tar.
echo "=== [t=$SECONDS] eval"
D=/root/w/data
timeout $((595 - SECONDS)) python3 bench/acceptance.py --model smollm2-135m-instruct \
  --speculative-config "{\"method\": \"eagle3\", \"model\": \"$H\"}" --k 3,5 \
  --dataset held_out_seed3=$D/held_out_seed3.jsonl --dataset held_out_seed4=$D/held_out_seed4.jsonl \
  --dataset held_out_seed5=$D/held_out_seed5.jsonl --dataset held_out_seed6=$D/held_out_seed6.jsonl \
  --dataset held_out_seed7=$D/held_out_seed7.jsonl --dataset gsm8k_test=$D/gsm8k_test.jsonl \
  --dataset general_chat=bench/prompts/general_chat.jsonl \
  --num-prompts 128 --max-tokens 256 --layer-loop scan --time-budget-s $((588 - SECONDS)) \
  --output-json $OUT/acceptance-$TAG.json > /root/w/eval-$TAG.log 2>&1
echo "rc $? t=$SECONDS"; cp /root/w/eval-$TAG.log $OUT/; tail -14 /root/w/eval-$TAG.log
echo "done t=$SECONDS"
