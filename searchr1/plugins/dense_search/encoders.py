"""Text encoders of the ``dense`` provider: texts in, unit-length float32 vectors out.

Two kinds, chosen by the encoder name (``--encoder`` of ``searchr1 index build``): the static
``wordllama`` embeddings read from its wheel, and sentence-transformers models; each has a
probe vector the index card records (docs/retrieval.md).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ENCODER = "wordllama:l2_supercat"
WORDLLAMA_PREFIX = "wordllama:"
#: tokens of a text the static encoder averages (a passage of wiki-18 is ~100 words)
STATIC_MAX_TOKENS = 512
PROBE_TEXT = "searchr1 encoder probe: who wrote the little prince, and where was he born?"
#: smallest cosine between the card's probe vector and today's one that counts as "the same
#: encoder": GPU half precision vs CPU float32 moves it by ~1e-3, another model by far more
PROBE_MIN_COSINE = 0.99

E5_QUERY, E5_PASSAGE = "query: ", "passage: "
BGE_QUERY = "Represent this sentence for searching relevant passages: "


class EncoderError(ValueError):
    """An encoder that cannot be loaded; the message names it and says what to install."""


@dataclass(frozen=True)
class Prefixes:
    query: str = ""
    passage: str = ""


class Encoder(Protocol):
    name: str
    dim: int
    prefixes: Prefixes

    def encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        """``(len(texts), dim)`` float32 rows of unit length (the prefix added here)."""
        ...


def default_prefixes(name: str, prompts: dict[str, str] | None = None) -> Prefixes:
    """e5 -> ``query: `` / ``passage: ``; bge -> its query instruction; else the model's own
    ``query`` / ``passage`` (or ``document``) prompts; else none."""
    lowered = name.lower()
    if "e5" in lowered.replace("_", "-").split("/")[-1].split("-"):
        return Prefixes(E5_QUERY, E5_PASSAGE)
    if "bge" in lowered and "m3" not in lowered:
        return Prefixes(BGE_QUERY, "")
    prompts = prompts or {}
    return Prefixes(prompts.get("query", ""), prompts.get("passage", prompts.get("document", "")))


def _unit_rows(x: np.ndarray) -> np.ndarray:
    import numpy as np

    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class StaticEncoder:
    """Mean of static token embeddings (wordllama's matrix); see the module docstring."""

    def __init__(self, name: str):
        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = name[len(WORDLLAMA_PREFIX) :] or "l2_supercat"
        spec = importlib.util.find_spec("wordllama")  # finds the files without importing it
        if spec is None or not spec.submodule_search_locations:
            raise EncoderError(
                f"encoder {name!r} needs the wordllama package (its wheel holds the weights): "
                "pip install 'searchr1[dense]'"
            )
        root = Path(next(iter(spec.submodule_search_locations)))
        weights = sorted((root / "weights").glob(f"{config}_*.safetensors"))
        tokenizer = root / "tokenizers" / f"{config}_tokenizer_config.json"
        if not weights or not tokenizer.is_file():
            raise EncoderError(
                f"encoder {name!r}: the installed wordllama has no {config} weights/tokenizer "
                f"in {root}; the wheel ships l2_supercat ({DEFAULT_ENCODER!r})"
            )
        tensors = load_file(str(weights[-1]))
        self.embedding = np.ascontiguousarray(next(iter(tensors.values())), dtype=np.float32)
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(STATIC_MAX_TOKENS)
        self.name = name
        self.dim = int(self.embedding.shape[1])
        self.prefixes = Prefixes()

    def encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        vocab = self.embedding.shape[0]
        for row, enc in enumerate(self.tokenizer.encode_batch(texts, add_special_tokens=False)):
            ids = np.asarray(enc.ids, dtype=np.int64)
            ids = ids[(ids >= 0) & (ids < vocab)]
            if ids.size:
                out[row] = self.embedding[ids].mean(axis=0)
        return _unit_rows(out)


class SentenceTransformerEncoder:
    """A sentence-transformers model with its retrieval prefixes; GPU when present."""

    def __init__(self, name: str, batch_size: int = 64):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise EncoderError(
                f"encoder {name!r} needs sentence-transformers: pip install 'searchr1[dense]'"
            ) from None
        import torch

        from searchr1.kit.hub import hub_path
        from searchr1.sdk import ConfigValueError

        device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.model = SentenceTransformer(hub_path(name, "encoder", "it"), device=device)
        except ConfigValueError as exc:  # the hub is out of reach and the model not cached
            raise EncoderError(str(exc)) from None
        except (OSError, ValueError) as exc:
            raise EncoderError(
                f"encoder {name!r} could not be loaded ({str(exc).splitlines()[0][:200]}); "
                "give a local model folder or a name already in the Hugging Face cache"
            ) from None
        if device == "cuda":
            self.model.half()
        self.name = name
        size = getattr(self.model, "get_embedding_dimension", None) or (
            self.model.get_sentence_embedding_dimension  # sentence-transformers < 6
        )
        dim = size()
        if dim is None:
            raise EncoderError(f"encoder {name!r}: the model does not say its embedding size")
        self.dim = int(dim)
        self.prefixes = default_prefixes(name, dict(getattr(self.model, "prompts", {}) or {}))
        self.batch_size = batch_size

    def encode(self, texts: list[str], *, query: bool) -> np.ndarray:
        prefix = self.prefixes.query if query else self.prefixes.passage
        vectors = self.model.encode(
            [prefix + t for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return _unit_rows(vectors)


def load_encoder(name: str, prefixes: Prefixes | None = None) -> Encoder:
    """The encoder called ``name``; ``prefixes`` (from an index card) replace the defaults."""
    name = name.strip() or DEFAULT_ENCODER
    encoder: Encoder
    if name.startswith(WORDLLAMA_PREFIX):
        encoder = StaticEncoder(name)
    else:
        encoder = SentenceTransformerEncoder(name)
    if prefixes is not None:
        encoder.prefixes = prefixes
    return encoder


def probe_vector(encoder: Encoder) -> list[float]:
    """The encoder's vector of :data:`PROBE_TEXT` (as a query), for the index card."""
    return [round(float(v), 6) for v in encoder.encode([PROBE_TEXT], query=True)[0]]


def probe_cosine(encoder: Encoder, recorded: list[float]) -> float:
    """Cosine between ``recorded`` and the encoder's probe vector now (-1 when the sizes
    differ)."""
    import numpy as np

    now = np.asarray(probe_vector(encoder), dtype=np.float64)
    then = np.asarray(recorded, dtype=np.float64)
    if now.shape != then.shape:
        return -1.0
    denom = float(np.linalg.norm(now) * np.linalg.norm(then)) or 1.0
    return float(now @ then) / denom
