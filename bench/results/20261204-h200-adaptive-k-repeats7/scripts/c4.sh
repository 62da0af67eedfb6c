# call 2 (after c1: GGUF part 1 in /root/w): part 2, assemble, convert; then issue 20: the SmolLM2 adaptive-k sweep
# (c3.sh: EOS ignored, GSM8K test and held-out general prompts, medians of 7 rotated rounds)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct
cp .gpu/p2/m.xz.1 /root/w/
cat /root/w/m.xz.0 /root/w/m.xz.1 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
python3 -m jaxspec fetch 2>&1 | tail -1
echo "converted t=$SECONDS"
. .gpu/c3.sh  # sourced: its time limits count from this call's start
