"""The reward library: pure functions of a finished rollout and its gold answers, composed by a :class:`RewardConfig`.

The same code scores rollouts in the local GRPO trainer and in the verl plug-in. Parts:

* correctness: EM, F1 or GenAcc (``routerag.metrics``);
* retrieval outcome: a gold answer (any alias) appears in a document the rollout retrieved, at any search, or the
  recall of the gold supporting passages by title; combined with correctness by ``max`` or a weighted sum. It is a
  dense signal of *routing* where a small model cannot yet read the answer out (in the spirit of s3's Gain Beyond
  RAG, which credits the searcher for what its documents let a reader answer);
* format: ±w for answering in the required tags without invalid turns or forcing;
* RouteRAG stage 2 efficiency (batch level): R = EM if EM = 0, else EM + (s̄ − sᵢ), with sᵢ = min(0.5·tᵢ/T, 0.5),
  tᵢ the rollout's retrieval cost and T the batch's 95th percentile of it. The cost is the measured time
  (RouteRAG), or each search's per-mode median from a table measured in isolation (``time_cost="table"``), which
  keeps the ~15 ms between modes from drowning in timing noise on shared cores;
* "Learning When to Search" retrieval-count reward (β = 0.3, RC = number of retrievals): stage 1 rewards trying
  when wrong (−1 + β·RC, kept negative), stage 2 charges retrievals when right (1 − β·RC);
* duplicate-query penalty: mean pairwise cosine of the rollout's queries;
* s3's Gain Beyond RAG: GenAcc(policy) − GenAcc(naive top-3 RAG on the same question, cached);
* a FrugalRAG-style stop reward: stop as soon as the evidence is complete;
* EVO-RAG's refusal reward: a refusal scores +0.5 when no retrieved document holds a gold answer, −0.5 when one
  does (:func:`refusal_reward`); it takes the place of the refused rollout's correctness.

A refused rollout's answer (:data:`~routerag.prompts.REFUSAL_ANSWER`) is never scored as an answer: its EM, F1 and
GenAcc are 0 whatever the configuration.

The presets ``routerag-stage1`` (EM) and ``routerag-stage2`` (EM + time efficiency) reproduce RouteRAG;
``outcome-stage1`` (EM + 0.5 × the answer found in the documents: a right reader scores 1.5, found evidence alone
0.5) and ``outcome-stage2`` (the same + time efficiency over the cost table, paid to every rollout above 0) are the
CPU recipe's; ``outcome-stage2-em`` pays the time term only to right answers, as RouteRAG does;
``refusal-stage1`` and ``refusal-stage2`` are RouteRAG's two with EVO-RAG's refusal reward.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from graph_index.config import closest_name
from routerag.config import LOOP_DEFAULTS
from routerag.metrics import answer_in_documents, exact_match, f1, gen_acc
from routerag.policy.types import Summary, Trajectory  # light: the retriever's value types, not the retriever


@dataclass(slots=True)
class Rollout:
    """What a reward may look at: a trajectory's :class:`~routerag.policy.types.Summary` as flat JSON (it travels
    through verl's ``extra_fields``)."""

    answer: str | None
    searches: int = 0
    retrieval_ms: float = 0.0
    format_ok: bool = False
    queries: list[str] = field(default_factory=list)
    step_titles: list[list[str]] = field(default_factory=list)
    """Titles retrieved by each search, in order."""
    modes: list[str] = field(default_factory=list)
    """The retrieval mode of each search, in order (what a cost table prices)."""
    documents: list[str] = field(default_factory=list)
    """Every distinct document retrieved, as "title text", in retrieval order (what the retrieval outcome reads)."""
    refused: bool = False
    """The policy refused on its own (``<answer> [refuse] </answer>``): ``answer`` is no answer to score."""
    question: str | None = None
    """The question, when the trainer records it (verl's agent loop does): what Gain Beyond RAG's baseline
    answers when no ``questions`` are passed to :func:`batch_rewards`."""
    gold_titles: list[str] = field(default_factory=list)
    """The question's gold supporting titles, when the trainer records them (verl's agent loop does, from the
    dataset row): what support recall and the stop reward read when no ``gold_titles`` are passed."""
    baseline_answer: str | None = None
    """Naive RAG's answer to the same question by the same reader (:mod:`training.baseline`), when the trainer
    recorded it (verl's agent loop, for Gain Beyond RAG)."""

    @classmethod
    def from_summary(cls, summary: Summary) -> Rollout:
        searches = summary.searches
        return cls(answer=summary.answer, searches=len(searches), retrieval_ms=summary.retrieval_ms,
                   format_ok=bool(summary.format_ok), queries=[s.query for s in searches if s.query],
                   step_titles=[list(s.doc_titles) for s in searches], modes=[s.mode for s in searches],
                   documents=list(dict.fromkeys(f"{d.title} {d.text}" for d in summary.documents)),
                   refused=summary.refused)

    @property
    def scored_answer(self) -> str | None:
        """The answer the correctness metrics read: None for a refusal (it scores 0, it is not a wrong guess)."""
        return None if self.refused else self.answer

    @classmethod
    def from_trajectory(cls, traj: Trajectory) -> Rollout:
        return cls.from_summary(traj.summary())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any] | str) -> Rollout:
        if isinstance(d, str):
            d = json.loads(d)
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# -- single rewards ------------------------------------------------------------------------------------------------

CORRECTNESS: dict[str, Callable[[str | None, Sequence[str]], float]] = {"em": exact_match, "f1": f1,
                                                                        "genacc": gen_acc}


def format_reward(rollout: Rollout, weight: float = 1.0) -> float:
    """+weight for a well-formed rollout (answered in tags on its own), −weight otherwise."""
    return weight if rollout.format_ok else -weight


def support_recall(rollout: Rollout, gold_titles: Sequence[str]) -> float:
    """Share of the gold supporting titles among every title the rollout retrieved (0 without gold titles)."""
    gold = {" ".join(t.split()).lower() for t in gold_titles}
    if not gold:
        return 0.0
    seen = {" ".join(t.split()).lower() for titles in rollout.step_titles for t in titles}
    return len(gold & seen) / len(gold)


def table_cost(rollout: Rollout, table: dict[str, float]) -> float:
    """The rollout's retrieval cost priced by a per-mode table (ms per search): Σ table[mode] over its searches."""
    missing = sorted(set(rollout.modes) - set(table))
    if missing:
        raise ValueError(f"the retrieval cost table has no entry for mode(s) {', '.join(missing)}")
    return float(sum(table[m] for m in rollout.modes))


def routerag_time_efficiency(correct: Sequence[float], retrieval_ms: Sequence[float], *,
                             percentile: float = 95.0, scale: float = 0.5,
                             paid: Sequence[bool] | None = None) -> list[float]:
    """RouteRAG's stage-2 reward for a batch: EM when wrong, else EM + (s̄ − sᵢ).

    sᵢ = min(scale·tᵢ/T, scale) with T the batch ``percentile`` of retrieval time, so sᵢ and s̄ lie in [0, 0.5];
    a batch that never retrieved (T = 0) gets no efficiency term. ``paid`` says which rollouts earn the term
    (default: those whose ``correct`` is above 0; RouteRAG's EM = 1 when ``correct`` is EM).
    """
    t = np.asarray(retrieval_ms, dtype=np.float64)
    em = np.asarray(correct, dtype=np.float64)
    if len(t) == 0:
        return []
    big_t = float(np.percentile(t, percentile))
    s = np.minimum(scale * t / big_t, scale) if big_t > 0 else np.zeros_like(t)
    bonus = s.mean() - s
    gate = [e > 0 for e in em] if paid is None else list(paid)
    return [float(e + b) if g else float(e) for e, b, g in zip(em, bonus, gate, strict=True)]


def retrieval_count_reward(correct: bool, retrievals: int, stage: Literal[1, 2], *, beta: float = 0.3,
                           negative_cap: float = -0.1, correct_floor: float = 0.1) -> float:
    """"Learning When to Search": stage 1 (fix under-retrieval) gives 1 when right and −1 + β·RC, capped at
    ``negative_cap``, when wrong, so trying helps but never pays as much as being right; stage 2 (fix
    over-retrieval) gives 1 − β·RC, floored at ``correct_floor``, when right, so every retrieval costs but a right
    answer still beats a wrong one (−1)."""
    if stage == 1:
        return 1.0 if correct else min(-1.0 + beta * retrievals, negative_cap)
    return max(1.0 - beta * retrievals, correct_floor) if correct else -1.0


def duplicate_query_penalty(queries: Sequence[str], embed: Callable[[list[str]], np.ndarray]) -> float:
    """Mean pairwise cosine of the rollout's queries (0 for fewer than two): asking the same thing twice costs."""
    if len(queries) < 2:
        return 0.0
    v = np.asarray(embed(list(queries)), dtype=np.float64)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    pairs = list(itertools.combinations(range(len(queries)), 2))
    return float(np.mean([v[i] @ v[j] for i, j in pairs]))


class GainBeyondRAG:
    """s3's reward: GenAcc of the rollout's answer minus GenAcc of naive RAG (top-3 retrieval of the question, then
    the same answer generator), the baseline computed once per question and cached."""

    def __init__(self, baseline: Callable[[str], str | None], cache: dict[str, str | None] | None = None) -> None:
        self.baseline = baseline
        self.cache: dict[str, str | None] = cache if cache is not None else {}

    def baseline_answer(self, question: str) -> str | None:
        if question not in self.cache:
            self.cache[question] = self.baseline(question)
        return self.cache[question]

    def __call__(self, rollout: Rollout, question: str, golds: Sequence[str]) -> float:
        return gain_over_naive_rag(rollout.scored_answer, self.baseline_answer(question), golds)


def gain_over_naive_rag(answer: str | None, baseline: str | None, golds: Sequence[str]) -> float:
    """GenAcc of ``answer`` minus GenAcc of naive RAG's ``baseline`` answer (a refusal's answer scores 0)."""
    return gen_acc(answer, golds) - gen_acc(baseline, golds)


def frugal_stop_reward(rollout: Rollout, gold_titles: Sequence[str], budget: int) -> float:
    """FrugalRAG-style: reward stopping once the gold evidence is in hand. 1 − (searches after full coverage) /
    budget when every gold title was retrieved; −1 when the rollout stopped early without it; 0 when it used the
    whole budget without finding it."""
    gold = {t.lower() for t in gold_titles}
    if not gold:
        return 0.0
    seen: set[str] = set()
    covered_at = None
    for i, titles in enumerate(rollout.step_titles, 1):
        seen |= {t.lower() for t in titles}
        if covered_at is None and gold <= seen:
            covered_at = i
    if covered_at is None:
        return 0.0 if rollout.searches >= budget else -1.0
    return 1.0 - (rollout.searches - covered_at) / max(budget, 1)


REFUSAL_JUSTIFIED = 0.5
"""EVO-RAG's refusal reward when no retrieved document holds a gold answer: below a right answer (1), above a wrong
one (0), so refusing beats guessing only where the evidence is missing."""
REFUSAL_UNJUSTIFIED = -0.5
"""EVO-RAG's refusal penalty when a retrieved document holds a gold answer: below a wrong answer (0), so refusing
with the evidence in hand is worse than trying to read it."""


def refusal_reward(rollout: Rollout, golds: Sequence[str], correct: float) -> float:
    """EVO-RAG's refusal reward (Ji et al., "Curriculum-Guided Reinforcement Learning for Efficient Multi-Hop
    Retrieval-Augmented Generation", arXiv:2505.17391): the agent may refuse, and a refusal is judged by the evidence.

    * refused, and no retrieved document holds a gold answer (any alias, as a whole-token span): +0.5
      (:data:`REFUSAL_JUSTIFIED`);
    * refused although a retrieved document holds one: −0.5 (:data:`REFUSAL_UNJUSTIFIED`);
    * refused without searching: 0, as a wrong answer (no evidence was looked at, so none can justify it, and a
      policy must not learn that refusing at once pays);
    * answered: ``correct``, the usual correctness.

    EVO-RAG scores refusal per step, weighted inside a seven-part reward; this is its outcome form, one reward per
    rollout for GRPO. The constants are ours, not the paper's: they keep the order right answer (1) > justified
    refusal > wrong answer (0) > unjustified refusal."""
    if not rollout.refused:
        return correct
    if rollout.searches == 0:
        return 0.0
    return REFUSAL_UNJUSTIFIED if answer_in_documents(rollout.documents, golds) else REFUSAL_JUSTIFIED


# -- composition ---------------------------------------------------------------------------------------------------


class RewardConfig(BaseModel):
    """Which parts make the reward, and their weights. ``total = correctness-or-efficiency + Σ weighted parts``.

    A trainer takes a preset per stage (``train.stage1_reward``, ``train.stage2_reward``) with the fields of
    ``train.reward_overrides`` laid over both (:meth:`preset`), and passes :func:`batch_rewards` what the chosen
    parts need (:meth:`needs`): the questions and gold supporting titles of its items, its retriever's query
    encoder, naive RAG's answers."""

    model_config = ConfigDict(extra="forbid")

    stage: Literal[1, 2] = 1
    correctness: Literal["em", "f1", "genacc"] = "em"
    retrieval: Literal["none", "answer", "support"] = "none"
    """Retrieval outcome: ``answer`` (a gold alias appears in a retrieved document) or ``support`` (recall of the
    gold supporting titles); ``none`` leaves correctness alone."""
    retrieval_combine: Literal["max", "sum"] = "max"
    """How the retrieval outcome joins correctness: ``max`` (a right answer or found evidence both score 1, so a
    reader's failure does not punish a good search) or ``sum`` (correctness + ``retrieval_weight`` × outcome)."""
    retrieval_weight: float = Field(0.5, ge=0)
    refusal: bool = False
    """EVO-RAG's refusal reward (:func:`refusal_reward`) in place of a refused rollout's correctness; off: a refusal
    scores as a wrong answer (0)."""
    efficiency: Literal["none", "routerag_time", "retrieval_count"] = "none"
    """``routerag_time``: RouteRAG's batch-centred time reward (replaces plain correctness); ``retrieval_count``:
    the staged retrieval-count reward (replaces it too)."""
    beta: float = Field(0.3, ge=0)
    format_weight: float = Field(0.0, ge=0)
    """Adds ± this for a well-formed rollout (:func:`format_reward`)."""
    duplicate_weight: float = Field(0.0, ge=0)
    """Subtracts this × the duplicate-query penalty (:func:`duplicate_query_penalty`: the mean pairwise cosine of
    the rollout's queries, 1 for a query asked twice). Needs ``embed``: the trainers pass their retriever's query
    encoder (verl's reward function the embedder of ``train.verl``'s launch)."""
    gain_beyond_rag_weight: float = Field(0.0, ge=0)
    """Adds this × s3's Gain Beyond RAG (:func:`gain_over_naive_rag`: GenAcc of the answer minus GenAcc of naive RAG,
    the question's top ``k`` documents in ``retrieval.mode`` read by the same reader). Needs the questions and
    the baseline: the local trainer computes it once per question (:mod:`training.baseline`), verl's agent loop
    records it in each rollout."""
    stop_weight: float = Field(0.0, ge=0)
    """Adds this × the FrugalRAG-style stop reward (:func:`frugal_stop_reward`: 1 − searches after the gold
    evidence was complete / budget; −1 for stopping without it). Needs the gold supporting titles (questions
    without them score 0) and the loop's budget."""
    time_percentile: float = Field(95.0, gt=0, le=100)
    time_scale: float = Field(0.5, ge=0, le=1)
    """The most RouteRAG's time term takes from a right answer (its ``sᵢ`` cap; RouteRAG: 0.5). Lower it where the
    modes' costs differ a lot, so a cheaper mode cannot outweigh a right answer's spread in a group."""
    time_cost: Literal["measured", "table"] = "measured"
    """What the time-efficiency term charges: the measured retrieval time (RouteRAG) or each search's per-mode
    median from a cost table measured in isolation (pass ``cost_table`` to :func:`batch_rewards`)."""
    efficiency_paid: Literal["correct", "answer"] = "correct"
    """Which rollouts RouteRAG's time term pays: ``correct``, every rollout whose correctness (with the retrieval
    outcome, when one is combined) is above 0; ``answer``, only rollouts whose answer is right (RouteRAG: EM = 1),
    so found-but-misread evidence earns no bonus for a cheap route (docs/training.md, the 18-step runs)."""

    @classmethod
    def preset(cls, name: str, overrides: Mapping[str, Any] | None = None) -> RewardConfig:
        """The preset ``name`` with ``overrides`` (field → value, e.g. ``{"stop_weight": 0.2}``) laid over it,
        validated as one config."""
        presets = {
            "routerag-stage1": cls(stage=1, correctness="em", efficiency="none"),
            "routerag-stage2": cls(stage=2, correctness="em", efficiency="routerag_time"),
            "count-stage1": cls(stage=1, correctness="em", efficiency="retrieval_count"),
            "count-stage2": cls(stage=2, correctness="em", efficiency="retrieval_count"),
            "outcome-stage1": cls(stage=1, correctness="em", retrieval="answer", retrieval_combine="sum",
                                  efficiency="none"),
            "outcome-stage2": cls(stage=2, correctness="em", retrieval="answer", retrieval_combine="sum",
                                  efficiency="routerag_time", time_cost="table"),
            "outcome-stage2-em": cls(stage=2, correctness="em", retrieval="answer", retrieval_combine="sum",
                                     efficiency="routerag_time", time_cost="table", efficiency_paid="answer"),
            "refusal-stage1": cls(stage=1, correctness="em", efficiency="none", refusal=True),
            "refusal-stage2": cls(stage=2, correctness="em", efficiency="routerag_time", refusal=True),
        }
        if name not in presets:
            raise ValueError(f"unknown reward preset {name!r}; choose {', '.join(presets)}")
        if not overrides:
            return presets[name]
        for key in overrides:
            if key not in cls.model_fields:
                near = closest_name(key, cls.model_fields)
                raise ValueError(f"train.reward_overrides: {key!r} is no reward setting"
                                 + (f" (did you mean {near!r}?)" if near else ""))
        return cls.model_validate({**presets[name].model_dump(), **overrides})

    def needs(self) -> frozenset[str]:
        """The :func:`batch_rewards` arguments the chosen parts read: ``questions``, ``gold_titles``, ``embed``,
        ``gain_beyond_rag``, ``cost_table``."""
        need = {"gold_titles"} if self.retrieval == "support" or self.stop_weight else set()
        if self.duplicate_weight:
            need.add("embed")
        if self.gain_beyond_rag_weight:
            need |= {"questions", "gain_beyond_rag"}
        if self.time_cost == "table":
            need.add("cost_table")
        return frozenset(need)


@dataclass(slots=True)
class RewardBreakdown:
    total: float
    parts: dict[str, float]


def batch_rewards(
    rollouts: Sequence[Rollout],
    golds: Sequence[Sequence[str]],
    cfg: RewardConfig,
    *,
    questions: Sequence[str] | None = None,
    gold_titles: Sequence[Sequence[str]] | None = None,
    budget: int = LOOP_DEFAULTS.budget,
    embed: Callable[[list[str]], np.ndarray] | None = None,
    gain_beyond_rag: GainBeyondRAG | None = None,
    cost_table: dict[str, float] | None = None,
) -> list[RewardBreakdown]:
    """Score a batch (batch-level parts, like RouteRAG's time reward, need the whole batch). ``cost_table``: ms per
    search of each mode, for ``time_cost="table"``. ``questions``, ``gold_titles`` and naive RAG's answers default
    to what each rollout recorded (:attr:`Rollout.question`, :attr:`~Rollout.gold_titles`,
    :attr:`~Rollout.baseline_answer`); :meth:`RewardConfig.needs` says which arguments a config reads."""
    if gold_titles is None and any(r.gold_titles for r in rollouts):
        gold_titles = [r.gold_titles for r in rollouts]
    answer_score, found, correct = _correctness(cfg, rollouts, golds, gold_titles)
    em = [exact_match(r.scored_answer, g) for r, g in zip(rollouts, golds)]
    if cfg.time_cost == "table":
        if cost_table is None:
            raise ValueError("time_cost='table' needs a cost_table (ms per search of each mode)")
        cost = [table_cost(r, cost_table) for r in rollouts]
    else:
        cost = [r.retrieval_ms for r in rollouts]
    if cfg.efficiency == "routerag_time":
        paid = [a > 0 for a in answer_score] if cfg.efficiency_paid == "answer" else None
        base = routerag_time_efficiency(correct, cost, percentile=cfg.time_percentile, scale=cfg.time_scale,
                                        paid=paid)
    elif cfg.efficiency == "retrieval_count":
        base = [retrieval_count_reward(c > 0, r.searches, cfg.stage, beta=cfg.beta) for c, r in zip(correct, rollouts)]
    else:
        base = list(correct)
    out = []
    for i, r in enumerate(rollouts):
        parts = {"correctness": correct[i], "em": em[i], "base": base[i], "searches": float(r.searches),
                 "retrieval_ms": r.retrieval_ms, "cost_ms": cost[i]}
        if found:
            parts["answer"] = answer_score[i]
            parts["retrieval_outcome"] = found[i]
        if cfg.refusal:
            parts["refused"] = float(r.refused)
        extra = _weighted_parts(cfg, r, golds[i], questions[i] if questions is not None else r.question,
                                gold_titles[i] if gold_titles is not None else None, budget=budget, embed=embed,
                                gain=gain_beyond_rag)
        parts.update({name: value for name, (value, _) in extra.items()})
        total = base[i]
        for _, weighted in extra.values():
            total += weighted
        out.append(RewardBreakdown(total=float(total), parts=parts))
    return out


def _correctness(cfg: RewardConfig, rollouts: Sequence[Rollout], golds: Sequence[Sequence[str]],
                 gold_titles: Sequence[Sequence[str]] | None) -> tuple[list[float], list[float], list[float]]:
    """Each rollout's answer score (with the refusal reward, if chosen), retrieval outcome (empty: none chosen) and
    the two combined: the correctness the efficiency terms start from."""
    score = CORRECTNESS[cfg.correctness]
    answer_score = [score(r.scored_answer, g) for r, g in zip(rollouts, golds, strict=True)]
    if cfg.refusal:
        answer_score = [refusal_reward(r, g, a) for r, g, a in zip(rollouts, golds, answer_score)]
    found: list[float] = []
    if cfg.retrieval == "answer":
        found = [answer_in_documents(r.documents, g) for r, g in zip(rollouts, golds)]
    elif cfg.retrieval == "support":
        if gold_titles is None:
            raise ValueError("the support-recall outcome needs the gold supporting titles")
        found = [support_recall(r, t) for r, t in zip(rollouts, gold_titles, strict=True)]
    if not found:
        return answer_score, found, answer_score
    if cfg.retrieval_combine == "max":
        return answer_score, found, [max(a, f) for a, f in zip(answer_score, found)]
    return answer_score, found, [a + cfg.retrieval_weight * f for a, f in zip(answer_score, found)]


def _weighted_parts(cfg: RewardConfig, r: Rollout, golds: Sequence[str], question: str | None,
                    gold_titles: Sequence[str] | None, *, budget: int,
                    embed: Callable[[list[str]], np.ndarray] | None,
                    gain: GainBeyondRAG | None) -> dict[str, tuple[float, float]]:
    """The optional parts of one rollout's reward: name → (value, what it adds to the total)."""
    parts: dict[str, tuple[float, float]] = {}
    if cfg.format_weight:
        value = format_reward(r, cfg.format_weight)
        parts["format"] = (value, value)
    if cfg.duplicate_weight:
        if embed is None:
            raise ValueError("the duplicate-query penalty needs an embed function")
        value = duplicate_query_penalty(r.queries, embed)
        parts["duplicate"] = (value, -cfg.duplicate_weight * value)
    if cfg.gain_beyond_rag_weight:
        if gain is not None and question is not None:
            value = gain(r, question, golds)
        elif r.baseline_answer is not None:
            value = gain_over_naive_rag(r.scored_answer, r.baseline_answer, golds)
        else:
            raise ValueError("Gain Beyond RAG needs its baseline and the questions")
        parts["gain_beyond_rag"] = (value, cfg.gain_beyond_rag_weight * value)
    if cfg.stop_weight:
        if gold_titles is None:
            raise ValueError("the stop reward needs the gold supporting titles")
        value = frugal_stop_reward(r, gold_titles, budget)
        parts["stop"] = (value, cfg.stop_weight * value)
    return parts
