#!/usr/bin/env bash
# Build the Debian 13 ("trixie") root the guest-boot (e2e) tier runs its libvirtd and QEMU from,
# once, and cache it: <repo>/.cache/trixie/root (a plain directory) plus .cache/trixie/stamp.
#
# Why a separate root: the VMs pcitopo's users run boot on KubeVirt's stack (QEMU 10, libvirt 11,
# SeaBIOS 1.16.3, a 2025 edk2). Debian 12 ships QEMU 7.2, libvirt 9.0, SeaBIOS 1.16.2 and OVMF
# 2022.11, and cannot install Debian 13's packages (they need a newer glibc). Debian 13 carries
# the production versions (see docs/SOURCES.md), so mmdebstrap builds a trixie root with them
# and the tests run its binaries in a chroot (tests/e2e/README.md, "The Debian 13 root").
#
# The mirror is the machine's own: the first `URIs:` line of /etc/apt/sources.list.d/debian.sources
# (or PCITOPO_DEBIAN_MIRROR). Nothing of the machine's apt state is touched: mmdebstrap keeps its
# own lists and cache inside the root and cleans them at the end.
#
# Pinned: the upstream versions the project's boot proofs are about (PINS below). A mirror that
# serves other upstream versions fails the build with the versions it got; the exact Debian
# versions are recorded in the stamp and printed on every run.
#
# Idempotent: a stamp that matches this recipe prints the versions and exits (~0.1 s). A changed
# recipe (package list, pins) rebuilds into root.new and swaps it in.
#
# Environment:
#   PCITOPO_TRIXIE          directory of the root and its stamp (default <repo>/.cache/trixie)
#   PCITOPO_DEBIAN_MIRROR   mirror URI (default: from the machine's apt sources)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${PCITOPO_TRIXIE:-$REPO_ROOT/.cache/trixie}"
ROOT="$DIR/root"
STAMP="$DIR/stamp"

# What the e2e tier runs from the root: the monolithic libvirtd with its QEMU driver, virsh,
# QEMU, both firmwares, and xmllint (virt-xml-validate's validator). The guest's userland
# (busybox, lspci) and kernel stay the machine's: they are the guest, not the stack.
INCLUDE=(
    qemu-system-x86
    libvirt-daemon
    libvirt-daemon-driver-qemu
    libvirt-clients
    seabios
    ovmf
    libxml2-utils
)
# package=upstream version prefix the root must carry
PINS=(
    qemu-system-x86=1:10.0.
    libvirt-daemon=11.3.
    seabios=1.16.3-
    ovmf=2025.02-
)
# what the stamp records and every run prints
REPORT=(qemu-system-x86 libvirt-daemon libvirt-clients seabios ovmf libc6)

log() { printf 'setup-trixie: %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }

if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi

recipe_hash() {
    printf '%s\n' "${INCLUDE[@]}" "${PINS[@]}" | sha256sum | cut -c1-16
}

mirror() {
    if [[ -n ${PCITOPO_DEBIAN_MIRROR:-} ]]; then
        printf '%s\n' "$PCITOPO_DEBIAN_MIRROR"
        return
    fi
    local src=/etc/apt/sources.list.d/debian.sources uri
    [[ -r $src ]] || die "no $src to read the Debian mirror from: set PCITOPO_DEBIAN_MIRROR"
    uri=$(awk '/^URIs:/ {print $2; exit}' "$src")
    [[ -n $uri ]] || die "no URIs: line in $src: set PCITOPO_DEBIAN_MIRROR"
    printf '%s\n' "$uri"
}

versions_of() {
    local root=$1
    $SUDO chroot "$root" dpkg-query -W -f='${Package}=${Version}\n' "${REPORT[@]}"
}

check_pins() {
    local root=$1 pin pkg want have bad=0
    for pin in "${PINS[@]}"; do
        pkg=${pin%%=*}
        want=${pin#*=}
        have=$($SUDO chroot "$root" dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
        if [[ $have != "$want"* ]]; then
            log "pin: $pkg is '${have:-absent}', want $want*"
            bad=1
        fi
    done
    return $bad
}

# Nothing may be mounted below the root in this mount namespace before a delete: the tests
# mount only inside their own private namespaces, so this holds unless someone chrooted by hand.
assert_unmounted() {
    local d=$1
    if findmnt -rn -o TARGET | awk -v d="$d" 'index($0, d "/") == 1 || $0 == d {f=1} END {exit !f}'; then
        die "something is mounted below $d: unmount it first (findmnt | grep $d)"
    fi
}

print_versions() {
    local line
    while read -r line; do
        [[ $line == versions:* ]] && log "${line#versions: }"
    done <"$STAMP"
    log "root: $ROOT"
}

want_hash=$(recipe_hash)
if [[ -f $STAMP && -x $ROOT/usr/bin/qemu-system-x86_64 ]] && grep -qx "recipe: $want_hash" "$STAMP"; then
    touch "$STAMP"  # newer than this script for make, which depends on both
    print_versions
    exit 0
fi

command -v mmdebstrap >/dev/null || die "mmdebstrap missing: run scripts/setup-debian.sh (make setup)"
MIRROR=$(mirror)
mkdir -p "$DIR"
NEW="$DIR/root.new"
assert_unmounted "$NEW"
$SUDO rm -rf --one-file-system "$NEW"
log "building $NEW from trixie main ($(printf '%s,' "${INCLUDE[@]}" | sed 's/,$//'))"
t0=$(date +%s)
include=$(IFS=,; echo "${INCLUDE[*]}")
$SUDO mmdebstrap --quiet --variant=apt --include="$include" trixie "$NEW" \
    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" \
    || die "mmdebstrap failed (mirror $MIRROR)"
check_pins "$NEW" || die "the mirror's trixie no longer carries the pinned upstream versions: update PINS in $0 and the docs"

assert_unmounted "$ROOT"
if [[ -e $ROOT ]]; then
    $SUDO rm -rf --one-file-system "$ROOT"
fi
mv "$NEW" "$ROOT"
{
    echo "recipe: $want_hash"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - t0 )) s"
    versions_of "$ROOT" | sed 's/^/versions: /'
} >"$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
log "built in $(( $(date +%s) - t0 )) s"
print_versions
