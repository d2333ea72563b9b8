"""GRPO's arithmetic, as pure tensor functions shared by the local trainer (and checked against verl's
``core_algos`` on the same tensors).

* advantages: each rollout's reward minus its group's mean, divided by the group's (unbiased) standard deviation;
* policy loss: PPO's clipped ratio objective, token-mean over the policy's own tokens;
* KL to the reference policy: the low-variance estimator k3 = exp(ref − logp) − (ref − logp) − 1 (Schulman), the one
  verl calls ``low_var_kl``, with verl's clamps.
Information tokens (retrieved text the policy did not write) carry mask 0 everywhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch


def group_advantages(rewards: torch.Tensor, groups: Sequence[object], *, eps: float = 1e-6,
                     normalize_std: bool = True) -> torch.Tensor:
    """(r − mean of its group) / (std of its group + eps). A group of one is taken as mean 0, std 1 (so its
    advantage is its reward), as verl does."""
    rewards = rewards.float()
    out = torch.zeros_like(rewards)
    by_group: dict[object, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by_group[g].append(i)
    for idx in by_group.values():
        r = rewards[idx]
        if len(idx) == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = r.mean(), r.std()  # unbiased, as torch.std and verl
        out[idx] = (r - mean) / (std + eps) if normalize_std else r - mean
    return out


def informative_groups(rewards: torch.Tensor, groups: Sequence[int], *, tol: float = 1e-6) -> set[int]:
    """The groups whose rewards are not all equal: only they carry a policy gradient under group-normalised
    advantages (DAPO's filter; a group of one always counts, as its advantage is its reward)."""
    by_group: dict[int, list[float]] = defaultdict(list)
    for r, g in zip(rewards.tolist(), groups):
        by_group[g].append(r)
    return {g for g, rs in by_group.items() if len(rs) == 1 or max(rs) - min(rs) > tol}


def by_first_mode(first_modes: Sequence[str | None], rewards: Sequence[float],
                  advantages: Sequence[float]) -> dict[str, dict[str, float]]:
    """Rollouts, mean reward and mean advantage per first search's mode (``none``: no search). Why: the sign of a
    mode's mean advantage is where the update pushes the routing, so a drift toward one mode shows here first."""
    out: dict[str, dict[str, float]] = {}
    for mode in sorted({m or "none" for m in first_modes}):
        idx = [i for i, m in enumerate(first_modes) if (m or "none") == mode]
        out[mode] = {"n": len(idx), "reward": round(sum(rewards[i] for i in idx) / len(idx), 4),
                     "advantage": round(sum(advantages[i] for i in idx) / len(idx), 4)}
    return out


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def low_var_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π‖π_ref) per token, clamped as verl does (log-ratio to ±20, result to ±10)."""
    kl = (ref_logprob - logprob).clamp(-20, 20)
    return (torch.exp(kl) - kl - 1).clamp(-10, 10)


def policy_loss_tokens(logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor, *,
                       clip: float = 0.2) -> torch.Tensor:
    """PPO's clipped objective per token (to minimise): max(−A·ratio, −A·clip(ratio, 1 ± ε))."""
    ratio = torch.exp(logprob - old_logprob)
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip))


def policy_loss(logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                clip: float = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped objective (to minimise), token-mean over ``mask``. ``advantages`` is per token (a trajectory's
    advantage repeated over its tokens)."""
    ratio = torch.exp(logprob - old_logprob)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip, 1 + clip)
    loss = masked_mean(policy_loss_tokens(logprob, old_logprob, advantages, clip=clip), mask)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).float(), mask).item()
        approx_kl = masked_mean(old_logprob - logprob, mask).item()
    return loss, {"clipfrac": clipfrac, "ppo_kl": approx_kl}


def grpo_loss(logprob: torch.Tensor, old_logprob: torch.Tensor, ref_logprob: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, clip: float = 0.2,
              kl_coef: float = 0.001) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss + kl_coef · token-mean KL to the reference."""
    loss, stats = policy_loss(logprob, old_logprob, advantages, mask, clip=clip)
    if ref_logprob is not None and kl_coef > 0:
        kl = masked_mean(low_var_kl(logprob, ref_logprob), mask)
        loss = loss + kl_coef * kl
        stats["kl"] = kl.item()
    else:
        stats["kl"] = 0.0
    stats["pg_loss"] = loss.item()
    return loss, stats


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens < t) for every position after the first: logits (B, T, V), ids (B, T) → (B, T−1).

    ``logits`` may cover only the last K positions (a model called with ``logits_to_keep=K``); the earlier
    positions, which then carry no loss, come back as 0.
    """
    b, t = input_ids.shape
    k = logits.shape[1]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    tail = torch.gather(logp, 2, input_ids[:, t - k + 1 :].unsqueeze(-1)).squeeze(-1)
    if k == t:
        return tail
    return torch.cat([tail.new_zeros(b, t - k), tail], dim=1)


def first_loss_position(loss_mask: torch.Tensor) -> int:
    """The earliest position any row of the batch takes a loss at (0 when none does)."""
    cols = torch.nonzero(loss_mask.any(dim=0))
    return int(cols[0]) if len(cols) else 0
