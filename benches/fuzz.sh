#!/usr/bin/env bash
# Runs each cargo-fuzz target for a bounded time (default 300 s each) and prints a summary.
# Not part of CI. Needs `cargo install cargo-fuzz`; stable Rust works with RUSTC_BOOTSTRAP=1
# and no sanitizer (-s none): the core has no unsafe code, so the targets check for panics,
# assertion failures (invariants) and timeouts, which need no sanitizer.
#
#   benches/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-300}"
export RUSTC_BOOTSTRAP=1
cargo fuzz build -s none --release
for target in state_bytes cost_tables planner; do
    mkdir -p "corpus/$target"
    log="target/fuzz-$target.log"
    echo "== $target: ${seconds}s"
    if cargo fuzz run -s none --release "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1; then
        grep -E "^#[0-9]+.*(DONE|pulse)" "$log" | tail -1
        echo "   no crash ($(ls "corpus/$target" | wc -l) corpus entries)"
    else
        echo "   FAILED: see fuzz/$log and fuzz/artifacts/$target/"
        tail -30 "$log"
        exit 1
    fi
done
