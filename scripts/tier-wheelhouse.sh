# Sourced by the systemd and live tiers: the wheelhouse a tier installs topod from,
# offline, as the operations guide says. The caller defines skip().

# tier_wheelhouse PYTHON_VERSION WHEELHOUSE LOG WHAT
#   PYTHON_VERSION: the target's python3 (X.Y): the wheels must be built for it.
#   WHAT: the target, named in messages ("container", "guest").
tier_wheelhouse() {
    local want=$1 wheelhouse=$2 log=$3 what=$4
    local host_python=${PYTHON:-python3}
    local here
    here=$("$host_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [[ $here == "$want" ]] || skip "the wheelhouse needs python $want (the $what's), $host_python is $here; set PYTHON="
    if ! make --no-print-directory wheelhouse PYTHON="$host_python" WHEELHOUSE_DIR="$wheelhouse" >/dev/null 2>"$log"; then
        if ls "$wheelhouse"/topod-*.whl >/dev/null 2>&1 && ! grep -q "error: " "$log"; then
            echo "wheelhouse: keeping $wheelhouse"
        else
            tail -5 "$log" >&2
            skip "make wheelhouse failed (needs PyPI once); log: $log"
        fi
    fi
    # One topod wheel only: the current tree's (an older version would be picked too).
    local version
    version=$(.venv/bin/python -c 'import topod; print(topod.__version__)')
    find "$wheelhouse" -name 'topod-*.whl' ! -name "topod-$version-*" -delete
    echo "wheelhouse: $wheelhouse ($(ls "$wheelhouse" | wc -l) wheels)"
}
