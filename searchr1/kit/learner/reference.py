"""The reference policy of the KL term (``[train.loss] kl_coef``): the policy as RL began.

The learner scores the sampled tokens under it with the same frozen base weights as the
policy, never a second copy of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

#: the file beside a checkpoint's adapter that holds the pinned reference
REFERENCE_FILE = "kl_reference.pt"


class ReferencePolicy:
    """The weights the KL term compares the policy with (module docstring)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._pinned: list[torch.Tensor] | None = None

    @property
    def pinned(self) -> bool:
        return self._pinned is not None

    def pin(self) -> None:
        """The current adapter becomes the reference (a copy of its trainable tensors; under
        FSDP a collective, whole on every rank)."""
        from searchr1.kit.learner.fsdp import whole

        self._pinned = [whole(p.detach()).clone() for p in self._params]

    @contextmanager
    def active(self) -> Iterator[None]:
        """The model computes the reference policy inside (the caller holds the model lock
        and runs no backward inside)."""
        if self._pinned is None:
            disable = getattr(self.model, "disable_adapter", None)
            if disable is None:
                raise ValueError(
                    "[train.loss] kl_coef > 0: the reference policy is the base model with the "
                    f"LoRA adapter disabled, but {type(self.model).__name__} is not a peft "
                    "model and no reference was pinned"
                )
            with disable():
                yield
            return
        from searchr1.kit.learner.fsdp import is_sharded, shard_of

        with torch.no_grad():
            # in place, into what the forward reads: under FSDP this rank's shard (FSDP
            # gathers from it), else the parameter itself
            tensors = [p.to_local() if is_sharded(p) else p.data for p in self._params]
            kept = [t.clone() for t in tensors]
            for p, t, full in zip(self._params, tensors, self._pinned, strict=True):
                t.copy_(shard_of(full, p) if is_sharded(p) else full)
            try:
                yield
            finally:
                for t, k in zip(tensors, kept, strict=True):
                    t.copy_(k)

    def save(self, folder: str) -> None:
        """Write the pinned reference into ``folder`` (nothing when none is pinned)."""
        if self._pinned is not None:
            with (Path(folder) / REFERENCE_FILE).open("wb") as fh:
                torch.save([t.cpu() for t in self._pinned], fh)

    def load(self, folder: str) -> None:
        """The reference :meth:`save` left in ``folder``; none there: the adapter disabled."""
        file = Path(folder) / REFERENCE_FILE
        if not file.is_file():
            self._pinned = None
            return
        saved = torch.load(file, weights_only=True)
        if len(saved) != len(self._params) or any(
            t.shape != p.shape for t, p in zip(saved, self._params, strict=False)
        ):
            raise ValueError(
                f"{file}: the saved KL reference does not fit this model's LoRA adapter "
                f"([lora] rank or target_modules changed since it was saved?)"
            )
        self._pinned = [t.to(p.device, p.dtype) for t, p in zip(saved, self._params, strict=True)]
