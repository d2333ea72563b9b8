"""The local trainer's reward path: each stage's :class:`~training.rewards.RewardConfig` (its preset with
``train.reward_overrides`` laid over it) and the inputs its parts need, taken from the training items and the
trainer's own retriever and reader, so every part of the reward library can be selected from the settings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from routerag.config import Loop, TrainConfig
from routerag.datasets import QAItem
from routerag.policy.answering import Reader
from routerag.policy.types import Generator, SearchBackend, Trajectory
from routerag.vocabulary import Mode

from .baseline import baseline_reader, naive_rag_answer
from .rewards import GainBeyondRAG, RewardBreakdown, RewardConfig, Rollout, batch_rewards


class StageRewards:
    """Scores a step's rollouts with the reward of its stage (stage 1 up to ``switch_step``, then stage 2)."""

    def __init__(self, cfg: TrainConfig, loop: Loop, *, embed: Callable[[list[str]], np.ndarray] | None = None,
                 baseline: Callable[[str], str | None] | None = None,
                 cost_table: dict[str, float] | None = None) -> None:
        self.cfg = cfg
        self.loop = loop
        self.embed = embed
        """The retriever's query encoder (the duplicate-query penalty)."""
        self.gain = GainBeyondRAG(baseline) if baseline is not None else None
        """Naive RAG's answer per question, computed once (Gain Beyond RAG)."""
        self.cost_table = cost_table
        self.configs = {1: RewardConfig.preset(cfg.stage1_reward, cfg.reward_overrides),
                        2: RewardConfig.preset(cfg.stage2_reward, cfg.reward_overrides)}
        """Both stages' configs, built (and so checked) before the first step."""

    def stage(self, step: int) -> int:
        return 1 if step <= self.cfg.switch_step else 2

    def config(self, step: int) -> RewardConfig:
        return self.configs[self.stage(step)]

    def inputs(self, rcfg: RewardConfig, items: Sequence[QAItem]) -> dict[str, Any]:
        """What ``rcfg``'s parts read besides the rollouts, for rollouts of ``items`` (one item per rollout)."""
        needs = rcfg.needs()
        out: dict[str, Any] = {}
        if "questions" in needs:
            out["questions"] = [it.question for it in items]
        if "gold_titles" in needs:
            out["gold_titles"] = [[g.title for g in it.supporting] for it in items]
        if "embed" in needs:
            out["embed"] = _required(self.embed, "the duplicate-query penalty needs the retriever's query encoder")
        if "gain_beyond_rag" in needs:
            out["gain_beyond_rag"] = _required(self.gain, "Gain Beyond RAG needs a naive-RAG baseline")
        if "cost_table" in needs:
            out["cost_table"] = _required(self.cost_table, "time_cost='table' needs the measured cost table")
        return out

    def score(self, step: int, items: Sequence[QAItem], trajectories: Sequence[Trajectory]
              ) -> tuple[list[Rollout], list[RewardBreakdown]]:
        """The rollouts of ``trajectories`` (``items[i]`` asked the i-th) and their rewards at ``step``."""
        rcfg = self.config(step)
        rollouts = [Rollout.from_trajectory(t) for t in trajectories]
        rewards = batch_rewards(rollouts, [it.answers for it in items], rcfg, budget=self.loop.budget,
                                **self.inputs(rcfg, items))
        return rollouts, rewards

    def needs(self, name: str, steps: int) -> bool:
        """Whether a run of ``steps`` steps reads ``name`` (a :meth:`RewardConfig.needs` input) at either end."""
        return any(name in self.config(s).needs() for s in (1, steps))


def naive_rag_baseline(reader: Reader, policy: Generator, search: SearchBackend, *, mode: Mode,
                       k: int) -> Callable[[str], str | None]:
    """A synchronous naive-RAG baseline for :class:`~training.rewards.GainBeyondRAG` (the local trainer scores
    between rollouts, outside an event loop): the question's top ``k`` in ``mode``, read by the rollouts' reader."""
    read = baseline_reader(reader, policy)

    def answer(question: str) -> str | None:
        return asyncio.run(naive_rag_answer(read, search, question, mode=mode, k=k))

    return answer


def _required(value: Any, message: str) -> Any:
    if value is None:
        raise ValueError(message)
    return value
