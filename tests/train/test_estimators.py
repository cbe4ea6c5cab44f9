"""Each ``[train]`` advantage estimator and loss aggregation, TRL's ``scale_rewards``, GSPO's
sequence-level ratio and ``mask_truncated_completions`` against the formula as verl and TRL
compute it, written out here in torch the way their code does (``compute_*_advantage``,
``agg_loss``, the policy losses; GRPOTrainer's advantages and ``_compute_loss``; neither is a
dependency), in float64 on random batches with groups of equal rewards, one-token responses and
masked observation tokens (positions inside a response that no loss reads: searchr1's search
results). The peer sees the batch as verl and TRL do: ``(B, L)`` matrices and a response mask.

searchr1's side runs its own path: the step's groups -> :func:`with_advantages` ->
:meth:`Batch.datums` (each datum's aggregation weight) -> the loss's per-position inputs as the
learner packs them (a micro-batch of all datums) -> the built-in loss, times ``1 / N``; the
learner's packing itself is checked in ``tests/local_model/test_learner_aggregation.py``.

Bounds. Advantages: both sides sum at most n terms of magnitude at most M (n the batch's
tokens, M = max |r| <= 1), so they differ by at most ``gamma_n * M`` per sum (Higham 4.2),
carried through at most four further roundings and divided by the smallest denominator d
either side uses (``eps`` for a std scale, ``sqrt(1e-8)`` for verl's whitening, 1 otherwise):
``4 * n * u * (M / d + max |A|)``. A group of equal rewards is where d matters: the peer's
``r - mean`` is a rounding residue over ``std + eps``, searchr1's an exact 0. Losses and
gradients: sums of at most a few hundred O(1) terms, within ``numerics.RTOL64`` of scale.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from numerics import RTOL64

from searchr1.core.config_schema import Config
from searchr1.core.step import aggregation_of
from searchr1.core.types import LossInputs, Question, RewardResult, ScoredGroup, Trajectory, Turn
from searchr1.plugins import losses
from searchr1.rl.step import Aggregation, Batch, with_advantages

U = 2.0**-53  # float64 unit roundoff
PROMPT = (1, 2, 3)
L = 9  # longest response of a test batch (positions after the prompt)
N_TOKENS = 64  # datums' limit
CLIP = 0.2


@dataclasses.dataclass
class Case:
    """A batch as searchr1 holds it (``groups``) and as a peer does (``mask``, ``old``, ``lp``,
    ``ref``: ``(B, L)``; ``rewards``: ``(B,)``; ``index``: each row's group)."""

    groups: list[ScoredGroup]
    rewards: torch.Tensor
    mask: torch.Tensor
    old: torch.Tensor
    lp: torch.Tensor
    ref: torch.Tensor
    truncated: torch.Tensor
    index: list[int]
    group_size: int


def make_case(seed: int, *, holes: bool = True, questions: int = 5, group_size: int = 4) -> Case:
    """Random groups: group 0 of equal rewards, group 1 of binary rewards, the rest shaped;
    responses of 1 to L positions (every group has a one-token one), some with masked
    observation positions inside, some truncated; peer-side garbage where no loss reads."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b = questions * group_size
    mask = torch.zeros(b, L, dtype=torch.float64)
    old = torch.randn(b, L, generator=gen, dtype=torch.float64) - 1.0  # garbage outside mask
    lp = old + (torch.rand(b, L, generator=gen, dtype=torch.float64) - 0.5) * 0.8
    ref = old + (torch.rand(b, L, generator=gen, dtype=torch.float64) - 0.5) * 0.8
    rewards, truncated, groups, index = [], [], [], []
    for q in range(questions):
        if q == 0:
            group_rewards = [0.7] * group_size
        elif q == 1:
            group_rewards = [float(rng.random() < 0.5) for _ in range(group_size)]
            group_rewards[0], group_rewards[1] = 1.0, 0.0
        else:
            group_rewards = [round(rng.uniform(-0.2, 1.0), 3) for _ in range(group_size)]
        trajectories = []
        for k, reward in enumerate(group_rewards):
            row = q * group_size + k
            n = 1 if k == 0 else rng.randint(1, L)
            sampled = [True] * n
            if holes and n >= 4 and rng.random() < 0.7:  # an observation inside the response
                start = rng.randint(1, n - 3)
                for j in range(start, start + rng.randint(1, 2)):
                    sampled[j] = False
            mask[row, :n] = torch.tensor(sampled, dtype=torch.float64)
            cut = k == group_size - 1 and q % 2 == 1
            truncated.append(cut)
            tokens = PROMPT + tuple(rng.randrange(4, 50) for _ in range(n))
            generated = (False,) * len(PROMPT) + tuple(sampled)
            lps = (0.0,) * len(PROMPT) + tuple(
                float(old[row, j]) if s else 0.0 for j, s in enumerate(sampled)
            )
            trajectories.append(
                Trajectory(
                    trajectory_id=f"q{q}/{k}",
                    question=f"q{q}",
                    golden_answers=("a",),
                    tokens=tokens,
                    generated_mask=generated,
                    logprobs=lps,
                    prompt_len=len(PROMPT),
                    turns=(Turn(sampled_tokens=tokens[len(PROMPT) :], text="", action="none"),),
                    end_reason="token_limit" if cut else "answered",
                    final_answer=None,
                    final_text="",
                    search_calls=0,
                    search_errors=0,
                )
            )
            rewards.append(reward)
            index.append(q)
        results = [RewardResult(reward=r) for r in group_rewards]
        zeros = (0.0,) * group_size
        question = Question(f"q{q}", f"q{q}", ("a",))
        groups.append(ScoredGroup(question, trajectories, results, zeros, False))
    return Case(
        groups,
        torch.tensor(rewards, dtype=torch.float64),
        mask,
        old,
        lp,
        ref,
        torch.tensor(truncated),
        index,
        group_size,
    )


def config(case: Case, **train: object) -> Config:
    return Config().replace(
        rollout={
            "questions_per_batch": len(case.groups),
            "group_size": case.group_size,
            "max_trajectory_tokens": 32,
        },
        train=train,
    )


def ours_advantages(case: Case, cfg: Config) -> torch.Tensor:
    groups = with_advantages(cfg, case.groups)
    return torch.tensor([a for g in groups for a in g.advantages], dtype=torch.float64)


def advantage_bound(peer: torch.Tensor, case: Case, d: float) -> float:
    n = float(case.mask.sum())
    return 4 * n * U * (1.0 / d + float(peer.abs().max()))


def row_values(peer_BL: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A per-token peer advantage as one value per row (checking it is constant on the mask)."""
    first = mask.argmax(dim=1)
    values = peer_BL[torch.arange(len(mask)), first]
    spread = ((peer_BL - values[:, None]) * mask).abs().max()
    assert float(spread) <= 1e-12 * max(1.0, float(values.abs().max()))
    return values


# ------------------------------------------------------------------ the peers' advantages


def token_level_rewards(case: Case) -> torch.Tensor:
    """verl's outcome reward: on the last response position the mask keeps."""
    out = torch.zeros_like(case.mask)
    last = case.mask.shape[1] - 1 - case.mask.flip(1).argmax(dim=1)
    out[torch.arange(len(out)), last] = case.rewards
    return out


def _by_group(scores: torch.Tensor, index: list[int]) -> dict[int, torch.Tensor]:
    groups: dict[int, list[torch.Tensor]] = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(scores[i])
    return {g: torch.stack(v) for g, v in groups.items()}


def verl_grpo(case: Case, eps: float, norm: bool) -> torch.Tensor:
    scores = token_level_rewards(case).sum(-1)
    groups = _by_group(scores, case.index)
    out = scores.clone()
    for i, g in enumerate(case.index):
        mean, std = torch.mean(groups[g]), torch.std(groups[g])
        out[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return out[:, None] * case.mask


def verl_rloo(case: Case) -> torch.Tensor:
    scores = token_level_rewards(case).sum(-1)
    groups = _by_group(scores, case.index)
    out = scores.clone()
    for i, g in enumerate(case.index):
        n = len(groups[g])
        out[i] = scores[i] * n / (n - 1) - torch.mean(groups[g]) * n / (n - 1)
    return out[:, None] * case.mask


def verl_opo(case: Case) -> torch.Tensor:
    lengths = case.mask.sum(-1)
    scores = token_level_rewards(case).sum(-1)
    s, n = _by_group(scores, case.index), _by_group(lengths, case.index)
    out = scores.clone()
    for i, g in enumerate(case.index):
        out[i] = scores[i] - (n[g] * s[g]).sum() / n[g].sum()
    return out[:, None] * case.mask


def verl_gpg(case: Case) -> torch.Tensor:
    scores = token_level_rewards(case).sum(-1)
    # verl divides in torch's default dtype (float32 here); the comparison is in float64
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1).double()
    groups = _by_group(scores, case.index)
    out = scores.clone()
    for i, g in enumerate(case.index):
        out[i] = alpha * (scores[i] - torch.mean(groups[g])) / 1.0
    return out[:, None] * case.mask


def verl_masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    def masked_mean(v: torch.Tensor) -> torch.Tensor:
        return (v * mask).sum() / (mask.sum() + 1e-8)

    mean = masked_mean(values)
    var = masked_mean((values - mean) ** 2) * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_reinforce_plus_plus(case: Case) -> torch.Tensor:
    rewards, returns, running = token_level_rewards(case), torch.zeros_like(case.mask), 0.0
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + 1.0 * running  # gamma = 1
        returns[:, t] = running
        running = running * case.mask[:, t]
    return verl_masked_whiten(returns, case.mask) * case.mask


def verl_reinforce_plus_plus_baseline(case: Case) -> torch.Tensor:
    scores = token_level_rewards(case).sum(-1)
    groups = _by_group(scores, case.index)
    centred = torch.stack([scores[i] - torch.mean(groups[g]) for i, g in enumerate(case.index)])
    tiled = centred[:, None].tile([1, case.mask.shape[1]]) * case.mask
    return verl_masked_whiten(tiled, case.mask) * case.mask


def trl_advantages(case: Case, scale_rewards: str) -> torch.Tensor:
    rewards, g = case.rewards, case.group_size
    mean = rewards.view(-1, g).mean(dim=1).repeat_interleave(g)
    if scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        std = rewards.view(-1, g).std(dim=1).repeat_interleave(g)
    advantages = rewards - mean
    return advantages / (std + 1e-4) if scale_rewards != "none" else advantages


# ------------------------------------------------------------------ advantages


VERL_ESTIMATORS = [
    ("grpo", {}, lambda c: verl_grpo(c, 1e-6, norm=False), 1.0),
    ("grpo", {"scale_rewards": "group"}, lambda c: verl_grpo(c, 1e-6, norm=True), 1e-6),
    ("grpo", {"scale_advantages_by_std": True}, lambda c: verl_grpo(c, 1e-6, True), 1e-6),
    ("rloo", {}, verl_rloo, 1.0),
    ("opo", {}, verl_opo, 1.0),
    ("gpg", {}, verl_gpg, 1.0),
    ("reinforce_plus_plus_baseline", {}, verl_reinforce_plus_plus_baseline, 1e-4),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("estimator", "settings", "peer", "d"),
    VERL_ESTIMATORS,
    ids=["grpo", "grpo_std", "grpo_std_old_key", "rloo", "opo", "gpg", "rpp_baseline"],
)
def test_advantages_equal_verl(seed, estimator, settings, peer, d) -> None:
    case = make_case(seed)
    want = row_values(peer(case), case.mask)
    got = ours_advantages(case, config(case, advantage_estimator=estimator, **settings))
    torch.testing.assert_close(got, want, rtol=0, atol=advantage_bound(want, case, d))
    if estimator in ("grpo", "rloo", "opo", "gpg"):  # the equal-reward group teaches nothing
        assert got[: case.group_size].tolist() == [0.0] * case.group_size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_plus_plus_equals_verl_on_responses_without_observations(seed) -> None:
    """verl's return restarts at every masked position; on a response the mask does not
    interrupt it is the reward on every token, which is what searchr1 whitens."""
    case = make_case(seed, holes=False)
    want = row_values(verl_reinforce_plus_plus(case), case.mask)
    got = ours_advantages(case, config(case, advantage_estimator="reinforce_plus_plus"))
    torch.testing.assert_close(got, want, rtol=0, atol=advantage_bound(want, case, 1e-4))


def test_reinforce_plus_plus_with_observations_whitens_the_reward_over_sampled_tokens() -> None:
    """With masked observation tokens every sampled token still carries the trajectory's
    reward (verl would give the turns before an observation a return of 0: docs/training.md),
    whitened with each trajectory weighing its sampled tokens, observations not counted."""
    case = make_case(3)
    tiled = case.rewards[:, None] * case.mask
    want = row_values(verl_masked_whiten(tiled, case.mask) * case.mask, case.mask)
    got = ours_advantages(case, config(case, advantage_estimator="reinforce_plus_plus"))
    torch.testing.assert_close(got, want, rtol=0, atol=advantage_bound(want, case, 1e-4))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_scale_rewards_equals_trl(seed, scale_rewards) -> None:
    case = make_case(seed)
    want = trl_advantages(case, scale_rewards)
    cfg = config(case, scale_rewards=scale_rewards, advantage_eps=1e-4)
    got = ours_advantages(case, cfg)
    torch.testing.assert_close(got, want, rtol=0, atol=advantage_bound(want, case, 1e-4))


def test_the_default_is_todays_grpo_with_weight_one() -> None:
    case = make_case(4)
    cfg = config(case)
    got = ours_advantages(case, cfg)
    for g, a in zip(case.groups, got.view(-1, case.group_size), strict=True):
        rewards = [r.reward for r in g.rewards]
        mean = sum(rewards) / len(rewards)
        spread = max(rewards) - min(rewards)
        assert a.tolist() == pytest.approx([r - mean if spread else 0.0 for r in rewards])
    batch = _batch(with_advantages(cfg, case.groups))
    assert {d.weight for d in batch.datums(N_TOKENS, aggregation=aggregation_of(cfg))} == {1.0}


# ------------------------------------------------------------------ losses


def _batch(groups: list[ScoredGroup]) -> Batch:
    return Batch(1, groups, groups, 0, {}, {}, 0, 0.0, [0] * len(groups))


def ours_loss(case: Case, cfg: Config, kl_coef: float, loss_name: str = "ppo") -> tuple:
    """searchr1's loss of the batch and its gradient as a ``(B, L)`` matrix."""
    groups = with_advantages(cfg, case.groups)
    datums = _batch(groups).datums(N_TOKENS, kl=kl_coef > 0, aggregation=aggregation_of(cfg))
    lp = case.lp.clone().requires_grad_(True)
    rows = {
        t.trajectory_id: i for i, t in enumerate(t for g in case.groups for t in g.trajectories)
    }
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("lp", "old", "adv", "ref", "w", "seq")}
    for s, d in enumerate(datums):
        row = rows[d.trajectory_id]
        cols = torch.tensor([j for j, m in enumerate(d.sampled) if m]) - (len(PROMPT) - 1)
        keep = torch.tensor(d.sampled)
        parts["lp"].append(lp[row, cols])
        parts["old"].append(torch.tensor(d.sampler_logprobs, dtype=torch.float64)[keep])
        parts["adv"].append(torch.tensor(d.advantages, dtype=torch.float64)[keep])
        parts["ref"].append(case.ref[row, cols])
        parts["w"].append(torch.full((len(cols),), d.weight, dtype=torch.float64))
        parts["seq"].append(torch.full((len(cols),), s, dtype=torch.long))
    cat = {k: torch.cat(v) for k, v in parts.items()}
    inputs = LossInputs(
        sampler_logprobs_T=cat["old"],
        advantages_T=cat["adv"],
        reference_logprobs_T=cat["ref"] if kl_coef > 0 else None,
        weights_T=cat["w"],
        sequence_T=cat["seq"],
    )
    loss_fn = cfg_loss(cfg, kl_coef, loss_name)
    trajectories = cfg.rollout.questions_per_batch * cfg.rollout.group_size
    loss = loss_fn(cat["lp"], inputs).loss / trajectories
    loss.backward()
    return loss.detach(), lp.grad


def cfg_loss(cfg: Config, kl_coef: float, loss_name: str) -> losses.NamedLoss:
    level = cfg.plugin_table("train", "loss").get("importance_sampling_level", "token")
    table = {"kl_coef": kl_coef, "clip_low": CLIP, "clip_high": CLIP}
    if level != "token":
        table["importance_sampling_level"] = level
    return loss_from(cfg, table, loss_name)


def loss_from(cfg: Config, table: dict, loss_name: str) -> losses.NamedLoss:
    from searchr1.core.plugins import load_registry

    cfg = dataclasses.replace(cfg, plugins={**cfg.plugins, "train.loss": table})
    return load_registry().create("loss_fn", loss_name, cfg)


#: verl's per-sequence token mean divides by ``n_i + 1e-8`` (TRL's by ``n_i``, as searchr1):
#: a relative difference of at most ``1e-8 / n_i <= 1e-8``, on top of the rounding bound
VERL_SEQ_MEAN_EPS = 1e-8


def assert_same(got: tuple, want: tuple, mask: torch.Tensor, rtol: float = RTOL64) -> None:
    """Loss within ``rtol`` of the peer's aggregate of its terms' magnitudes (the scale of a
    sum's rounding, and of a relative error in each term), each gradient entry within ``rtol``
    of the largest."""
    (loss, grad), (peer_loss, peer_grad, magnitude) = got, want
    torch.testing.assert_close(loss, peer_loss, rtol=0, atol=rtol * float(magnitude))
    scale = float(peer_grad.abs().max())
    assert scale > 0
    torch.testing.assert_close(grad * mask, peer_grad * mask, rtol=rtol, atol=rtol * scale)
    assert float((grad * (1 - mask)).abs().max()) == 0.0  # observations and padding: nothing


def verl_agg(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm: int) -> torch.Tensor:
    """verl's ``agg_loss`` over the whole batch (one data-parallel rank, one micro-batch)."""
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    seq = (loss_mat * mask).sum(dim=-1)
    if mode == "seq-mean-token-mean":
        seq = seq / (mask.sum(dim=-1) + 1e-8)
    elif mode == "seq-mean-token-sum-norm":
        seq = seq / norm
    return seq.sum() / loss_mat.shape[0]


def verl_loss(case: Case, advantages_BL, mode: str, kl_coef: float, loss_mode: str, norm: int):
    """verl's actor loss: the policy loss (vanilla PPO with its dual clip, CISPO or GSPO) and
    its KL loss (``low_var_kl``), each aggregated by ``agg_loss``."""
    lp = case.lp.clone().requires_grad_(True)
    log_ratio = lp - case.old
    if loss_mode == "gspo":
        seq = (log_ratio * case.mask).sum(-1) / case.mask.sum(-1).clamp(min=1)
        log_seq = lp - lp.detach() + seq.detach().unsqueeze(-1)
        ratio = torch.exp(torch.clamp(log_seq, max=10.0))
        pg = torch.maximum(-advantages_BL * ratio, -advantages_BL * ratio.clamp(1 - CLIP, 1 + CLIP))
        mode = "seq-mean-token-mean"
    else:
        ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
        if loss_mode == "cispo":
            pg = -ratio.clamp(1 - CLIP, 1 + CLIP).detach() * advantages_BL * lp
        else:
            pg1 = torch.maximum(
                -advantages_BL * ratio, -advantages_BL * ratio.clamp(1 - CLIP, 1 + CLIP)
            )
            pg = torch.where(advantages_BL < 0, torch.minimum(-advantages_BL * 3.0, pg1), pg1)
    loss = verl_agg(pg, case.mask, mode, norm)
    magnitude = verl_agg(pg.detach().abs(), case.mask, mode, norm)
    if kl_coef > 0:
        kl = torch.clamp(case.ref - lp, -20.0, 20.0)
        kld = torch.clamp(torch.exp(kl) - kl - 1, -10.0, 10.0)
        loss = loss + kl_coef * verl_agg(kld, case.mask, mode, norm)
        magnitude = magnitude + kl_coef * verl_agg(kld.detach().abs(), case.mask, mode, norm)
    loss.backward()
    return loss.detach(), lp.grad, magnitude


MODES = ["seq-mean-token-sum", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
@pytest.mark.parametrize("loss_name", ["ppo", "cispo"])
@pytest.mark.parametrize("mode", MODES)
def test_loss_agg_mode_equals_verl(seed, kl_coef, loss_name, mode) -> None:
    case = make_case(seed)
    cfg = config(case, loss_agg_mode=mode, loss_agg_tokens=L, scale_rewards="group")
    peer_adv = verl_grpo(case, 1e-6, norm=True)
    want = verl_loss(case, peer_adv, mode, kl_coef, loss_name, norm=L)
    rtol = RTOL64 + (VERL_SEQ_MEAN_EPS if mode == "seq-mean-token-mean" else 0.0)
    assert_same(ours_loss(case, cfg, kl_coef, loss_name), want, case.mask, rtol)


def trl_loss(case: Case, loss_type: str, beta: float, level: str, max_completion: int, mask_cut):
    """GRPOTrainer's loss over one generation batch on one process with no gradient
    accumulation: advantages with ``scale_rewards = "group"``, the clipped loss, its k3 KL."""
    mask = case.mask * (~case.truncated).unsqueeze(1) if mask_cut else case.mask
    advantages = trl_advantages(case, "group").unsqueeze(1)
    lp = case.lp.clone().requires_grad_(True)
    log_ratio = lp - case.old
    if level == "sequence":
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_w = log_ratio
    coef_1 = torch.exp(log_w)
    coef_2 = torch.clamp(coef_1, 1 - CLIP, 1 + CLIP)
    per_token = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if beta:
        per_token = per_token + beta * (torch.exp(case.ref - lp) - (case.ref - lp) - 1)

    def aggregate(per_token: torch.Tensor) -> torch.Tensor:
        if loss_type == "grpo":
            return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        if loss_type == "bnpo":
            return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        if loss_type == "dr_grpo":
            return (per_token * mask).sum() / (per_token.size(0) * max_completion)
        # dapo: the generation batch's tokens, gathered over the processes
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)

    loss = aggregate(per_token)
    loss.backward()
    return loss.detach(), lp.grad, aggregate(per_token.detach().abs())


#: TRL ``loss_type`` -> searchr1 ``loss_agg_mode`` (docs/training.md)
TRL_LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", list(TRL_LOSS_TYPES))
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mask_cut", [False, True], ids=["all", "mask_truncated"])
def test_trl_loss_type_equals_its_loss_agg_mode(seed, beta, loss_type, level, mask_cut) -> None:
    case = make_case(seed)
    train = {
        "loss_agg_mode": TRL_LOSS_TYPES[loss_type],
        "loss_agg_tokens": L,
        "scale_rewards": "group",
        "advantage_eps": 1e-4,
        "mask_truncated_completions": mask_cut,
    }
    cfg = config(case, **train)
    cfg = dataclasses.replace(
        cfg, plugins={**cfg.plugins, "train.loss": {"importance_sampling_level": level}}
    )
    want = trl_loss(case, loss_type, beta, level, L, mask_cut)
    got = ours_loss(case, cfg, beta)
    mask = case.mask * (~case.truncated).unsqueeze(1) if mask_cut else case.mask
    assert_same(got, want, mask)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_gspo_equals_verl(seed, kl_coef) -> None:
    case = make_case(seed)
    cfg = config(case, loss_agg_mode="seq-mean-token-mean", scale_rewards="group")
    cfg = dataclasses.replace(
        cfg, plugins={**cfg.plugins, "train.loss": {"importance_sampling_level": "sequence"}}
    )
    peer_adv = verl_grpo(case, 1e-6, norm=True)
    want = verl_loss(case, peer_adv, "seq-mean-token-mean", kl_coef, "gspo", norm=L)
    assert_same(ours_loss(case, cfg, kl_coef), want, case.mask, RTOL64 + VERL_SEQ_MEAN_EPS)


def test_sequence_ratio_is_one_value_per_datum_with_the_token_gradient() -> None:
    """GSPO's ratio: exp of the datum's mean log-ratio on each of its tokens; its gradient is
    that value times each token's own log-prob gradient (verl's stop-gradient form)."""
    lp = torch.tensor([-1.0, -2.0, -0.5, -3.0], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([-1.2, -1.9, -0.5, -2.0], dtype=torch.float64)
    inputs = LossInputs(
        old, torch.ones(4, dtype=torch.float64), sequence_T=torch.tensor([0, 0, 1, 1])
    )
    ratio = losses.importance_ratio(lp, inputs, "sequence")
    s0, s1 = math.exp((0.2 - 0.1) / 2), math.exp((0.0 - 1.0) / 2)
    want = torch.tensor([s0, s0, s1, s1], dtype=torch.float64)
    torch.testing.assert_close(ratio.detach(), want, rtol=1e-15, atol=0)
    ratio.sum().backward()
    torch.testing.assert_close(lp.grad, want, rtol=1e-15, atol=0)


def test_aggregation_weights_and_masking_of_a_small_batch() -> None:
    """Three trajectories of 1, 2 and 3 sampled tokens, N = 4: the weight each mode gives, and
    a truncated trajectory masked out of the datums and of token-mean's token count."""
    case = make_case(5, questions=2, group_size=2)
    lengths = [int(n) for n in case.mask.sum(-1)]
    t = sum(lengths)
    for mode, want in [
        ("seq-mean-token-sum", [1.0] * 4),
        ("token-mean", [4 / t] * 4),
        ("seq-mean-token-mean", [1 / n for n in lengths]),
        ("seq-mean-token-sum-norm", [1 / 7] * 4),
    ]:
        agg = Aggregation(mode, trajectories=4, norm_tokens=7)
        batch = _batch([dataclasses.replace(g, advantages=(1.0, -1.0)) for g in case.groups])
        assert [d.weight for d in batch.datums(N_TOKENS, aggregation=agg)] == pytest.approx(want)
    masked = Aggregation("token-mean", trajectories=4, norm_tokens=7, mask_truncated=True)
    batch = _batch([dataclasses.replace(g, advantages=(1.0, -1.0)) for g in case.groups])
    datums = batch.datums(N_TOKENS, aggregation=masked)
    cut = [
        t.trajectory_id for g in case.groups for t in g.trajectories if t.end_reason != "answered"
    ]
    assert cut and not {d.trajectory_id for d in datums} & set(cut)
    kept = sum(n for n, c in zip(lengths, case.truncated.tolist(), strict=True) if not c)
    assert [d.weight for d in datums] == pytest.approx([4 / kept] * len(datums))


@pytest.mark.slow
def test_the_tiny_model_trains_two_steps_with_the_non_default_settings(
    tmp_path, monkeypatch, config_file, run_cli
) -> None:
    """The whole loop with a batch estimator, token-mean, GSPO's ratio, masking and a KL
    term: two steps train (finite loss, trained tokens), on a real tiny model."""
    from cli_run import make_config, read_events
    from train_configs import TINY_TRAIN

    monkeypatch.chdir(tmp_path)
    train = {
        "max_steps": 2,
        "loss_fn": "ppo",
        "advantage_estimator": "reinforce_plus_plus_baseline",
        "loss_agg_mode": "token-mean",
        "mask_truncated_completions": True,
        "loss": {"importance_sampling_level": "sequence", "kl_coef": 0.01},
    }
    config = config_file(make_config(TINY_TRAIN, train=train))
    result = run_cli("train", "--config", config, "--run-dir", tmp_path / "run")
    assert result.code == 0, result.out + result.err
    steps = read_events(tmp_path / "run", "metrics")
    assert [e["step"] for e in steps] == [1, 2]
    for e in steps:
        assert math.isfinite(e["loss"]) and e["tokens/trained"] > 0
