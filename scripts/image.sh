#!/usr/bin/env bash
# Build the sidecar image from the Containerfile (`make image`), for one architecture or both,
# and optionally the multi-arch manifest list that the manifests in deploy/ name.
#
#   scripts/image.sh [--arch amd64|arm64|all] [--tag NAME] [--manifest] [--preflight]
#
# - the base: scripts/image-base.sh (Debian 12 + python3 from your Debian mirror, cached);
# - the image: localhost/pcitopo:<version>-<arch>, built with podman (buildah if podman is
#   missing); a foreign architecture's RUN steps execute under qemu-user (qemu-user-static and
#   binfmt-support, installed by scripts/setup-debian.sh);
# - --manifest (with --arch all): the manifest list localhost/pcitopo:<version> holding both, to
#   push with `podman manifest push --all localhost/pcitopo:<version> docker://REGISTRY/pcitopo:<version>`.
# - --preflight: check what the build needs (tools, the CA file, a foreign architecture's
#   arch-test, qemu-user-static and binfmt-support) and print each build command; build nothing.
# Prints one line per image: name, architecture, size in bytes, build seconds.
#
# Environment:
#   CONTAINERS_CONF    podman/buildah engine settings (your own; CI passes its machine's)
#   PIP_CA_BUNDLE      a CA bundle pip should trust while the build stage downloads wheels
#                      (mounted read-only for the build only; nothing of it reaches the image)
#   PIP_CERT           pip's own variable for the same: used when PIP_CA_BUNDLE is unset
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
TAG=
MANIFEST=0
PREFLIGHT=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --arch) ARCH=$2; shift 2 ;;
        --tag) TAG=$2; shift 2 ;;
        --manifest) MANIFEST=1; shift ;;
        --preflight) PREFLIGHT=1; shift ;;
        -h | --help) sed -n '2,23p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "image: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { printf 'image: %s\n' "$*" >&2; }

VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' src/pcitopo/__init__.py)
[[ -n $VERSION ]] || { log "cannot read __version__ from src/pcitopo/__init__.py"; exit 2; }
NAME=${TAG:-localhost/pcitopo:$VERSION}

case $ARCH in
    all) ARCHES=(amd64 arm64) ;;
    amd64 | arm64) ARCHES=("$ARCH") ;;
    *) log "unsupported architecture $ARCH (amd64, arm64 or all)"; exit 2 ;;
esac
if [[ $MANIFEST == 1 && ${#ARCHES[@]} -lt 2 ]]; then
    log "--manifest needs --arch all"
    exit 2
fi

if command -v podman >/dev/null; then
    BUILD=(podman build)
elif command -v buildah >/dev/null; then
    BUILD=(buildah bud)
else
    log "neither podman nor buildah is installed (scripts/setup-debian.sh installs them)"
    exit 2
fi

# The CA bundle for the build stage's pip: ours (PIP_CA_BUNDLE) or pip's own variable (PIP_CERT,
# what a machine behind a TLS-inspecting proxy often already exports for pip). The file is
# mounted, and the build stage's PIP_CERT (pip's variable inside the build) names the mount.
CA_VAR=
if [[ -n ${PIP_CA_BUNDLE:-} ]]; then CA_VAR=PIP_CA_BUNDLE; elif [[ -n ${PIP_CERT:-} ]]; then CA_VAR=PIP_CERT; fi
CA_ARGS=()
if [[ -n $CA_VAR ]]; then
    ca=${!CA_VAR}
    [[ -r $ca ]] || { log "$CA_VAR=$ca is not readable"; exit 2; }
    CA_ARGS=(-v "$(realpath "$ca"):/run/pip-ca.crt:ro" --build-arg PIP_CERT=/run/pip-ca.crt)
    log "pip in the build trusts $CA_VAR=$ca"
fi

# Digests of what the Containerfile's COPY steps take (see its comment on LOCK_DIGEST): the
# lock files, and the sources of the wheel as .containerignore lets them through.
digest() { find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16; }
LOCK_DIGEST=$(digest requirements.lock requirements-build.lock)
SOURCE_DIGEST=$(digest pyproject.toml README.md LICENSE src/pcitopo scripts/sbom.py)
# The SBOM's creation time: the sources' commit time, so the same sources give the same file.
SBOM_CREATED=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || true)

if [[ $PREFLIGHT == 1 ]]; then
    for arch in "${ARCHES[@]}"; do
        bash scripts/image-base.sh --preflight "$arch"
        printf '%q ' "${BUILD[@]}" --arch "$arch" --os linux --build-arg "BASE_IMAGE=localhost/pcitopo-base:bookworm-$arch" \
            "${CA_ARGS[@]}" --layers --tag "$NAME-$arch" --file Containerfile .
        echo
    done
    exit 0
fi

for arch in "${ARCHES[@]}"; do
    base=$(bash scripts/image-base.sh "$arch")
    start=$(date +%s)
    log "building $NAME-$arch from $base"
    "${BUILD[@]}" --arch "$arch" --os linux --build-arg "BASE_IMAGE=$base" "${CA_ARGS[@]}" \
        --build-arg "LOCK_DIGEST=$LOCK_DIGEST" --build-arg "SOURCE_DIGEST=$SOURCE_DIGEST" \
        --build-arg "SBOM_CREATED=$SBOM_CREATED" --layers --tag "$NAME-$arch" --file Containerfile . >&2
    secs=$(( $(date +%s) - start ))
    size=$(podman image inspect --format '{{.Size}}' "$NAME-$arch" 2>/dev/null || buildah inspect --format '{{.ImageSize}}' "$NAME-$arch")
    echo "$NAME-$arch $arch $size ${secs}s"
done

if [[ $MANIFEST == 1 ]]; then
    podman manifest rm "$NAME" >/dev/null 2>&1 || true
    podman manifest create "$NAME" >/dev/null
    for arch in "${ARCHES[@]}"; do
        podman manifest add --arch "$arch" --os linux "$NAME" "containers-storage:$NAME-$arch" >/dev/null
    done
    echo "$NAME manifest-list $(IFS=,; echo "${ARCHES[*]}")"
fi
