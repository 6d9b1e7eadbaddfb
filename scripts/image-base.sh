#!/usr/bin/env bash
# The image's base without a registry: Debian 12 (bookworm) with Debian's python3 and
# python3-venv, made by mmdebstrap from the Debian mirror this machine's apt already uses, and
# imported into the local container store under the name the Containerfile's FROM takes
# (BASE_IMAGE). It is what `debian:bookworm-slim` plus `apt-get install python3 python3-venv`
# gives (the Containerfile's header shows that build): the same packages from the same archive,
# and the same files left out (dpkg path excludes as the official slim images use, after
# debuerreotype's .slimify-excludes).
#
#   scripts/image-base.sh [amd64|arm64]      prints the image name it made or found
#   scripts/image-base.sh --preflight [ARCH] checks only what the build needs (one line each
#                                            missing thing, exit 2), makes nothing
#
# The root tarball is cached under .cache/image/ (keyed by this script, the architecture and the
# Debian package versions the mirror resolves now, so a mirror update rebuilds it and says which
# packages changed), so only the first run after a change pays mmdebstrap (about 80 s for amd64; arm64 runs its maintainer scripts
# under qemu-user). A foreign architecture needs qemu-user-static and binfmt-support
# (scripts/setup-debian.sh installs them and enables the handler) and arch-test, with which
# mmdebstrap decides how to run the foreign root's programs (without it mmdebstrap ends with a
# bare `E: install arch-test`; this script says what to install first).
#
# Environment:
#   PCITOPO_CACHE_IMAGE  where the tarballs go (default <repo>/.cache/image)
#   APT_SOURCES          the deb822 sources file whose mirror to use
#                        (default /etc/apt/sources.list.d/debian.sources, read at run time)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFLIGHT=0
[[ ${1:-} == --preflight ]] && { PREFLIGHT=1; shift; }
NATIVE=$(dpkg --print-architecture)
ARCH="${1:-$NATIVE}"
CACHE="${PCITOPO_CACHE_IMAGE:-$REPO_ROOT/.cache/image}"
SOURCES="${APT_SOURCES:-/etc/apt/sources.list.d/debian.sources}"
SUITE=bookworm
NAME="localhost/pcitopo-base:$SUITE-$ARCH"
PACKAGES=python3,python3-venv

log() { printf 'image-base: %s\n' "$*" >&2; }

case $ARCH in
    amd64 | arm64) ;;
    *) log "unsupported architecture $ARCH (amd64 or arm64)"; exit 2 ;;
esac
for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || { log "$tool is missing: run scripts/setup-debian.sh"; exit 2; }
done
[[ -r $SOURCES ]] || { log "no apt sources file at $SOURCES (set APT_SOURCES)"; exit 2; }

# A foreign architecture's root runs its maintainer scripts under qemu-user: mmdebstrap asks
# arch-test whether ARCH's programs run here, qemu-user-static has the emulator, binfmt-support
# registers it with the kernel's binfmt_misc (Debian package names; mmdebstrap only recommends
# arch-test and suggests the other two, so an install without recommends lacks all three).
foreign_arch_ready() {
    local qarch missing=()
    [[ $ARCH == "$NATIVE" ]] && return 0
    case $ARCH in arm64) qarch=aarch64 ;; amd64) qarch=x86_64 ;; esac
    command -v arch-test >/dev/null || missing+=(arch-test)
    command -v "qemu-$qarch-static" >/dev/null || missing+=(qemu-user-static)
    command -v update-binfmts >/dev/null || missing+=(binfmt-support)
    if [[ ${#missing[@]} -gt 0 ]]; then
        log "an $ARCH root on this $NATIVE machine runs $ARCH programs under qemu-user, which needs ${missing[*]}: apt-get install ${missing[*]} (scripts/setup-debian.sh installs arch-test, qemu-user-static and binfmt-support), then retry"
        exit 2
    fi
    if ! grep -qx enabled "/proc/sys/fs/binfmt_misc/qemu-$qarch" 2>/dev/null; then
        log "qemu-$qarch is not registered with binfmt_misc: update-binfmts --enable qemu-$qarch (scripts/setup-debian.sh does it), then retry"
        exit 2
    fi
}
foreign_arch_ready
if [[ $PREFLIGHT == 1 ]]; then
    log "preflight: $ARCH base on $NATIVE: ready"
    exit 0
fi

# The Debian packages (name and version) the mirror resolves today for this root: everything
# mmdebstrap's minbase takes (Priority: required, and apt) plus $PACKAGES, as apt would install
# them on an empty system. Resolved with apt's own solver against a private copy of the
# indexes (this machine's apt state is not touched), so a point release or security update on
# the mirror changes the list, hence the cache key, hence the base.
resolve_versions() {
    local state="$CACHE/apt-$SUITE-$ARCH" parts
    parts="$state/sources.list.d"
    mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$parts"
    cp "$SOURCES" "$parts/debian.sources"
    local apt=(-o "APT::Architecture=$ARCH" -o "APT::Architectures=$ARCH" -o Debug::NoLocking=1
               -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$parts"
               -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o Dir::State::Status=/dev/null
               -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null)
    apt-get "${apt[@]}" -qq update >/dev/null 2>&1 || return 1
    apt-get "${apt[@]}" -s -qq install '?priority(required)' apt ${PACKAGES//,/ } 2>/dev/null \
        | sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*/\1 \2/p' | LC_ALL=C sort
}

VERSIONS_FILE="$CACHE/base-$SUITE-$ARCH.versions"  # what the current base was made from
mkdir -p "$CACHE"
if versions=$(resolve_versions) && [[ -n $versions ]]; then
    :
elif [[ -s $VERSIONS_FILE ]]; then
    log "cannot resolve package versions from $SOURCES (offline?): keeping the base made from $(basename "$VERSIONS_FILE")"
    versions=$(cat "$VERSIONS_FILE")
else
    log "cannot resolve package versions from $SOURCES with apt-get (is the mirror reachable?)"
    exit 2
fi

# The cache key: what decides the tarball's content, the resolved versions included.
KEY=$( { cat "${BASH_SOURCE[0]}"; echo "$ARCH $SUITE $PACKAGES"; echo "$versions"; } | sha256sum | cut -c1-12)
TAR="$CACHE/base-$SUITE-$ARCH-$KEY.tar"

# What changed since the base in use was made (make image prints it before rebuilding).
if [[ -s $VERSIONS_FILE ]] && ! changed=$(diff <(cat "$VERSIONS_FILE") <(echo "$versions")); then
    log "the mirror's packages changed since the last base ($(grep -c '^>' <<<"$changed") new versions); rebuilding:"
    LC_ALL=C join -a1 -a2 -e '-' -o 0,1.2,2.2 <(cat "$VERSIONS_FILE") <(echo "$versions") \
        | awk '$2 != $3 { printf "image-base:   %s %s -> %s\n", $1, $2, $3 }' >&2
fi

have=$(podman image inspect --format '{{index .Config.Labels "io.pcitopo.base.key"}}' "$NAME" 2>/dev/null || true)
if [[ $have == "$KEY" ]]; then
    log "$NAME: up to date"
    echo "$NAME"
    exit 0
fi

if [[ ! -s $TAR ]]; then
    mkdir -p "$CACHE"
    rm -f "$CACHE/base-$SUITE-$ARCH-"*.tar "$CACHE/.base-$SUITE-$ARCH".*
    tmp="$CACHE/.base-$SUITE-$ARCH.$$.tar"  # the .tar ending tells mmdebstrap the format
    log "mmdebstrap $SUITE $ARCH (--include=$PACKAGES) from $SOURCES"
    start=$(date +%s)
    # The sources file is pasted into the root as its own sources list; the official slim images'
    # path excludes (docs but their copyright files, man pages, info, locales, lintian) apply to
    # every package installed, in the base and in any later apt-get install.
    # mmdebstrap copies this machine's /etc/resolv.conf and /etc/hostname into the root (as
    # debootstrap does): they go, so the image carries nothing of the machine that built it
    # (the container runtime provides both at run time).
    # Merged /usr by directory links (as debootstrap and the official images make it), not by the
    # usrmerge package, which would pull in perl (~45 MB).
    mmdebstrap --quiet --variant=minbase --arch="$ARCH" --include="$PACKAGES" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/linda/*' \
        --dpkgopt='path-exclude=/usr/share/lintian/overrides/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --customize-hook='rm -f "$1/etc/resolv.conf" "$1/etc/hostname"' \
        "$SUITE" "$tmp" "$SOURCES"
    mv "$tmp" "$TAR"
    echo "$versions" >"$VERSIONS_FILE"
    log "made $(basename "$TAR") in $(( $(date +%s) - start )) s ($(du -m "$TAR" | cut -f1) MB)"
fi

log "importing $(basename "$TAR") as $NAME"
podman import --quiet --arch "$ARCH" --os linux \
    --change "LABEL io.pcitopo.base.key=$KEY" \
    --change 'CMD ["/bin/bash"]' \
    "$TAR" "$NAME" >/dev/null
echo "$NAME"
