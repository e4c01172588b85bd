#!/usr/bin/env bash
# `make test-systemd`: topod under a real systemd (Debian 12's, PID 1 of a
# systemd-nspawn container), installed offline from the wheelhouse as docs/operations.md
# says ("Install").
#
#   scripts/systemd-tier.sh          prepare everything, then run tests/systemd
#   scripts/systemd-tier.sh prepare  only prepare (tools, rootfs, wheelhouse)
#
# The Debian rootfs is cached in build/systemd-rootfs (debootstrap once, about 2-4 min;
# rebuilt when the package list below changes); each run boots a fresh copy of it.
# Skips with status 0 and one "skipped:" line when this machine cannot run the tier:
# not root, no systemd-nspawn/debootstrap and apt cannot install them, no Debian
# mirror for the first debootstrap, no PyPI for the first wheelhouse.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/tier-wheelhouse.sh
source scripts/tier-wheelhouse.sh

SUITE=bookworm
MIRROR=${TOPOD_TIER_MIRROR:-http://deb.debian.org/debian}
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-venv,make,procps
ROOTFS=build/systemd-rootfs
WHEELHOUSE=build/systemd-wheelhouse
STAMP_TEXT="$SUITE $MIRROR $PACKAGES variant=minbase"

skip() {
    echo "skipped: make test-systemd: $*"
    exit 0
}

need_tools() {
    [[ $(id -u) -eq 0 ]] || skip "needs root (systemd-nspawn boots a container); run: sudo make test-systemd"
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v nsenter >/dev/null || missing+=(util-linux)
    if (( ${#missing[@]} )); then
        command -v apt-get >/dev/null || skip "no apt-get to install ${missing[*]}"
        echo "installing Debian packages for the systemd tier: ${missing[*]}"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null; } || skip "apt-get could not install ${missing[*]}"
    fi
    command -v debootstrap >/dev/null && command -v systemd-nspawn >/dev/null \
        || skip "debootstrap or systemd-nspawn still missing"
}

build_rootfs() {
    if [[ -f $ROOTFS/.topod-stamp && $(cat "$ROOTFS/.topod-stamp") == "$STAMP_TEXT" ]]; then
        echo "rootfs: reusing $ROOTFS ($SUITE: $PACKAGES)"
        return
    fi
    echo "rootfs: debootstrap $SUITE into $ROOTFS ($PACKAGES); a few minutes, once"
    local started=$SECONDS
    rm -rf "$ROOTFS.tmp"
    mkdir -p build
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS.tmp" "$MIRROR" \
            > build/systemd-debootstrap.log 2>&1; then
        tail -5 build/systemd-debootstrap.log >&2
        rm -rf "$ROOTFS.tmp"
        skip "debootstrap from $MIRROR failed (no network?); log: build/systemd-debootstrap.log"
    fi
    # A container boots quicker and quieter without these; nothing in the tier uses them.
    chroot "$ROOTFS.tmp" systemctl mask --quiet systemd-networkd-wait-online.service \
        apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true
    echo "$STAMP_TEXT" > "$ROOTFS.tmp/.topod-stamp"
    rm -rf "$ROOTFS"
    mv "$ROOTFS.tmp" "$ROOTFS"
    echo "rootfs: built in $((SECONDS - started)) s"
}

build_wheelhouse() {
    # The container's python3 is Debian 12's 3.11: the wheels must be cp311 for this arch.
    local py
    py=$(chroot "$ROOTFS" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    tier_wheelhouse "$py" "$WHEELHOUSE" build/systemd-wheelhouse.log container
}

can_spawn() {
    # A container manager that refuses nspawn (an unprivileged docker, no user namespaces,
    # a seccomp filter) fails here in a second, not in the middle of the tests.
    local out
    if ! out=$(systemd-nspawn -q -D "$ROOTFS" --register=no --keep-unit --private-network /bin/true 2>&1); then
        skip "systemd-nspawn cannot start a container here: ${out##*$'\n'}"
    fi
}

prepare() {
    need_tools
    bash scripts/setup.sh --test
    build_rootfs
    can_spawn
    build_wheelhouse
}

case "${1:-run}" in
    prepare)
        prepare
        ;;
    run)
        started=$SECONDS
        prepare
        export TOPOD_SYSTEMD_TIER=1 TOPOD_TIER_ROOTFS=$PWD/$ROOTFS TOPOD_TIER_WHEELHOUSE=$PWD/$WHEELHOUSE
        status=0
        rm -f build/systemd-run/timings.txt
        .venv/bin/python -m pytest -q -p no:cacheprovider tests/systemd "${@:2}" || status=$?
        cat build/systemd-run/timings.txt 2>/dev/null || true
        echo "make test-systemd: $((SECONDS - started)) s in all"
        exit $status
        ;;
    *)
        echo "usage: $0 [run [PYTEST ARGS] | prepare]" >&2
        exit 2
        ;;
esac
