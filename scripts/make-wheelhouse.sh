#!/usr/bin/env bash
# Download every wheel the searchr1 image needs into a folder, so `docker build` can install
# with `pip install --no-index` (no network inside the build, or a cluster without internet).
#
# Called by scripts/docker-e2e.sh, or by hand before an offline build:
#   scripts/make-wheelhouse.sh [DEST] [EXTRAS]     # DEST defaults to ./wheelhouse
# The requirement list is read from pyproject.toml by scripts/pyproject-requirements.py (the
# dependencies, the build backend, and the optional extras named in EXTRAS, comma separated,
# default "remote" like the Dockerfile), never kept by hand: a new dependency reaches the image by itself.
# Wheels are for CPython 3.11 on manylinux x86_64 (the Debian bookworm base and the pinned
# PyTorch image both run 3.11). torch is pinned to the CPU build (TORCH_SPEC, default
# torch==2.13.0): a bare "torch" would pull several GB of CUDA wheels. A GPU image built from
# the PyTorch base image does not need torch here at all (set TORCH_SPEC="" to leave it out).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$here/wheelhouse}"
extras="${2-${SEARCHR1_EXTRAS-remote}}"   # the Dockerfile's default EXTRAS
torch_spec="${TORCH_SPEC-torch==2.13.0}"
python="${PYTHON:-python3}"

mkdir -p "$dest"
reqs="$(mktemp)"
trap 'rm -f "$reqs" "$reqs.c"' EXIT

without=()
[[ -n "$torch_spec" ]] || without=(--without torch)   # left to the base image
if [[ ",$extras," == *",gpu,"* ]]; then
    # causal-conv1d is an sdist only, which builds only where CUDA and a CUDA torch are: build
    # its wheel on a GPU host (`pip wheel --no-build-isolation causal-conv1d -w DEST`) and put
    # it in DEST; flash-linear-attention (pure Python + Triton) is downloaded here.
    echo "make-wheelhouse: causal-conv1d left out (sdist only; build its wheel on a CUDA host)" >&2
    without+=(--without causal-conv1d)
fi
"$python" "$here/scripts/pyproject-requirements.py" "$here/pyproject.toml" "$extras" \
    "${without[@]}" >"$reqs"
constraints=()
if [[ -n "$torch_spec" ]]; then
    echo "$torch_spec" >"$reqs.c"
    constraints=(--constraint "$reqs.c")
fi

set +e
"$python" -m pip download --quiet --dest "$dest" \
    --only-binary :all: --implementation cp --python-version 3.11 --abi cp311 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform linux_x86_64 \
    "${constraints[@]}" --requirement "$reqs" 2>&1 |
    # pip's config on this machine lists find-links folders that do not exist: noise.
    grep -v -E "^WARNING: Location .* is ignored" >&2
status="${PIPESTATUS[0]}"
set -e
if [[ "$status" != 0 ]]; then
    echo "make-wheelhouse: pip download failed (exit $status)" >&2
    exit "$status"
fi
echo "make-wheelhouse: $(ls "$dest" | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
