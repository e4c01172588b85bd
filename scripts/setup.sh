#!/usr/bin/env bash
# Creates .venv with topod installed (editable) and, with --test, what the test suite
# needs: the Python test extras and the Debian tools the tests drive for real.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_TEST_PACKAGES=(umockdev gir1.2-umockdev-1.0 python3-gi graphviz prometheus systemd hwloc slurmd slurmctld slurm-client curl libnss-wrapper)

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$python" -m venv .venv
fi
stamp=.venv/.topod-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
    .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    # compat: a plain path in a .pth file. The default editable mode installs an import
    # hook whose own imports cost every topod/topoctl start 11 ms. setuptools calls compat
    # transitional: where it is gone, the default mode still works, only slower to start.
    .venv/bin/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=compat 2>/dev/null \
        || .venv/bin/python -m pip install --quiet -e '.[test]'
    touch "$stamp"
fi

if (( want_test )); then
    missing=()
    for pkg in "${APT_TEST_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if (( ${#missing[@]} )); then
        sudo=""
        [[ $(id -u) -ne 0 ]] && sudo="sudo"
        echo "installing Debian packages for the tests: ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi
