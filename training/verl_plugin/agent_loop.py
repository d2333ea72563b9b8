"""RouteRAG's rollout as a verl agent loop (``verl.experimental.agent_loop``), registered by a YAML file rather than
a fork: verl instantiates :class:`RouteRAGAgentLoop` for every trajectory and calls :meth:`run`, which runs our
:class:`~routerag.policy.PolicyLoop` with verl's rollout server as the backend.

The response is every token after the prompt: what the policy generated (mask 1, with its log-probabilities) and
the ``<information>`` the loop appended (mask 0, log-probability 0), cut to ``rollout.response_length``. The rollout's
summary (answer, searches, retrieval time, queries) travels in ``extra_fields`` to the reward function and to the
batch-level stage-2 reward.
"""

from __future__ import annotations

import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.search import HTTPSearch, LocalSearch
from training.rewards import Rollout

from .generator import VerlServerGenerator

_SEARCH_BACKENDS: dict[tuple[str | None, str | None], Any] = {}


def _search_backend(retriever_url: str | None, index_dir: str | None) -> Any:
    """One search backend per worker process (agent loops are created per trajectory and must stay cheap)."""
    key = (retriever_url, index_dir)
    if key not in _SEARCH_BACKENDS:
        if retriever_url:
            _SEARCH_BACKENDS[key] = HTTPSearch(retriever_url)
        elif index_dir:
            from routerag.config import RetrievalConfig
            from routerag.retrieval import Retriever

            _SEARCH_BACKENDS[key] = LocalSearch(Retriever(index_dir, RetrievalConfig()))
        else:
            raise ValueError("the RouteRAG agent loop needs retriever_url or index_dir")
    return _SEARCH_BACKENDS[key]


class RouteRAGAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, budget: int = 4, k: int = 3, max_turn_tokens: int = 500,
                 max_information_tokens: int = 500, retriever_url: str | None = None, index_dir: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.budget, self.k = budget, k
        self.max_turn_tokens, self.max_information_tokens = max_turn_tokens, max_information_tokens
        self.search = _search_backend(retriever_url, index_dir)
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        prompt_ids = await self.ct_build_initial_tokens(messages)
        prompt_text = self.tokenizer.decode(prompt_ids)
        extra = kwargs.get("extra_info") or {}
        question = extra.get("question") or messages[-1]["content"]
        server_fields: dict[str, Any] = {}

        def keep_steps(out: Any) -> None:  # verl's metrics need the global steps the server reported
            fields = getattr(out, "extra_fields", {}) or {}
            server_fields.setdefault("min_global_steps", fields.get("min_global_steps"))
            server_fields["max_global_steps"] = fields.get("max_global_steps")

        generator = VerlServerGenerator(self.server_manager, self.tokenizer, sampling_params, uuid.uuid4().hex,
                                        on_output=keep_steps)
        loop = PolicyLoop(generator, self.search, LoopConfig(
            budget=self.budget, k=self.k, max_turn_tokens=self.max_turn_tokens,
            max_information_tokens=self.max_information_tokens, max_total_tokens=self.response_length,
            temperature=None))  # None: verl's sampling parameters decide (temperature 1 to train, greedy to validate)
        traj = await loop.run(question, prompt=(prompt_text, prompt_ids))
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for seg in traj.segments[1:]:
            seg_ids = seg.token_ids or []
            ids += seg_ids
            is_policy = seg.kind == "policy"
            mask += [int(is_policy)] * len(seg_ids)
            lp = seg.logprobs if is_policy and seg.logprobs else [0.0] * len(seg_ids)
            logprobs += list(lp)[: len(seg_ids)] + [0.0] * max(0, len(seg_ids) - len(lp))
        n = self.response_length
        rollout = Rollout.from_trajectory(traj)
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids), response_ids=ids[:n], response_mask=mask[:n],
            response_logprobs=logprobs[:n] if sampling_params.get("logprobs") else None,
            num_turns=len(traj.steps) + 1,
            metrics={"generate_sequences": traj.generation_ms / 1000, "tool_calls": traj.retrieval_ms / 1000},
            extra_fields={**server_fields, "rollout": rollout.to_json(), "retrieval_ms": traj.retrieval_ms,
                          "searches": traj.searches, "global_steps": kwargs.get("global_steps"),
                          "turn_scores": [], "tool_rewards": []})
