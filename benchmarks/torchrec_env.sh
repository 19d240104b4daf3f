#!/usr/bin/env bash
# Create (if missing) the dev-only TorchRec reference virtualenv at $REPO/.venv-torchrec.
#
# TorchRec is never a dependency of shardplan: this venv exists so that the benchmarks
# (benchmarks/torchrec_reference.py, runtime_vs_torchrec.py) and the interop tests
# (tests/clients/test_torchrec.py) can run TorchRec 1.8.0 beside our code. It also holds
# shardplan's core dependencies (pyproject.toml's `dependencies`), so that our packages
# import there with PYTHONPATH=$REPO. tests/clients/test_torchrec.py runs this script itself.
#
#   bash benchmarks/torchrec_env.sh          # idempotent; last stdout line = venv python
#   PY=$(bash benchmarks/torchrec_env.sh)    # pip chatter goes to stderr
#
# Env overrides: PYTHON (interpreter used to create the venv; must be 3.11 because the
# torch wheel is cp311), TORCHREC_VENV (venv path, default $REPO/.venv-torchrec).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/.." && pwd)"
VENV="${TORCHREC_VENV:-$REPO/.venv-torchrec}"
VPY="$VENV/bin/python"

TORCH_VERSION="2.13.0"
FBGEMM_VERSION="1.8.0"
TORCHREC_VERSION="1.8.0"
TORCHMETRICS_VERSION="1.0.3"

log() { echo "[torchrec_env] $*" >&2; }

# shardplan's core dependencies, one per line, as pyproject.toml lists them.
core_deps() {
    "${1:-python3}" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
        "$REPO/pyproject.toml"
}
CORE_STAMP="$VENV/.shardplan-core-deps"

# Everything already in place? (exact versions, the planner imports, our core deps)
env_ok() {
    [ -x "$VPY" ] || return 1
    [ -f "$CORE_STAMP" ] && [ "$(cat "$CORE_STAMP")" = "$(core_deps "$VPY")" ] || return 1
    "$VPY" - "$TORCH_VERSION" "$FBGEMM_VERSION" "$TORCHREC_VERSION" "$TORCHMETRICS_VERSION" \
        >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
want_torch, want_fbgemm, want_trec, want_tm = sys.argv[1:5]
assert version("torch").split("+")[0] == want_torch
assert version("fbgemm-gpu-cpu") == want_fbgemm
assert version("torchrec") == want_trec
assert version("torchmetrics") == want_tm
import torchrec.distributed.planner  # noqa: F401
from torchrec.distributed.embedding import EmbeddingCollectionSharder  # noqa: F401
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: F401
import httpx, numpy, pydantic  # noqa: F401,E401
EOF
}

# Keep the venv out of git (the repo's .gitignore only lists .venv/).
ignore_venv() { [ -f "$VENV/.gitignore" ] || echo '*' >"$VENV/.gitignore"; }

if env_ok; then
    ignore_venv
    log "up to date: $VENV"
    echo "$VPY"
    exit 0
fi

if [ ! -x "$VPY" ]; then
    PY_CREATE="${PYTHON:-}"
    if [ -z "$PY_CREATE" ]; then
        if command -v python3.11 >/dev/null 2>&1; then PY_CREATE=python3.11; else PY_CREATE=python3; fi
    fi
    if ! "$PY_CREATE" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
        log "need Python 3.11 to create the venv (got: $("$PY_CREATE" --version 2>&1)); set PYTHON=..."
        exit 1
    fi
    log "creating $VENV with $("$PY_CREATE" --version 2>&1)"
    "$PY_CREATE" -m venv "$VENV"
fi
ignore_venv

# Pin torch for every pip call so that no package can swap it for another build.
CONSTRAINTS="$VENV/torchrec-constraints.txt"
printf 'torch==%s\nfbgemm-gpu-cpu==%s\n' "$TORCH_VERSION" "$FBGEMM_VERSION" >"$CONSTRAINTS"
pip_install() { "$VPY" -m pip install --disable-pip-version-check -c "$CONSTRAINTS" "$@" 1>&2; }

log "installing torch==$TORCH_VERSION (local CPU wheel) and fbgemm-gpu-cpu==$FBGEMM_VERSION"
pip_install "torch==$TORCH_VERSION"
pip_install "fbgemm-gpu-cpu==$FBGEMM_VERSION"
log "installing torchrec's runtime deps"
# These depend on torch only loosely (>=); the constraint keeps torch at $TORCH_VERSION.
# Their own small deps (cloudpickle, pyvers, lightning-utilities, typing-inspect, ...)
# are needed at import time, so they are installed with deps.
pip_install tensordict "torchmetrics==$TORCHMETRICS_VERSION" tqdm pyre-extensions
# torchrec declares a dependency on the CUDA 'fbgemm-gpu' package, which would pull in a
# CUDA torch: install it without deps (fbgemm-gpu-cpu provides the same module). pip may
# warn "torchrec 1.8.0 requires fbgemm-gpu, which is not installed": expected, harmless.
log "installing torchrec==$TORCHREC_VERSION (--no-deps)"
pip_install --no-deps "torchrec==$TORCHREC_VERSION"
log "installing shardplan's core dependencies"
mapfile -t CORE_DEPS < <(core_deps "$VPY")
pip_install "${CORE_DEPS[@]}"
core_deps "$VPY" >"$CORE_STAMP"

got_torch="$("$VPY" -c 'import torch; print(torch.__version__)')"
case "$got_torch" in
    "$TORCH_VERSION"|"$TORCH_VERSION"+*) ;;
    *) log "ERROR: torch in $VENV is $got_torch, expected $TORCH_VERSION"; exit 1 ;;
esac
if ! env_ok; then
    log "ERROR: import torchrec.distributed.planner fails in $VENV:"
    "$VPY" -c 'import torchrec.distributed.planner' 1>&2 || true
    exit 1
fi
log "ready: torch $got_torch, torchrec $TORCHREC_VERSION"
echo "$VPY"
