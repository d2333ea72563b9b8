"""The local GRPO engine: one machine, CPU or one GPU, and the CI path.

Each step samples ``group_size`` rollouts for ``batch_size`` questions through the same policy loop the server runs
(the generator shares the model being trained), scores them with the reward library (stage 1 until
``switch_step``, then stage 2), normalises advantages within each question's group, and updates the policy with
PPO's clipped ratio loss plus a low-variance KL to the reference policy, on the policy's own tokens only.
Checkpoints are written atomically and a run resumes from its latest one; every step appends a JSON line of
metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from routerag.config import GeneratorConfig, Settings, TrainConfig
from routerag.datasets import QAItem
from routerag.policy import LoopConfig, PolicyLoop, Trajectory
from routerag.policy.backends import reader_model, rollout_generator
from routerag.policy.card import PolicyCard, card_for, training_policy
from routerag.policy.search import LocalSearch
from routerag.retrieval import Retriever

from .checkpoints import resume_checkpoint, save_checkpoint
from .costs import load_or_measure
from .grpo import (
    by_first_mode,
    first_loss_position,
    group_advantages,
    informative_groups,
    low_var_kl,
    policy_loss_tokens,
    token_logprobs,
)
from .models import is_peft, load_policy, reference_policy
from .rewards import RewardConfig
from .sequences import Batch, TokenSequence, micro_batches, trajectory_tokens
from .trainer_rewards import StageRewards, naive_rag_baseline
from .trunk import UpdateForward

log = logging.getLogger(__name__)

METRICS = "metrics.jsonl"


class LocalGRPOTrainer:
    passes: UpdateForward | None = None
    """The update's forward passes: the frozen layers below the adapter once per micro-batch, the vocabulary only at
    loss positions (None: the model's whole forward passes)."""
    _passes_checked = False

    def __init__(self, settings: Settings, index: str | Path, items: Sequence[QAItem], out: str | Path, *,
                 model: Any = None, tokenizer: Any = None, retriever: Retriever | None = None,
                 device: str | None = None) -> None:
        self.settings = settings
        self.cfg: TrainConfig = settings.train
        self.items = list(items)
        if not self.items:
            raise ValueError("no training questions")
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        random.seed(self.cfg.seed)
        torch.manual_seed(self.cfg.seed)
        if model is None:
            model, tokenizer = load_policy(self.cfg, device=self.device)
        self.model, self.tokenizer = model, tokenizer
        self.reference = None
        if not is_peft(self.model) and self.cfg.kl_coef > 0:
            import copy

            self.reference = copy.deepcopy(self.model).eval()  # full fine-tuning: keep a frozen copy
            for p in self.reference.parameters():
                p.requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        self._choose_passes()
        self.optimizer = torch.optim.AdamW(params, lr=self.cfg.lr)
        served = settings.policy.generator
        # rollouts sample in float32 whatever the served precision: their log-probabilities are recomputed by the torch
        # model, and the engine's copy is refreshed by writing float32 weights into it (WeightPatch)
        gen_cfg = GeneratorConfig(model=self.cfg.model, temperature=self.cfg.temperature, max_batch=32,
                                  engine=served.engine, precision="float32")
        # stage 2 rewards retrieval time: with isolate_retrieval a search never runs while a generation batch holds
        # the cores, so the time rewarded is the search's own, not whatever the model was doing meanwhile
        exclusive = threading.Lock() if self.cfg.isolate_retrieval else None
        # rollouts decode on the fast engine where it runs (its copy of the weights is refreshed after every
        # optimiser step); the log-probabilities of the update are the torch model's own, as verl's actor computes
        self.generator = rollout_generator(self.cfg.rollout_engine, gen_cfg, model=self.model,
                                           tokenizer=self.tokenizer, exclusive=exclusive,
                                           export_dir=self.out / "engine")
        self.retriever = retriever or Retriever(index, settings.retrieval)
        # the loop of the policy being trained: [train]'s settings, else [policy]'s, else the warm start's card; the
        # reader the policy will be served with reads in the rollouts too, so the reward sees what a user gets
        self.policy = training_policy(settings)
        loop_cfg = LoopConfig.from_policy(settings.policy, self.policy, temperature=self.cfg.temperature,
                                          answer_generator=reader_model(self.policy.reader, self.generator,
                                                                        settings.policy.answer_generator))
        self.loop = PolicyLoop(self.generator, LocalSearch(self.retriever, exclusive=exclusive), loop_cfg)
        self.step = 0
        self._order: list[int] = []
        self.cost_table: dict[str, Any] | None = None
        # the reward of each stage, with what its parts read: the retriever's query encoder, naive RAG's answers
        self.rewards = StageRewards(
            self.cfg, self.policy.loop, embed=self.retriever.embed,
            baseline=naive_rag_baseline(loop_cfg.reader, self.generator, self.loop.search,
                                        mode=settings.retrieval.mode, k=self.policy.loop.k))
        if self.rewards.needs("cost_table", self.cfg.steps):
            queries = [it.question for it in self.items[:20]]
            self.cost_table = load_or_measure(self.out, self.retriever, queries, self.policy.loop.k)
            self.rewards.cost_table = self.cost_table["ms"]
            log.info("retrieval cost table (ms per search): %s", self.cost_table["ms"])
        self._resume()
        if self.step and getattr(self.generator, "refresh", None) is not None:
            self.generator.refresh()  # the engine's copy was exported before the checkpoint's weights were loaded

    @classmethod
    def update_only(cls, cfg: TrainConfig, model: Any, tokenizer: Any) -> LocalGRPOTrainer:
        """The update machinery alone, without rollouts, retriever or engine (tests/test_trunk.py,
        benchmarks/grpo_update_bench.py); its passes follow ``cfg.update_passes`` as the whole trainer's do."""
        trainer = cls.__new__(cls)
        trainer.cfg, trainer.model, trainer.tokenizer, trainer.device, trainer.reference = (cfg, model, tokenizer,
                                                                                             "cpu", None)
        trainer.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
        trainer._choose_passes()
        return trainer

    def _choose_passes(self) -> None:
        # LoRA on the top layers only: the frozen layers below run once for the policy and its reference
        if self.reference is None and self.cfg.update_passes == "split":
            self.passes = UpdateForward.of(self.model)

    def card(self) -> PolicyCard:
        """What the trained policy expects of the loop that serves it (written beside every checkpoint)."""
        c = self.cfg
        return card_for(self.policy, {"by": "routerag train (local GRPO)", "model": c.model,
                                      "init_adapter": c.init_adapter, "step": self.step, "steps": c.steps,
                                      "switch_step": c.switch_step, "stage1_reward": c.stage1_reward,
                                      "stage2_reward": c.stage2_reward, "questions": len(self.items)})

    # -- the schedule ----------------------------------------------------------------------------------------------

    def stage(self, step: int) -> int:
        return self.rewards.stage(step)

    def reward_config(self, step: int) -> RewardConfig:
        return self.rewards.config(step)

    def _batch_items(self, step: int) -> list[QAItem]:
        """Questions for ``step``: a fixed shuffled order, cycled (so a resumed run continues the same sequence)."""
        if not self._order:
            rng = random.Random(self.cfg.seed)
            self._order = list(range(len(self.items)))
            rng.shuffle(self._order)
        n = self.cfg.batch_size
        start = ((step - 1) * n) % len(self._order)
        idx = [self._order[(start + j) % len(self._order)] for j in range(n)]
        return [self.items[i] for i in idx]

    # -- one step --------------------------------------------------------------------------------------------------

    def train(self) -> list[dict[str, Any]]:
        history = []
        while self.step < self.cfg.steps:
            metrics = self.train_step(self.step + 1)
            history.append(metrics)
            if self.step % self.cfg.save_every == 0 or self.step == self.cfg.steps:
                self.save_checkpoint()
        return history

    def rollouts(self, items: Sequence[QAItem]) -> list[Trajectory]:
        """``group_size`` trajectories per question, all in flight together (the generator batches them)."""
        async def go() -> list[Trajectory]:
            tasks = [self.loop.run(it.question) for it in items for _ in range(self.cfg.group_size)]
            return await asyncio.gather(*tasks)

        self.model.eval()
        return asyncio.run(go())

    def _prompt_reads(self) -> tuple[int, int] | None:
        """llama.cpp's counters (prompt tokens asked for, and read): how many its kept sequences saved."""
        engine = getattr(self.generator, "engine", None)
        if engine is None or not hasattr(engine, "read_tokens"):
            return None
        return engine.prompt_tokens, engine.read_tokens

    def train_step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        items = self._batch_items(step)
        before = self._prompt_reads()
        trajs = self.rollouts(items)
        t_roll = time.perf_counter() - t0
        after = self._prompt_reads()
        read_stats = ({"prompt_tokens": after[0] - before[0], "prompt_tokens_read": after[1] - before[1]}
                      if after is not None and before is not None else {})
        groups = [i for i in range(len(items)) for _ in range(self.cfg.group_size)]
        rollouts, rewards = self.rewards.score(step, [items[g] for g in groups], trajs)
        totals = torch.tensor([r.total for r in rewards], dtype=torch.float32)
        adv = group_advantages(totals, groups).tolist()
        seqs = [trajectory_tokens(t, self.policy.loop.max_total_tokens + 4096) for t in trajs]
        kept = informative_groups(totals, groups) if self.cfg.filter_groups else set(groups)
        t1 = time.perf_counter()
        stats = self.update(seqs, adv, groups, kept)
        t_update = time.perf_counter() - t1
        t2 = time.perf_counter()
        refresh = getattr(self.generator, "refresh", None)
        if refresh is not None and stats["updates"]:  # the engine decodes a copy of the weights: give it the new ones
            refresh()
        t_refresh = time.perf_counter() - t2
        self.step = step
        modes = Counter(m for r in rollouts for m in r.modes)
        n_search = sum(modes.values())
        metrics = {
            "step": step, "stage": self.stage(step), "reward_preset": self.cfg.stage1_reward if self.stage(step) == 1
            else self.cfg.stage2_reward,
            "reward": float(totals.mean()),
            "reward_parts": {k: float(np.mean([r.parts[k] for r in rewards])) for k in rewards[0].parts},
            "em": float(np.mean([r.parts["em"] for r in rewards])),
            "format_ok": float(np.mean([r.format_ok for r in rollouts])),
            "answered": float(np.mean([r.scored_answer is not None for r in rollouts])),
            "refused": float(np.mean([r.refused for r in rollouts])),
            "searches": float(np.mean([r.searches for r in rollouts])),
            "retrieval_ms": float(np.mean([r.retrieval_ms for r in rollouts])),
            "mode_mix": {m: round(c / n_search, 4) for m, c in modes.items()} if n_search else {},
            "by_first_mode": by_first_mode([r.modes[0] if r.modes else None for r in rollouts], totals.tolist(), adv),
            "response_tokens": float(np.mean([s.policy_tokens for s in seqs])),
            **stats,
            "groups_kept": len(kept), "rollout_s": round(t_roll, 2), "update_s": round(t_update, 2),
            "refresh_s": round(t_refresh, 2), **read_stats,
        }
        with open(self.out / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(metrics) + "\n")
        log.info("step %d stage %d reward %.3f em %.3f searches %.2f kl %.4f", step, metrics["stage"],
                 metrics["reward"], metrics["em"], metrics["searches"], metrics["kl"])
        return metrics

    # -- the update ------------------------------------------------------------------------------------------------

    def _logprobs(self, model: Any, batch: Any, grad: bool, hidden: torch.Tensor | None = None, *,
                  whole: bool = False) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            if self.passes is not None and not whole and model is not self.reference:
                return self.passes.logprobs(batch, hidden)
            # logits only from the first position that carries a loss: the long prompt needs hidden states, not the
            # vocabulary-wide softmax
            keep = batch.input_ids.shape[1] - first_loss_position(batch.loss_mask)
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
            return token_logprobs(logits, batch.input_ids)

    def _reference_logprobs(self, batch: Any, hidden: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            if self.reference is not None:
                return self._logprobs(self.reference, batch, grad=False)
            with reference_policy(self.model) as ref:  # LoRA: the warm-start adapter, or the base weights
                return self._logprobs(ref, batch, grad=False, hidden=hidden)

    def _trunk_hidden(self, mb: Batch, cache: dict[tuple[int, ...], torch.Tensor | None],
                      rows: list[int]) -> torch.Tensor | None:
        """The frozen trunk's hidden states for a micro-batch, computed once per update and shared by the reference,
        old and policy passes (None without a trunk). The first use checks the update's passes against the model's
        own forward pass and drops them, with a warning, where they differ."""
        if self.passes is None:
            return None
        key = tuple(rows)
        if key not in cache:
            cache[key] = self.passes.hidden(mb.input_ids, mb.attention_mask)
            if not self._passes_checked and not self._passes_match(mb, cache[key]):
                self.passes = None
                return None
        return cache[key]

    def _passes_match(self, mb: Batch, hidden: torch.Tensor | None) -> bool:
        self._passes_checked = True
        training = self.model.training
        self.model.eval()  # without the adapter's dropout, the two ways must agree
        try:
            whole = self._logprobs(self.model, mb, grad=False, whole=True) * mb.loss_mask
            split = self._logprobs(self.model, mb, grad=False, hidden=hidden)
        finally:
            self.model.train(training)
        ok = bool(torch.allclose(whole, split, atol=1e-4, rtol=1e-4))
        if not ok:
            log.warning("the update's shared-trunk passes differ from the model's own (max %.2e); running whole passes",
                        float((whole - split).abs().max()))
        return ok

    def update(self, seqs: list[TokenSequence], adv: list[float], groups: list[int],
               kept_groups: set[int] | None = None) -> dict[str, float]:
        cfg = self.cfg
        pad = self.tokenizer.pad_token_id
        keep = [i for i, s in enumerate(seqs) if s.policy_tokens > 0 and len(s.ids) > 1
                and (kept_groups is None or groups[i] in kept_groups)]
        if not keep:
            return {"loss": 0.0, "kl": 0.0, "clipfrac": 0.0, "grad_norm": 0.0, "policy_tokens": 0, "updates": 0}
        q_of = {i: groups[i] for i in keep}
        questions = sorted(set(q_of.values()))
        per_update = cfg.mini_batch_size or len(questions)
        # with a single update per batch the policy that sampled is the policy being updated, so the ratio is
        # exactly 1 and its own (detached) log-probabilities are the old ones: one forward pass saved
        single_update = cfg.ppo_epochs == 1 and per_update >= len(questions)
        self.model.eval()  # old and reference log-probabilities without dropout
        old: dict[int, torch.Tensor] = {}
        ref: dict[int, torch.Tensor] = {}
        trunk: dict[tuple[int, ...], torch.Tensor | None] = {}
        if not single_update or cfg.kl_coef > 0:
            for mb in micro_batches([seqs[i] for i in keep], [adv[i] for i in keep], cfg.micro_batch_size, pad,
                                    self.device):
                hidden = self._trunk_hidden(mb, trunk, [keep[j] for j in mb.index])
                lp = None if single_update else self._logprobs(self.model, mb, grad=False, hidden=hidden)
                rp = self._reference_logprobs(mb, hidden) if cfg.kl_coef > 0 else None
                for row, j in enumerate(mb.index):
                    if lp is not None:
                        old[keep[j]] = lp[row].detach()
                    if rp is not None:
                        ref[keep[j]] = rp[row].detach()
        self.model.train()
        totals = Counter()
        updates = 0
        for _ in range(cfg.ppo_epochs):
            for start in range(0, len(questions), per_update):
                chosen = set(questions[start : start + per_update])
                members = [i for i in keep if q_of[i] in chosen]
                n_tokens = sum(seqs[i].policy_tokens - seqs[i].mask[0] for i in members) or 1
                self.optimizer.zero_grad(set_to_none=True)
                for mb in micro_batches([seqs[i] for i in members], [adv[i] for i in members], cfg.micro_batch_size,
                                        pad, self.device):
                    rows = [members[j] for j in mb.index]
                    width = mb.loss_mask.shape[1]
                    lp = self._logprobs(self.model, mb, grad=True, hidden=self._trunk_hidden(mb, trunk, rows))
                    old_lp = lp.detach() if single_update else torch.stack([_fit(old[i], width) for i in rows])
                    pg = policy_loss_tokens(lp, old_lp, mb.advantages, clip=cfg.clip)
                    loss_tok = pg
                    kl_tok = torch.zeros_like(pg)
                    if cfg.kl_coef > 0:
                        ref_lp = torch.stack([_fit(ref[i], width) for i in rows])
                        kl_tok = low_var_kl(lp, ref_lp)
                        loss_tok = pg + cfg.kl_coef * kl_tok
                    # token-mean over the whole mini-batch, accumulated micro-batch by micro-batch
                    loss = (loss_tok * mb.loss_mask).sum() / n_tokens
                    loss.backward()
                    with torch.no_grad():
                        totals["loss"] += loss.item()
                        totals["kl"] += (kl_tok * mb.loss_mask).sum().item() / n_tokens
                        ratio = torch.exp(lp - old_lp)
                        clipped = ((ratio - 1).abs() > cfg.clip).float()
                        totals["clipfrac"] += (clipped * mb.loss_mask).sum().item() / n_tokens
                params = [p for p in self.model.parameters() if p.requires_grad]
                totals["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
                self.optimizer.step()
                updates += 1
        self.model.eval()
        return {"loss": totals["loss"] / updates, "kl": totals["kl"] / updates,
                "clipfrac": totals["clipfrac"] / updates, "grad_norm": totals["grad_norm"] / updates,
                "policy_tokens": int(sum(seqs[i].policy_tokens for i in keep)), "updates": updates}

    # -- checkpoints -----------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """OUT/checkpoint-N, written atomically (training/checkpoints.py)."""
        return save_checkpoint(self.out, self.step, self.model, self.tokenizer, self.optimizer, self.card(),
                               config_json=self.cfg.model_dump_json(indent=2))

    def _resume(self) -> None:
        self.step = resume_checkpoint(self.out, self.model, self.optimizer, self.device, self.out / METRICS)


def _fit(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad or cut a per-token vector to ``width`` (sequences are re-batched between passes)."""
    if t.shape[0] >= width:
        return t[:width]
    return torch.cat([t, t.new_zeros(width - t.shape[0])])
