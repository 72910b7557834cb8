#!/usr/bin/env bash
# The minimum supported Rust version: builds the library (every feature) with the Rust
# release that Cargo.toml's `rust-version` names. rustup cannot fetch another toolchain
# on these machines; Debian bookworm's `rustc-web`/`cargo-web` packages carry Rust 1.85,
# so they are the check. Installed on first use (as root, with apt-get).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

msrv="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
[ -n "$msrv" ] || { echo "msrv: no rust-version in Cargo.toml" >&2; exit 1; }
rustc_bin="${MSRV_RUSTC:-/usr/bin/rustc}"
cargo_bin="${MSRV_CARGO:-/usr/bin/cargo}"

version_of() { "$1" --version 2>/dev/null | awk '{print $2}'; }
if [[ "$(version_of "$rustc_bin")" != "$msrv".* ]]; then
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "msrv: $rustc_bin is not Rust $msrv; install Rust $msrv and set MSRV_RUSTC and MSRV_CARGO" >&2
        exit 1
    fi
    echo "msrv: apt-get install rustc-web cargo-web (Rust $msrv)" >&2
    install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rustc-web cargo-web >&2; }
    install || { DEBIAN_FRONTEND=noninteractive apt-get update -q >&2; install; }
fi
got="$(version_of "$rustc_bin")"
if [[ "$got" != "$msrv".* ]]; then
    echo "msrv: Cargo.toml declares rust-version $msrv but $rustc_bin is $got; the check needs that exact release" >&2
    exit 1
fi
# The rustup cargo comes first on PATH; these paths are called by name so that nothing else
# picks up the old toolchain. The lock file is the workspace's (ruzstd stays at 0.8.1,
# the last release that builds on 1.85; README, "Minimum supported Rust version").
echo "msrv: ottla with Rust $got ($rustc_bin)"
RUSTC="$rustc_bin" RUSTDOC="${rustc_bin%rustc}rustdoc" "$cargo_bin" check --locked -p ottla --lib \
    --features tls,tls-webpki-roots,testing,metrics,opentelemetry,serde,oauthbearer-oidc,aws-msk-iam --target-dir target/msrv
RUSTC="$rustc_bin" RUSTDOC="${rustc_bin%rustc}rustdoc" "$cargo_bin" check --locked -p ottla --lib \
    --target-dir target/msrv
echo "ok: ottla builds with Rust $got, its declared rust-version"
