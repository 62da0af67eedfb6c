# call S2 (right after ../../20261207-real-weights/scripts/r1.sh): GGUF part 2, assemble and convert (jaxspec fetch)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
mkdir -p weights/.cache/smollm2-135m-instruct
cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
export PYTHONPATH=/root/site:.
# the preset names the EAGLE-3 head, which comes with s3.sh (the 64 MiB a call): the tracked EAGLE-1 head meanwhile
sed -i 's/"eagle3"/"eagle"/; s/eagle3-smollm2/eagle-smollm2/' models/smollm2-135m-instruct.json
python3 -m jaxspec fetch 2>&1 | tail -2
echo "converted t=$SECONDS"
