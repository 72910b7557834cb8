#!/usr/bin/env bash
# `cargo publish --dry-run` for every crate of the workspace meant for the registry (those
# without `publish = false`), together, so that crates depending on each other
# (ottla on ottla-kafka-protocol) are verified against each other's packaged form.
# Extra arguments go to cargo (e.g. --allow-dirty on a work tree with local changes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
crates="$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
for p in meta["packages"]:
    if p["id"] in members and p.get("publish") != []:
        print(p["name"])
')"
[ -n "$crates" ] || { echo "publish-check: no publishable crate found" >&2; exit 1; }
args=()
for c in $crates; do args+=(-p "$c"); done
# The dry run verifies each package against the others through a temporary registry,
# and cargo takes a registry crate for immutable: it extracts a crate of a given version
# once (under $CARGO_HOME/registry/src/-<hash>/, the temporary registry's) and never
# rebuilds what it built from it. A second run of the same version verified ottla
# against the ottla-proto of the first (a new variant "not found"). So each run starts
# from our crates' new packages: their extracted sources and their builds are removed
# first (the builds in a target directory of their own, so that the suites' stay).
target="target/publish-check"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
rm -rf target/package
for c in $crates; do
    rm -rf "$cargo_home"/registry/src/-*/"$c"-[0-9]*
    if [ -d "$target" ]; then
        cargo clean --quiet --target-dir "$target" -p "$c" 2>/dev/null || true
    fi
done
# The test kit is verified with its `chaos` feature on: the chaos harness builds from the
# package against ottla's package (its default build does not depend on ottla).
features=()
if grep -qx ottla-testkit <<<"$crates"; then
    features=(--features ottla-testkit/chaos)
fi
# The packages build as crates of their own, without this workspace's profile, so with
# full debug info by default: over twice the disk of a build without it (scripts/test.sh).
export CARGO_PROFILE_DEV_DEBUG=false
echo "publish-check: cargo publish --dry-run ${args[*]} ${features[*]}"
cargo publish --dry-run --locked --target-dir "$target" "${args[@]}" "${features[@]}" "$@"
for c in $crates; do
    echo "ok: $c packages and builds from its package ($(cargo package --locked -p "$c" --list "$@" 2>/dev/null | wc -l) files)"
done
