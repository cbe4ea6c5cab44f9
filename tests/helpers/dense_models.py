"""Tiny random BERT-style sentence-transformers models, built in a test and loaded by path
(no hub): the ``dense`` provider's sentence-transformers path without a download."""

from __future__ import annotations

import re
from pathlib import Path


def tiny_sentence_model(folder: Path, texts: list[str], seed: int = 0, dim: int = 32) -> Path:
    """A one-layer random BERT over a word vocabulary of ``texts`` with mean pooling, saved
    as a sentence-transformers folder; another ``seed`` gives another model."""
    import torch
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers import models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = sorted({w for t in texts for w in re.findall(r"\w+", t.lower())})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    inner = folder / "transformer"
    inner.mkdir(parents=True, exist_ok=True)
    (inner / "vocab.txt").write_text("\n".join(vocab) + "\n", "utf-8")
    tokenizer = BertTokenizerFast(vocab_file=str(inner / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(seed)
    bert = BertModel(
        BertConfig(
            vocab_size=len(vocab),
            hidden_size=dim,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=2 * dim,
            max_position_embeddings=128,
        )
    )
    bert.save_pretrained(inner)
    tokenizer.save_pretrained(inner)
    model = SentenceTransformer(
        modules=[models.Transformer(str(inner), max_seq_length=128), models.Pooling(dim, "mean")],
        device="cpu",
    )
    model.save(str(folder))
    return folder
