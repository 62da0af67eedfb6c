#!/usr/bin/env bash
# The serving benchmark (issue 16) on one GPU: SmolLM2-135M-Instruct with the shipped EAGLE-1 head (k = 3) and
# without, async and sync scheduling, GSM8K test questions through /v1/chat/completions at 8, 32 and inf
# requests/s. Each mode starts `jaxspec serve`, waits for /health, runs `jaxspec bench serve` at every rate, and
# stops the server; the sync runs compare their texts with the async runs' (--compare-with). The summary table
# (TTFT / TPOT percentiles per mode and rate) comes last; every run's JSON (with per-request texts and latencies)
# and every server log stay in $OUT.
#
# Budget: about 4 minutes on an H200. Scanned layers compile in seconds for SmolLM2 (and run it at the unrolled
# speed, bench/RESULTS.md), few buckets are compiled, and the sync server of each head reloads the async one's
# programs from the persistent compilation cache (the programs do not depend on the scheduling).
#
#   bash bench/serve_sweep.sh                     # from the repository root
#   WHEELS=/path/to/wheels bash bench/serve_sweep.sh   # first installs the serve extra offline from those wheels
#   MODES="eagle-async eagle-sync" SERVER_EXTRA=--disable-frontend-multiprocessing bash bench/serve_sweep.sh
#                                                 # some modes, with the engine on a thread of the server's process
#   (MODEL, HEAD, DATA, NUM_PROMPTS, OUTPUT_LEN, RATES, MODES, PORT, OUT, SERVER_EXTRA override the defaults below)
set -euo pipefail

PY=${PY:-python3}
MODEL=${MODEL:-smollm2-135m-instruct}  # the preset: weights/smollm2-135m-instruct/ (jaxspec fetch)
HEAD=${HEAD:-weights/eagle-smollm2-135m-instruct}
DATA=${DATA:-$([ -f ../shared/data/gsm8k_test.jsonl ] && echo ../shared/data/gsm8k_test.jsonl \
               || echo shared/data/gsm8k_test.jsonl)}
NUM_PROMPTS=${NUM_PROMPTS:-64}
OUTPUT_LEN=${OUTPUT_LEN:-256}
RATES=${RATES:-"8 32 inf"}
MODES=${MODES:-"eagle-async eagle-sync none-async none-sync"}  # a sync mode compares with its async one if it ran
PORT=${PORT:-8123}
OUT=${OUT:-bench/results/serve-$(date +%Y%m%d-%H%M%S)}
CACHE=${CACHE:-bench/results/.jax-cache}
SPEC="{\"method\": \"eagle\", \"model\": \"$HEAD\", \"num_speculative_tokens\": 3}"
SERVER_ARGS=(--port "$PORT" --max-model-len 1024 --max-num-seqs 64 --max-num-batched-tokens 1024
             --decode-buckets 1,8,32,64 --prefill-buckets 256,1024 --layer-loop scan
             --compilation-cache-dir "$CACHE" --disable-uvicorn-access-log --uvicorn-log-level warning
             ${SERVER_EXTRA:-})  # SERVER_EXTRA: more `jaxspec serve` flags (later ones override these)

if [ -n "${WHEELS:-}" ]; then
    $PY -m pip install -q --no-index --find-links "$WHEELS" fastapi uvicorn prometheus_client httpx
fi
$PY -c "import fastapi, uvicorn, prometheus_client, httpx" || {
    echo "the serve extra is missing: pip install -e '.[serve]' (or WHEELS=DIR for an offline install)"; exit 1; }
mkdir -p "$OUT" "$CACHE"
SERVER_PID=""
trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; true' EXIT

wait_healthy() {
    local start=$SECONDS
    until $PY -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
            2>/dev/null; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "the server exited:"; tail -30 "$1"; exit 1
        fi
        if (( SECONDS - start > 600 )); then echo "no /health after 600 s"; tail -30 "$1"; exit 1; fi
        sleep 1
    done
    echo "[$(date +%T)] healthy after $((SECONDS - start)) s"
}

run_mode() {  # run_mode NAME BASELINE_NAME_OR_EMPTY SERVER_FLAGS...
    local name=$1 baseline=$2
    shift 2
    local log="$OUT/server-$name.log"
    echo "[$(date +%T)] $name: jaxspec serve $*"
    $PY -m jaxspec serve "$MODEL" "${SERVER_ARGS[@]}" "$@" > "$log" 2>&1 &
    SERVER_PID=$!
    wait_healthy "$log"
    for rate in $RATES; do
        local compare=()
        local base="$OUT/$baseline-rate$rate.json"
        [ -n "$baseline" ] && [ -f "$base" ] && compare=(--compare-with "$base")
        $PY -m jaxspec bench serve --base-url "http://127.0.0.1:$PORT" --endpoint /v1/chat/completions \
            --dataset-name jsonl --dataset-path "$DATA" --jsonl-output-len "$OUTPUT_LEN" \
            --num-prompts "$NUM_PROMPTS" --request-rate "$rate" --seed 0 --disable-tqdm --label "$name" \
            --save-result --result-dir "$OUT" --result-filename "$name-rate$rate.json" "${compare[@]}" \
            > "$OUT/bench-$name-rate$rate.txt"
        echo "[$(date +%T)] $name rate $rate: $(grep -E 'Median TPOT|outputs vs' "$OUT/bench-$name-rate$rate.txt" \
            | tr '\n' ' ')"
    done
    kill "$SERVER_PID"
    wait "$SERVER_PID" || true
    SERVER_PID=""
}

for mode in $MODES; do
    case $mode in
        eagle-async) run_mode eagle-async "" --speculative-config "$SPEC" --async-scheduling ;;
        eagle-sync) run_mode eagle-sync eagle-async --speculative-config "$SPEC" --no-async-scheduling ;;
        none-async) run_mode none-async "" --async-scheduling ;;
        none-sync) run_mode none-sync none-async --no-async-scheduling ;;
        *) echo "unknown mode $mode (eagle-async, eagle-sync, none-async, none-sync)"; exit 1 ;;
    esac
done

files=()
for mode in $MODES; do
    for rate in $RATES; do files+=("$OUT/$mode-rate$rate.json"); done
done
echo
echo "## Serving: SmolLM2-135M-Instruct, GSM8K test, $NUM_PROMPTS requests, max_tokens $OUTPUT_LEN ($OUT)"
$PY -c "import json, sys; from jaxspec.bench.serve import sweep_table
print(sweep_table([json.load(open(p)) for p in sys.argv[1:]]))" "${files[@]}"
