# issue 20: the dynamic policy's calls inside the engine on the H200's host (2-layer random model, synthetic
# acceptance 0.7, 256 tokens each): 0aa58e1, 7c4d803 (9-call fold) and 97eccac (runs folded at once), policies
# swapped between alternating rounds, medians of 7 after a warm-up round, at 1 and 256 rows
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for B in 256 1; do timeout 100 python3 .gpu/pol3.py .gpu/tok $B 2>&1 | grep -E "^B=|Error|error" | head -5; done
echo "done t=$SECONDS"
