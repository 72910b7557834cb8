#!/usr/bin/env bash
# Many short chaos runs with fresh seeds under CPU contention, one summary line each,
# then the tally (issue 30's acceptance: 50 classic and 50 consumer-protocol runs).
#   bash scripts/chaos-tally.sh PROTOCOL RUNS [LOG]
# PROTOCOL is classic or consumer. Each run is `chaos --duration 40s --contention 2`
# (OTTLA_TALLY_DURATION and OTTLA_TALLY_CONTENTION change them); a failing run's line
# holds its seed, so `chaos --seed N ...` replays it. Builds the release binary first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
protocol="${1:?usage: chaos-tally.sh classic|consumer RUNS [LOG]}"
runs="${2:?usage: chaos-tally.sh classic|consumer RUNS [LOG]}"
log="${3:-$root/target/chaos-tally-$protocol.log}"
duration="${OTTLA_TALLY_DURATION:-40s}"
contention="${OTTLA_TALLY_CONTENTION:-2}"
cargo build --release -q -p ottla-chaos --bin chaos --manifest-path "$root/Cargo.toml"
bin="${CARGO_TARGET_DIR:-$root/target}/release/chaos"
mkdir -p "$(dirname "$log")"
pass=0
fail=0
for _ in $(seq "$runs"); do
    seed=$(( (RANDOM << 15) | RANDOM ))
    line="$("$bin" --duration "$duration" --seed "$seed" --contention "$contention" \
        --group-protocol "$protocol" --progress 0 2>&1 | grep 'result=' | tail -n 1 || true)"
    echo "$(date -u +%H:%M:%S) seed=$seed $line" | tee -a "$log"
    if [[ "$line" == *"result=pass"* ]]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
echo "chaos tally ($protocol, $duration, --contention $contention): $pass passed, $fail failed; lines in $log"
