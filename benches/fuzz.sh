#!/usr/bin/env bash
# Runs each cargo-fuzz target for a bounded time (default 300 s each) and prints a summary.
# .ci/run runs it with 60 s per target. Needs `cargo install cargo-fuzz` (installed on demand);
# stable Rust works with RUSTC_BOOTSTRAP=1 (cargo-fuzz passes nightly-only flags) and no
# sanitizer (-s none): the core's unsafe code is the SIMD dispatch, so the targets check for
# panics, assertion failures (invariants) and timeouts, which need no sanitizer. Debug
# assertions are on (-a), so integer overflow panics instead of wrapping silently.
#
#   benches/fuzz.sh [SECONDS_PER_TARGET [TARGET ...]]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-300}"
shift || true
targets=("${@:-state_bytes cost_tables planner}")
targets=(${targets[*]})
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
cargo fuzz build -s none --release -a
# Seed the state loader with real encoded states (a byte 1 first selects the "wrap in a valid
# header" mode, so the payload itself is what gets mutated).
if python3 -c "import av_core" 2>/dev/null; then
    mkdir -p corpus/state_bytes
    python3 - <<'PY'
import numpy as np
from av_core import AcceptanceEstimator
for k, memory in ((1, 0.0), (4, 0.0), (8, 0.9)):
    est = AcceptanceEstimator(k, memory=memory, refit_interval=2)
    x = np.linspace(-3, 3, 2 * k, dtype=np.float32).reshape(2, k)
    for _ in range(3):
        est.observe(x, [k, 1], [k - 1, 0])
    data = est.to_bytes()
    payload = data[20:-4]
    open(f"corpus/state_bytes/seed-k{k}-raw", "wb").write(b"\x00" + data)
    open(f"corpus/state_bytes/seed-k{k}-payload", "wb").write(b"\x01" + payload)
    # Mode 2 (a real state with overwritten words): K, flags, then one 10-byte edit: a NaN
    # over the slope, which follows the configuration's 117 bytes in a format-3 payload.
    edit = (117).to_bytes(2, "little") + np.float64(np.nan).tobytes()
    open(f"corpus/state_bytes/seed-k{k}-edit", "wb").write(b"\x02" + bytes([k, 3]) + edit)
PY
fi
failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    log="target/fuzz-$target.log"
    echo "== $target: ${seconds}s"
    if cargo fuzz run -s none --release -a "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1; then
        grep -E "^#[0-9]+.*(DONE|pulse)" "$log" | tail -1
        echo "   no crash ($(ls "corpus/$target" | wc -l) corpus entries)"
    else
        echo "   FAILED: see fuzz/$log and fuzz/artifacts/$target/"
        grep -E "panicked at|^attempt|assertion" "$log" | head -5 || true
        failed+=("$target")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzzing found crashes in: ${failed[*]}"
    exit 1
fi
