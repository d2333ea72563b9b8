"""Our GRPO arithmetic against verl's own (``verl.trainer.ppo.core_algos``) on the same tensors: the local engine
and the verl engine must train the same objective."""

from __future__ import annotations

import numpy as np
import pytest
import torch

core = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed (pip install 'routerag[train]')")

from training.grpo import group_advantages, low_var_kl, policy_loss  # noqa: E402


def test_grpo_advantages_match_verl() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=g).round()
    rewards[4:8] = torch.tensor([0.3, 0.9, 0.1, 1.7])
    index = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 3 + ["d"])
    mask = torch.ones(12, 6)
    mask[:, 4:] = 0
    token_rewards = torch.zeros(12, 6)
    token_rewards[:, 3] = rewards  # verl sums the rewards over tokens
    theirs, _ = core.compute_grpo_outcome_advantage(token_rewards, mask, index, epsilon=1e-6,
                                                    norm_adv_by_std_in_grpo=True)
    ours = group_advantages(rewards, list(index)).unsqueeze(1) * mask
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_low_var_kl_matches_verl() -> None:
    g = torch.Generator().manual_seed(1)
    logp, ref = -torch.rand(4, 7, generator=g) * 5, -torch.rand(4, 7, generator=g) * 5
    assert torch.allclose(low_var_kl(logp, ref), core.kl_penalty(logp, ref, kl_penalty="low_var_kl"), atol=1e-6)


def test_clipped_policy_loss_matches_verl() -> None:
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(5, 9, generator=g) * 3
    new = old + (torch.rand(5, 9, generator=g) - 0.5) * 0.8  # ratios within [0.67, 1.5]: verl's dual clip (3) idle
    adv = torch.randn(5, 9, generator=g)
    mask = (torch.rand(5, 9, generator=g) > 0.3).float()
    ours, _ = policy_loss(new, old, adv, mask, clip=0.2)
    theirs = core.compute_policy_loss(old, new, adv, mask, cliprange=0.2, loss_agg_mode="token-mean")[0]
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
