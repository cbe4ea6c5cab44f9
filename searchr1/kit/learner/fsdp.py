"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the local provider under torchrun:
``[model.local] fsdp = true``.

Each rank then holds ``1 / N`` of the decoder's weights (every decoder layer is its own
FSDP unit, the decoder's embeddings and final norm the root's), the LoRA parameters and
AdamW moments included, instead of a whole copy. The learner's forward all-gathers one
layer at a time and frees it again, and backward reduce-scatters the gradients (summed
over the ranks: the loss is already scaled by the whole batch's ``1 / N``), so the update
equals the one-process update, as with the data-parallel all-reduce it replaces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from searchr1.sdk import get_logger


def is_sharded(t: Any) -> bool:
    """Whether ``t`` is a DTensor (a parameter, gradient or moment FSDP shards)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def max_over_ranks(values: Sequence[int], device: torch.device) -> list[int]:
    """Each of ``values``' largest value over the ranks of the default process group (a
    collective: every rank calls it at the same point)."""
    import torch.distributed as dist

    from searchr1.sdk import collective

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    box = torch.tensor(list(values), dtype=torch.int64, device=device)
    collective(dist.all_reduce, box, dist.ReduceOp.MAX, size=dist.get_world_size())
    return [int(v) for v in box.tolist()]


class Sharding:
    """The FSDP2 units of one peft model and which phase they are in (module docstring).

    ``group``: with lockstep sampling, the process group of the model's own collectives
    (FSDP's gathers and reductions, and :class:`Lockstep`'s agreement), apart from the
    default group that the train loop's collectives use; None: FSDP on the default group,
    the weights gathered whole for sampling."""

    def __init__(self, units: Sequence[Any], group: Any = None) -> None:
        self.units = list(units)
        self.group = group
        self.sampling = False

    @property
    def lockstep(self) -> bool:
        """Whether the rollout samples the sharded model in lockstep (no gather)."""
        return self.group is not None

    def for_sampling(self) -> None:
        """Gather every unit's whole weights and keep them through the rollout (a
        collective: every rank calls it at the same point); with lockstep sampling the
        weights stay sharded and nothing happens."""
        if self.sampling or self.lockstep:
            return
        for unit in self.units:
            unit.unshard()
            unit.set_reshard_after_forward(False)
        self.sampling = True

    def for_learning(self) -> None:
        """Free the gathered weights: forwards gather one unit at a time again (local)."""
        if not self.sampling:
            return
        for unit in self.units:
            unit.set_reshard_after_forward(True)
            unit.reshard()
        self.sampling = False


class Lockstep:
    """Sampling forwards of a sharded model in step over the ranks of ``group`` (default:
    the default process group), so its weights stay sharded while sampling.

    Every forward of an FSDP2 model all-gathers each unit's weights: a collective that
    every rank must enter. So before each of its forwards (a prefill chunk, a decoding step)
    a rank with work calls :meth:`before_forward`, and a rank without work calls
    :meth:`drain` or, in a session, :meth:`agree` (0): each all-reduces a "working" flag
    (and whether this rank's session is :attr:`open`), and while some rank works, a rank
    without work runs a one-token forward (:meth:`idle_forward`) to join its gathers. The
    ranks' forwards thus pair up one to one, whatever each decodes; every rank's
    :meth:`drain` returns together, at the first flag round in which no rank works (as
    ``generate(synced_gpus=True)`` in transformers). Costs one all-reduce of two integers
    per forward beside the gathers, and each gather is the one unit's, not the whole
    model's.

    A session (the sampler's worker thread serving the rollout, the local sampler's
    ``begin_session``) keeps going while any rank's session is :attr:`open` or any rank
    works, polling every :attr:`poll_s` while none works; it ends on every rank in the same
    round.
    """

    #: seconds between two flag rounds of a session in which no rank works
    poll_s = 0.002

    def __init__(
        self, model: Any, device: torch.device, pad_token_id: int, group: Any = None
    ) -> None:
        self.model = model
        self.device = device
        self.pad_token_id = pad_token_id
        self.group = group
        #: whether this rank's session may still get work (set by the sampler's owner)
        self.open = False
        self.idle_forwards = 0  # forwards run only to join another rank's (tests, benches)

    def before_forward(self) -> None:
        """Called by a rank with work right before each forward it runs."""
        self.agree(1)

    def drain(self) -> None:
        """Join the other ranks' forwards until none has work left (a collective)."""
        while self.agree(0)[0]:
            self.idle_forward()

    def agree(self, working: int) -> tuple[int, int]:
        """How many ranks will run a forward of their own next, and how many sessions are
        still open (a collective)."""
        import torch.distributed as dist

        from searchr1.sdk import collective

        size = dist.get_world_size(self.group)
        box = torch.tensor([working, int(self.open)], dtype=torch.int64, device=self.device)
        collective(dist.all_reduce, box, dist.ReduceOp.SUM, self.group, size=size)
        working_ranks, open_ranks = box.tolist()
        return int(working_ranks), int(open_ranks)

    def idle_forward(self) -> None:
        """A forward only to join the working ranks' gathers."""
        # one pad token, no cache: the same units gathered in the same order as any forward
        ids = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        self.model(input_ids=ids, use_cache=False, logits_to_keep=1)
        self.idle_forwards += 1


def shard_model(model: Any, device: torch.device, lockstep: bool = False) -> Sharding:
    """Apply ``fully_shard`` to each decoder layer of the peft ``model`` (LoRA already
    attached), then to the decoder as the root unit; gradients are summed, not averaged.
    ``lockstep``: the units live on a process group of their own (:class:`Sharding`), made
    here (a collective: every rank calls it at the same point)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # the transformers CausalLM under peft's wrapper (chunked_logprobs.causal_lm, which
    # imports this module)
    decoder = model.get_base_model().get_decoder()
    dtype = next(decoder.parameters()).dtype
    policy = MixedPrecisionPolicy()
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    lists = [m for m in decoder.modules() if isinstance(m, torch.nn.ModuleList)]
    layers = max(lists, key=len) if lists else []  # the decoder layers
    group = mesh = None
    if lockstep:
        from torch.distributed.device_mesh import DeviceMesh

        # the sampler's worker thread gathers on it while the main thread runs the train
        # loop's collectives on the default group: two threads must not share a group
        group = dist.new_group(backend="nccl" if device.type == "cuda" else "gloo")
        mesh = DeviceMesh.from_group(group, device.type)
    units = [fully_shard(layer, mesh=mesh, mp_policy=policy) for layer in layers]
    units.append(fully_shard(decoder, mesh=mesh, mp_policy=policy))
    for unit in units:
        # the learner scales the loss by the whole batch (1 / N), so the ranks' gradients
        # add up to the one-process gradient; FSDP's default averages them
        unit.set_gradient_divide_factor(1.0)
        # a plain SUM collective (gloo has no pre-multiplied sum; multiplying by 1 is exact)
        unit.set_force_sum_reduction_for_comms(True)
        if lockstep:
            # FSDP allocates a unit's whole-weight tensors at its first gather and refills
            # them in place at every later one: made under the sampler's inference mode
            # they would be inference tensors, which the learner cannot fill. One unit at a
            # time: the peak is one unit's weights.
            unit.unshard()
            unit.reshard()
    get_logger().info(
        "fsdp_sharded",
        units=len(units),
        mixed_precision=policy.param_dtype is not None,
        sampling="lockstep" if lockstep else "gather",
        message=f"FSDP2: {len(units) - 1} decoder layers and the decoder root sharded over "
        "the ranks; "
        + ("sharded while sampling, in lockstep" if lockstep else "whole again while sampling")
        + " (see fsdp.py)",
    )
    return Sharding(units, group)


def shard_of(full: torch.Tensor, like: Any) -> torch.Tensor:
    """This rank's piece of ``full`` as the DTensor ``like`` lays it out (no communication:
    every rank holds ``full``)."""
    from torch.distributed.tensor import distribute_tensor

    piece = distribute_tensor(
        full.to(like.device, like.dtype), like.device_mesh, like.placements, src_data_rank=None
    )
    return piece.to_local()


def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole (a collective for a DTensor: every rank calls it)."""
    return t.full_tensor() if is_sharded(t) else t


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded moment gathered whole, on the CPU: the
    same layout as a one-process run's, so either can resume the other (a collective)."""
    state = optimizer.state_dict()
    return {
        "state": {
            index: {k: whole(v).detach().cpu().clone() for k, v in entry.items()}
            for index, entry in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, params: Sequence[Any], saved: Mapping[str, Any]
) -> None:
    """Load a whole optimizer state (:func:`full_optimizer_state`, or a one-process run's)
    into ``optimizer`` over the sharded ``params``: each moment becomes this rank's shard."""
    optimizer.load_state_dict(saved)
    for p in params:
        entry = optimizer.state.get(p)
        if not entry or not is_sharded(p):
            continue
        for key, value in entry.items():
            if torch.is_tensor(value) and value.shape == p.shape and not is_sharded(value):
                from torch.distributed.tensor import DTensor

                entry[key] = DTensor.from_local(
                    shard_of(value, p),
                    p.device_mesh,
                    p.placements,
                    run_check=False,
                    shape=p.shape,
                    stride=p.stride(),
                )
