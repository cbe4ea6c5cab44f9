"""Model paths: :func:`model_path` resolves a ``[model] base_model`` value, where a ``.gguf``
file (llama.cpp's format) becomes a ``from_pretrained``-loadable folder, converted once into
the cache (:func:`convert_gguf`), so every provider loads it like any Hugging Face checkpoint.
Built-in assets that ship a GGUF file (e.g. ``builtin:smollm2-135m-instruct``) call the same
function from their builder.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path

from searchr1.sdk import Asset, ConfigValueError, cache_dir, ensure_built, resolve_asset

#: What to install when the ``gguf`` reader is missing.
GGUF_EXTRA = "pip install 'searchr1[real-model]'  (brings the gguf package)"
#: bump when the converted folder changes
GGUF_VERSION = "1"


def model_path(spec: str, assets: Mapping[str, Asset]) -> str:
    """A real path for a model ``spec``: the folder of a ``builtin:`` asset of ``assets`` (the
    run's: ``config.assets``), the folder a ``.gguf`` file converts to (once; an edited or
    replaced file is converted again), else ``spec``."""
    if not spec.lower().endswith(".gguf"):
        return resolve_asset(spec, assets)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path.suffix} file {str(path)!r} does not exist")
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{GGUF_VERSION}"
    folder = cache_dir() / f"gguf-{path.stem}-{sha256(key.encode()).hexdigest()[:12]}"
    takes = f"about {_seconds_to_convert(st.st_size)} on 2 idle CPU cores"
    asset = Asset(GGUF_VERSION, lambda tmp: convert_gguf(path, tmp), takes=takes)
    ensure_built(folder, asset, f"{path} (converted for transformers)")
    return str(folder)


def _seconds_to_convert(size: int) -> str:
    """About how long converting a GGUF file of ``size`` bytes takes: SmolLM2-135M's 93 MB
    Q4_1 file takes ~30 s on 2 cores (dequantizing and writing fp32)."""
    seconds = max(10, round(size / 93e6 * 30, -1))
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def convert_gguf(gguf_file: Path, folder: Path, *, field: str = "model.base_model") -> None:
    """Write tokenizer, config and fp32 safetensors of ``gguf_file`` into ``folder``.

    ``folder`` is a temporary one the cache renames into place only when this returns.
    ``field`` names the config setting in errors."""
    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise ConfigValueError(f"{field}: GGUF file {str(gguf_file)!r} does not exist")
    try:
        import gguf  # noqa: F401  (transformers imports it lazily; fail here with the fix)
    except ImportError as exc:
        raise ConfigValueError(
            f"{field} = {str(gguf_file)!r} is a GGUF file, and reading it needs the gguf "
            f"package: {GGUF_EXTRA}"
        ) from exc
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    parent, name = gguf_file.parent, gguf_file.name
    try:
        with _bar_as_transformers_bars():
            tokenizer = AutoTokenizer.from_pretrained(parent, gguf_file=name)
            config = AutoConfig.from_pretrained(parent, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(
                parent, gguf_file=name, dtype=torch.float32
            )
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigValueError(
            f"{field} = {str(gguf_file)!r}: transformers cannot read this GGUF file "
            f"({type(exc).__name__}: {exc}); its architecture or quantization may be "
            f"unsupported (pip install -U transformers gguf)"
        ) from exc
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    if getattr(model, "generation_config", None) is not None:
        # The GGUF's sampling hints are llama.cpp's, not ours: the provider passes every
        # sampling parameter explicitly.
        model.generation_config.do_sample = False
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@contextmanager
def _bar_as_transformers_bars() -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bar, which ignores transformers' progress
    bar setting (off when stderr is not a terminal: :mod:`searchr1.cli.main`); while reading,
    that bar follows the setting too."""
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as transformers_logging

    bar = getattr(reader, "tqdm", None)
    if bar is None or transformers_logging.is_progress_bar_enabled():
        yield
        return
    reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar
