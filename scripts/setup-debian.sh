#!/usr/bin/env bash
# Install the Debian packages the project needs (e2e tier: QEMU/TCG + a private
# libvirtd + a guest kernel; graphviz for the --dot test; Go, protoc and Debian's
# grpc-go for the independent hook client test; podman, buildah, mmdebstrap and
# qemu-user-static for the image, amd64 and arm64) on a fresh Debian 12 machine, as
# root, without manual steps. `make demo` / `make test-fast` run it with
# SKIP_KERNEL=1; only `make test` (the e2e tier) fetches the guest kernel. Idempotent and fast when everything is already there, so that
# `make setup` / `make test` cost nothing on a warm machine.
#
# Deliberately NOT installed: libvirt-daemon-system (pulls systemd/udev
# upgrades and starts a system libvirtd) and any linux-image package (pulls
# initramfs-tools, udev upgrades ...). The guest kernel is extracted from the
# .deb instead (see fetch_kernel below).
#
# Environment:
#   PCITOPO_CACHE   cache dir for the guest kernel (default: <repo>/.cache/e2e)
#   SKIP_KERNEL=1   do not fetch the guest kernel
#   ONLY="p ..."    install only these packages of the list below (`make demo`: graphviz);
#                   implies no libvirt user and no guest kernel
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PCITOPO_CACHE:-$REPO_ROOT/.cache/e2e}"

PACKAGES=(
    qemu-system-x86          # qemu-system-x86_64 (TCG: /dev/kvm here does not work)
    busybox-static           # the guest's userland; also builds the initramfs cpio
    pciutils                 # lspci (copied into the guest with its libraries)
    pci.ids                  # names for lspci, in the guest too
    libvirt-daemon           # monolithic libvirtd (run privately, no systemd)
    libvirt-daemon-driver-qemu
    libvirt-clients          # virsh, virt-xml-validate
    libxml2-utils            # xmllint, used by virt-xml-validate
    ovmf                     # UEFI firmware (/usr/share/ovmf/OVMF.fd) for the e2e MMIO tier
    seabios                  # SeaBIOS (qemu-system-x86 depends on it already; named for clarity)
    mmdebstrap               # builds the Debian 13 root of the e2e tier (scripts/setup-trixie.sh)
    graphviz                 # dot: renders `pcitopo topo --dot` (make demo, the DOT test)
    # The grpc-go hook client test (tests/sidecar/goclient.py): stubs generated from proto/ by
    # Debian's protoc plugins, built in GOPATH mode against Debian's Go libraries (no module
    # proxy). grpc-go 1.33 needs github.com/golang/protobuf's 1.5 line for protoc-gen-go 1.28
    # messages (the 1.3 line it would otherwise pull in panics on the first reply).
    golang-go
    golang-google-grpc-dev
    golang-google-protobuf-dev
    golang-github-golang-protobuf-1-5-dev
    protobuf-compiler
    protoc-gen-go
    protoc-gen-go-grpc
    # The image (make image, tests/sidecar/test_image.py): podman/buildah with runc, the Debian
    # base made by mmdebstrap, and arm64 builds and runs under qemu-user (binfmt_misc).
    podman
    buildah
    runc
    uidmap
    mmdebstrap
    qemu-user-static
    binfmt-support
    arch-test                # mmdebstrap's test whether a foreign root's programs run (only Recommended)
)

if [[ -n ${ONLY:-} ]]; then
    read -r -a wanted <<<"$ONLY"
    for p in "${wanted[@]}"; do
        [[ " ${PACKAGES[*]} " == *" $p "* ]] || { printf 'setup-debian: %s is not a package of this project\n' "$p" >&2; exit 2; }
    done
    PACKAGES=("${wanted[@]}")
fi

log() { printf 'setup-debian: %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
    SUDO=sudo
else
    SUDO=
fi

APT_UPDATED=0
apt_update_once() {
    if [[ $APT_UPDATED -eq 0 ]]; then
        log "apt-get update"
        $SUDO apt-get update -qq
        APT_UPDATED=1
    fi
}

missing_packages() {
    local p status
    for p in "${PACKAGES[@]}"; do
        status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
        [[ $status == installed ]] || printf '%s\n' "$p"
    done
}

install_packages() {
    local missing
    mapfile -t missing < <(missing_packages)
    if [[ ${#missing[@]} -eq 0 ]]; then
        log "packages: all ${#PACKAGES[@]} installed"
        return
    fi
    apt_update_once
    log "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
}

# The libvirt-qemu user/group: libvirt's QEMU driver refuses to start
# without them, and libvirt-daemon (unlike -system) does not create them.
ensure_libvirt_user() {
    if ! getent group libvirt-qemu >/dev/null; then
        log "creating group libvirt-qemu"
        $SUDO groupadd --system libvirt-qemu
    fi
    if ! getent passwd libvirt-qemu >/dev/null; then
        log "creating user libvirt-qemu"
        $SUDO useradd --system --gid libvirt-qemu --home-dir /var/lib/libvirt \
            --no-create-home --shell /usr/sbin/nologin libvirt-qemu
    fi
}

# Guest kernel: the versioned linux-image-*-cloud-amd64 that the
# linux-image-cloud-amd64 metapackage depends on (PCI, pcieport and ACPI NUMA
# built in). Only ./boot/vmlinuz-* is extracted; the package is not installed.
fetch_kernel() {
    if compgen -G "$CACHE/vmlinuz-*" >/dev/null; then
        log "kernel: $(basename "$(ls "$CACHE"/vmlinuz-* | head -n1)") cached"
        return
    fi
    mkdir -p "$CACHE"
    local dep
    dep=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null \
          | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    if [[ -z $dep ]]; then
        apt_update_once
        dep=$(apt-cache depends linux-image-cloud-amd64 \
              | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    fi
    [[ -n $dep ]] || { log "cannot resolve linux-image-cloud-amd64"; exit 1; }
    local tmp
    rm -rf "$CACHE"/.kernel.*
    tmp=$(mktemp -d "$CACHE/.kernel.XXXXXX")
    log "kernel: downloading $dep"
    # apt-get download writes into the cwd; its sandbox user (_apt) cannot
    # reach a dir below /work, so download as root (no warning, same result).
    if ! (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$dep"); then
        # stale package lists name a version the mirror no longer has
        [[ $APT_UPDATED -eq 0 ]] || exit 1
        apt_update_once
        dep=$(apt-cache depends linux-image-cloud-amd64 \
              | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
        (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$dep")
    fi
    local deb
    deb=$(ls "$tmp"/*.deb | head -n1)
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*'
    local k
    k=$(ls "$tmp"/boot/vmlinuz-* | head -n1)
    # the fw_cfg module comes from the same package: one download for both
    extract_fw_cfg_module "$deb" "${k##*/vmlinuz-}"
    mv "$k" "$CACHE/"
    rm -rf "$tmp"
    log "kernel: $CACHE/$(basename "$k")"
}

# The guest kernel's qemu_fw_cfg module (CONFIG_FW_CFG_SYSFS=m in Debian's cloud kernel): the
# e2e init loads it to read the blobs the domain passes through fw_cfg. Taken from the same
# versioned package as the kernel, stored next to it as qemu_fw_cfg-<version>.ko.
fetch_fw_cfg_module() {
    local k ver mod tmp
    k=$(ls "$CACHE"/vmlinuz-* 2>/dev/null | tail -n1)
    [[ -n $k ]] || return 0
    ver=${k##*/vmlinuz-}
    mod="$CACHE/qemu_fw_cfg-$ver.ko"
    if [[ -e $mod ]]; then
        log "fw_cfg module: cached"
        return
    fi
    # a kernel cached before the module was taken with it: fetch its package once more
    rm -rf "$CACHE"/.fwcfg.*
    tmp=$(mktemp -d "$CACHE/.fwcfg.XXXXXX")
    log "fw_cfg module: downloading linux-image-$ver"
    if ! (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "linux-image-$ver"); then
        [[ $APT_UPDATED -eq 0 ]] || exit 1
        apt_update_once
        (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "linux-image-$ver")
    fi
    extract_fw_cfg_module "$(ls "$tmp"/*.deb | head -n1)" "$ver"
    rm -rf "$tmp"
}

# extract_fw_cfg_module DEB VERSION: qemu_fw_cfg.ko of the kernel package DEB, uncompressed,
# as $CACHE/qemu_fw_cfg-VERSION.ko
extract_fw_cfg_module() {
    local deb=$1 ver=$2 mod="$CACHE/qemu_fw_cfg-$2.ko" dir ko
    dir=$(mktemp -d "$CACHE/.fwcfg-x.XXXXXX")
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$dir" --wildcards './lib/modules/*/qemu_fw_cfg.ko*'
    ko=$(find "$dir/lib/modules" -name 'qemu_fw_cfg.ko*' | head -n1)
    [[ -n $ko ]] || { log "fw_cfg module: not in linux-image-$ver"; exit 1; }
    case $ko in
        *.xz) xz -dc "$ko" > "$mod.tmp" ;;
        *.zst) zstd -qdc "$ko" > "$mod.tmp" ;;
        *) cp "$ko" "$mod.tmp" ;;
    esac
    mv "$mod.tmp" "$mod"
    rm -rf "$dir"
    log "fw_cfg module: $mod"
}

# qemu-user-static registers its handlers through binfmt-support, whose service mounts
# binfmt_misc at boot; on a machine that has not booted since (or a container without that
# service) mount it and enable the aarch64 handler now, so arm64 RUN steps and containers run.
enable_binfmt() {
    local fs=/proc/sys/fs/binfmt_misc
    [[ -e $fs/qemu-aarch64 ]] && return
    if [[ ! -e $fs/register ]]; then
        $SUDO mount -t binfmt_misc binfmt_misc "$fs" || { log "cannot mount binfmt_misc: arm64 images will not build"; return; }
    fi
    $SUDO update-binfmts --enable qemu-aarch64 || log "cannot enable qemu-aarch64: arm64 images will not build"
}

install_packages
[[ -n ${ONLY:-} ]] && exit 0
ensure_libvirt_user
enable_binfmt
if [[ ${SKIP_KERNEL:-0} != 1 ]]; then
    fetch_kernel
    fetch_fw_cfg_module
fi
