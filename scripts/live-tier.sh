#!/usr/bin/env bash
# `make test-live`: topod on a real Linux kernel, a two-socket QEMU guest (TCG), installed
# offline from the wheelhouse as README says, with IRQs written for real.
#
#   scripts/live-tier.sh                 prepare everything, then run tests/live
#   scripts/live-tier.sh run [PYTEST..]  the same, with extra pytest arguments
#   scripts/live-tier.sh prepare         only prepare (tools, guest image, wheelhouse)
#
# The guest image (Debian 12 from Debian's packages: kernel, systemd, guest agent, python3)
# is built once into build/live-image (debootstrap + mkfs.ext4 -d, several minutes) and
# rebuilt when its recipe below changes; every run boots it with -drive snapshot=on, so
# the image stays as built. The guest's layout (tests/live/guest.py): CPUs 0-1 on node 0,
# 2-3 on node 1; an NVMe and a multi-queue virtio-net NIC per node, node 1's behind a
# pxb-pcie expander (numa_node=1) with root ports, one root port free for hot-plug.
# Skips with status 0 and one "skipped:" line when this machine cannot run the tier:
# not root, no QEMU/debootstrap and apt cannot install them, no Debian mirror for the
# first image build, no PyPI for the first wheelhouse.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/tier-wheelhouse.sh
source scripts/tier-wheelhouse.sh

SUITE=bookworm
MIRROR=${TOPOD_TIER_MIRROR:-http://deb.debian.org/debian}
# debootstrap's set, then what apt installs into it (the kernel and its initramfs need a
# mounted /proc, which debootstrap's second stage does not give them).
BASE_PACKAGES=systemd,systemd-sysv,dbus,udev,kmod,procps,iproute2,python3,python3-venv,make
GUEST_PACKAGES="linux-image-amd64 initramfs-tools qemu-guest-agent"
IMAGE=build/live-image
ROOTFS=build/live-rootfs
WHEELHOUSE=build/live-wheelhouse
IMAGE_SIZE=3G

skip() {
    echo "skipped: make test-live: $*"
    exit 0
}

need_tools() {
    [[ $(id -u) -eq 0 ]] || skip "needs root (debootstrap builds the guest image); run: sudo make test-live"
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    command -v qemu-img >/dev/null || missing+=(qemu-utils)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
    if (( ${#missing[@]} )); then
        command -v apt-get >/dev/null || skip "no apt-get to install ${missing[*]}"
        echo "installing Debian packages for the live tier: ${missing[*]}"
        mkdir -p build
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}"; } > build/live-apt.log 2>&1 || skip "apt-get could not install ${missing[*]} (log: build/live-apt.log)"
    fi
    command -v qemu-system-x86_64 >/dev/null && command -v debootstrap >/dev/null && command -v mkfs.ext4 >/dev/null \
        || skip "qemu-system-x86_64, debootstrap or mkfs.ext4 still missing"
}

# Everything in the guest that is not topod; its text (with the variables above) is the
# image's stamp, so editing it rebuilds the image.
configure_rootfs() {
    local root=$1
    echo topod-live > "$root/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 topod-live\n' > "$root/etc/hosts"
    printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' > "$root/etc/fstab"
    # A fixed machine id: every boot of the snapshot is not a "first boot".
    tr -d - < /proc/sys/kernel/random/uuid > "$root/etc/machine-id"
    # Nothing in the tier uses these; under TCG each costs boot time or CPU mid-test.
    chroot "$root" systemctl mask --quiet systemd-networkd-wait-online.service apt-daily.timer \
        apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer dpkg-db-backup.timer \
        logrotate.timer systemd-timesyncd.service >/dev/null 2>&1 || true
    # The journal survives the reboot test (it reads what the daemon said before it).
    mkdir -p "$root/var/log/journal"
}

release_rootfs() {
    local mount
    for mount in proc sys; do
        if mountpoint -q "$ROOTFS/$mount" 2>/dev/null; then umount "$ROOTFS/$mount"; fi
    done
}

install_packages() {
    local started=$SECONDS
    rm -rf --one-file-system "$ROOTFS"
    if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" \
            > build/live-debootstrap.log 2>&1; then
        tail -5 build/live-debootstrap.log >&2
        release_rootfs
        rm -rf --one-file-system "$ROOTFS" "$IMAGE.tmp"
        skip "debootstrap from $MIRROR failed (no network?); log: build/live-debootstrap.log"
    fi
    echo "image: debootstrap done in $((SECONDS - started)) s; installing $GUEST_PACKAGES"
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
    # Only /proc (the kernel's postinst wants it); the host's /dev is never bound in here.
    trap release_rootfs EXIT
    mount -t proc proc "$ROOTFS/proc"
    local status=0
    chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
        "apt-get update -qq && apt-get install -y -qq --no-install-recommends $GUEST_PACKAGES && apt-get clean" \
        > build/live-guest-packages.log 2>&1 || status=$?
    release_rootfs
    if (( status )); then
        tail -5 build/live-guest-packages.log >&2
        skip "apt-get in the guest rootfs failed (status $status); log: build/live-guest-packages.log"
    fi
    echo "$1" > "$ROOTFS/.topod-packages"
}

build_image() {
    local stamp_text
    stamp_text="$SUITE $MIRROR $BASE_PACKAGES / $GUEST_PACKAGES $IMAGE_SIZE variant=minbase
$(declare -f install_packages configure_rootfs build_image)"
    if [[ -f $IMAGE/stamp && $(cat "$IMAGE/stamp") == "$stamp_text" ]]; then
        echo "image: reusing $IMAGE ($SUITE, $(cat "$IMAGE/kernel-version"))"
        return
    fi
    echo "image: building $IMAGE (debootstrap $SUITE, kernel, guest agent); several minutes, once"
    local started=$SECONDS
    local packages="$SUITE $MIRROR $BASE_PACKAGES / $GUEST_PACKAGES"
    release_rootfs
    rm -rf --one-file-system "$IMAGE.tmp"
    mkdir -p "$IMAGE.tmp"
    # A rootfs whose packages are all in (a build that failed later) is configured again,
    # not bootstrapped again.
    if [[ -f $ROOTFS/.topod-packages && $(cat "$ROOTFS/.topod-packages") == "$packages" ]]; then
        echo "image: reusing the packages in $ROOTFS"
    else
        install_packages "$packages"
    fi
    rm -f "$ROOTFS/etc/resolv.conf"
    configure_rootfs "$ROOTFS"
    local kernel initrd
    kernel=$(ls "$ROOTFS"/boot/vmlinuz-* | sort -V | tail -1)
    initrd=$(ls "$ROOTFS"/boot/initrd.img-* | sort -V | tail -1)
    cp "$kernel" "$IMAGE.tmp/vmlinuz"
    cp "$initrd" "$IMAGE.tmp/initrd.img"
    basename "$kernel" | sed 's/^vmlinuz-//' > "$IMAGE.tmp/kernel-version"
    mkfs.ext4 -q -F -L topod-live -d "$ROOTFS" "$IMAGE.tmp/root.img" "$IMAGE_SIZE" > build/live-mkfs.log 2>&1 \
        || { tail -5 build/live-mkfs.log >&2; echo "mkfs.ext4 -d failed" >&2; exit 1; }
    echo "$stamp_text" > "$IMAGE.tmp/stamp"
    rm -rf --one-file-system "$IMAGE" "$ROOTFS"
    mv "$IMAGE.tmp" "$IMAGE"
    echo "image: built in $((SECONDS - started)) s (kernel $(cat "$IMAGE/kernel-version"))"
}

build_wheelhouse() {
    # The guest's python3 is Debian 12's 3.11: the wheels must be cp311 for this arch.
    tier_wheelhouse 3.11 "$WHEELHOUSE" build/live-wheelhouse.log guest
}

prepare() {
    need_tools
    bash scripts/setup.sh --test
    build_image
    build_wheelhouse
}

case "${1:-run}" in
    prepare)
        prepare
        ;;
    run)
        started=$SECONDS
        prepare
        export TOPOD_LIVE_TIER=1 TOPOD_LIVE_IMAGE=$PWD/$IMAGE TOPOD_LIVE_WHEELHOUSE=$PWD/$WHEELHOUSE
        status=0
        rm -f build/live-run/timings.txt
        # -s: the tests print what they measured ("live: ..." lines); -rsxX: why any skipped or xfailed
        .venv/bin/python -m pytest -q -s -p no:cacheprovider -rsxX tests/live "${@:2}" || status=$?
        cat build/live-run/timings.txt 2>/dev/null || true
        echo "make test-live: $((SECONDS - started)) s in all (logs: build/live-run/)"
        exit $status
        ;;
    *)
        echo "usage: $0 [run [PYTEST ARGS] | prepare]" >&2
        exit 2
        ;;
esac
