"""From trajectories to training tensors: token ids, the loss mask (1 on tokens the policy wrote, 0 on the prompt and
on the information the loop appended) and per-token advantages, padded into micro-batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from routerag.policy.types import Trajectory


@dataclass(slots=True)
class TokenSequence:
    ids: list[int]
    mask: list[int]
    """Per token: 1 when the policy generated it (it gets gradient), 0 otherwise."""

    @property
    def policy_tokens(self) -> int:
        return sum(self.mask)


def trajectory_tokens(traj: Trajectory, max_tokens: int | None = None) -> TokenSequence:
    """The token sequence of a trajectory recorded by a token-tracking backend."""
    ids: list[int] = []
    mask: list[int] = []
    for seg in traj.segments:
        if seg.token_ids is None:
            raise ValueError("this trajectory has no token ids: train with a backend that tracks tokens")
        ids.extend(seg.token_ids)
        mask.extend([1 if seg.kind == "policy" else 0] * len(seg.token_ids))
    if max_tokens is not None and len(ids) > max_tokens:
        ids, mask = ids[:max_tokens], mask[:max_tokens]
    return TokenSequence(ids, mask)


@dataclass(slots=True)
class Batch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    loss_mask: torch.Tensor  # (B, T-1): aligned with next-token log-probabilities
    advantages: torch.Tensor  # (B, T-1)
    index: list[int]
    """Which sequences (positions in the caller's list) this batch holds."""


def collate(seqs: Sequence[TokenSequence], advantages: Sequence[float], index: Sequence[int], pad_id: int,
            device: torch.device | str = "cpu") -> Batch:
    """Right-padded batch. Position t of ``loss_mask``/``advantages`` refers to predicting token t+1."""
    width = max(len(s.ids) for s in seqs)
    n = len(seqs)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    adv = torch.zeros((n, width - 1), dtype=torch.float32)
    for row, (s, a) in enumerate(zip(seqs, advantages)):
        L = len(s.ids)
        ids[row, :L] = torch.tensor(s.ids, dtype=torch.long)
        attn[row, :L] = 1
        m = torch.tensor(s.mask[1:L], dtype=torch.float32)
        mask[row, : L - 1] = m
        adv[row, : L - 1] = float(a) * m
    return Batch(ids.to(device), attn.to(device), mask.to(device), adv.to(device), list(index))


def micro_batches(seqs: Sequence[TokenSequence], advantages: Sequence[float], size: int, pad_id: int,
                  device: torch.device | str = "cpu") -> list[Batch]:
    """Split into micro-batches of ``size`` sequences, grouping similar lengths to waste little padding."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids))
    out = []
    for start in range(0, len(order), size):
        idx = order[start : start + size]
        out.append(collate([seqs[i] for i in idx], [advantages[i] for i in idx], idx, pad_id, device))
    return out
