# searchr1 as a container: `docker compose run smoke`, `docker compose run train` (compose.yaml).
#
# BASE_IMAGE defaults to the pinned CUDA PyTorch runtime for GPU hosts; any base with
# Python >= 3.11 works (torch is then installed like every other dependency):
#   docker build -t searchr1 .                                            # GPU host, online
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm -t searchr1:cpu .
# On the CUDA base the Gated DeltaNet kernels of Qwen3.5 are added (GPU_KERNELS, below).
# Offline (a cluster without internet, or this project's CI): put wheels in ./wheelhouse
# (scripts/make-wheelhouse.sh) and build with `--network none`; pip then installs with
# --no-index from those wheels only.
ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime

# ---------------------------------------------------------------- deps: the virtualenv
# Only pyproject.toml (and the optional wheelhouse) go in here, so editing the source never
# reinstalls the dependencies: this stage stays cached until pyproject.toml changes.
FROM ${BASE_IMAGE} AS deps
# Where torch comes from when the base lacks it and no wheelhouse is given: the CPU build
# (a bare `pip install torch` would fetch several GB of CUDA libraries).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional extras of the searchr1 package to install too, comma separated. "remote" (the
# TaoToken/Tinker SDKs) is what config.toml.example's model provider needs; "" for none.
ARG EXTRAS=remote
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# `wheelhouse*` matches nothing when there is no ./wheelhouse, which is fine: pip then goes
# online. When it matches, the wheels land next to pyproject.toml in /build.
COPY pyproject.toml scripts/pyproject-requirements.py wheelhouse* /build/
RUN set -eu; \
    python3 -c 'import sys; sys.exit(None if sys.version_info >= (3, 11) else \
        "searchr1 needs Python >= 3.11; BASE_IMAGE has " + sys.version.split()[0])'; \
    # --system-site-packages: a base image that ships torch (the CUDA one) keeps its own build.
    python3 -m venv --system-site-packages /opt/venv; \
    python3 /build/pyproject-requirements.py /build/pyproject.toml "$EXTRAS" \
        >/build/requirements.txt
RUN set -eu; \
    if ls /build/*.whl >/dev/null 2>&1; then \
        echo "installing from the wheelhouse only (--no-index)"; \
        /opt/venv/bin/pip install --no-index --find-links /build -r /build/requirements.txt; \
    else \
        if ! /opt/venv/bin/python -c 'import torch' 2>/dev/null; then \
            /opt/venv/bin/pip install --index-url "$TORCH_INDEX_URL" torch; \
        fi; \
        /opt/venv/bin/pip install -r /build/requirements.txt; \
    fi; \
    /opt/venv/bin/python -c 'import torch, transformers, peft; print("torch", torch.__version__)'
# Gated DeltaNet kernels (Qwen3.5, Qwen3-Next): flash-linear-attention and causal-conv1d, the
# `gpu` extra. GPU_KERNELS=auto installs them when the venv's torch is a CUDA build (the
# default base image) and goes on without them if that fails (the trainer then warns at
# start, naming the packages); 1 requires them; 0 skips them. Online, causal-conv1d's sdist
# fetches its prebuilt wheel for this torch/CUDA (the runtime base has no nvcc to compile
# it). Offline, the wheelhouse must hold both: scripts/make-wheelhouse.sh DEST remote,gpu
# downloads flash-linear-attention; causal-conv1d's wheel is built on a CUDA host with
# `pip wheel --no-build-isolation causal-conv1d -w DEST`.
ARG GPU_KERNELS=auto
RUN set -eu; \
    cuda="$(/opt/venv/bin/python -c 'import torch; print(torch.version.cuda or "")')"; \
    if [ "$GPU_KERNELS" = 0 ] || { [ "$GPU_KERNELS" = auto ] && [ -z "$cuda" ]; }; then \
        echo "Gated DeltaNet kernels skipped (GPU_KERNELS=$GPU_KERNELS, torch CUDA ${cuda:-none})"; \
        exit 0; \
    fi; \
    python3 /build/pyproject-requirements.py /build/pyproject.toml gpu --extras-only \
        >/build/gpu.txt; \
    if ls /build/*.whl >/dev/null 2>&1; then \
        set -- --no-index --find-links /build; \
    else \
        set --; \
    fi; \
    if /opt/venv/bin/pip install --no-build-isolation "$@" -r /build/gpu.txt \
        && /opt/venv/bin/python -c 'import fla, causal_conv1d'; then \
        echo "Gated DeltaNet kernels installed"; \
    elif [ "$GPU_KERNELS" = 1 ]; then \
        echo "GPU_KERNELS=1: installing $(tr '\n' ' ' </build/gpu.txt)failed" >&2; exit 1; \
    else \
        echo "WARNING: Gated DeltaNet kernels not installed ($(tr '\n' ' ' </build/gpu.txt)); Qwen3.5 runs transformers' reference code" >&2; \
    fi

# ---------------------------------------------------------------- the runtime image
FROM ${BASE_IMAGE}
# A non-root user, uid 1000 (compose runs as the invoking user's uid instead: see compose.yaml).
# /cache holds the Hugging Face cache and the built-in assets (a named volume in compose);
# it and HOME are world-writable (sticky) so any --user uid can run the image.
RUN set -eu; \
    if ! id -u 1000 >/dev/null 2>&1; then \
        useradd --uid 1000 --user-group --no-create-home --shell /bin/bash searchr1; \
    fi; \
    mkdir -p /home/searchr1 /cache/huggingface /cache/searchr1 /workspace; \
    chmod 1777 /home/searchr1 /cache /cache/huggingface /cache/searchr1 /workspace
COPY --from=deps /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/searchr1 \
    HF_HOME=/cache/huggingface \
    SEARCHR1_CACHE=/cache/searchr1 \
    # Read by the CLI when this file exists (the project folder is mounted at /workspace);
    # otherwise the embedded offline default runs.
    SEARCHR1_CONFIG=/workspace/config.toml \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# The source last: a code change rebuilds only this small layer. Installed non-editable,
# without dependencies (already in /opt/venv) and without network.
COPY pyproject.toml README.md* /tmp/src/
COPY searchr1 /tmp/src/searchr1
RUN set -eu; \
    cd /tmp/src; \
    pip install --no-deps --no-index --no-build-isolation . >/dev/null; \
    cd /; rm -rf /tmp/src; \
    searchr1 plugins >/dev/null
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT ["searchr1"]
CMD ["--help"]
