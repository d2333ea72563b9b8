"""RouteRAG's rollout as a verl agent loop (``verl.experimental.agent_loop``), registered by a YAML file rather than
a fork: verl's ``AgentLoopWorker`` instantiates :class:`RouteRAGAgentLoop` for every trajectory from the entry
``launch.agent_loop_config`` wrote and calls :meth:`run`, which runs our :class:`~routerag.policy.PolicyLoop` with
verl's rollout server as the backend.

The response is every token after the prompt: what the policy generated (mask 1, with its log-probabilities) and
the ``<information>`` the loop appended (mask 0, log-probability 0), cut to ``rollout.response_length``. The rollout's
summary (answer, searches, retrieval time, queries) travels in ``extra_fields`` to the reward function and to the
batch-level stage-2 reward.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from routerag.config import LoopSettings, RetrievalConfig
from routerag.policy import LoopConfig, PolicyLoop
from routerag.policy.search import HTTPSearch, LocalSearch
from routerag.policy.types import SearchBackend, Trajectory
from routerag.policy.answering import Reader
from training.baseline import baseline_reader, naive_rag_answer
from training.rewards import Rollout

from .generator import VerlServerGenerator
from .reward import supporting_titles

_SEARCH_BACKENDS: dict[tuple[Any, ...], SearchBackend] = {}


def retrieval_settings(retrieval: dict[str, Any] | DictConfig | None, fact_filter_api_key_env: str | None
                       ) -> RetrievalConfig:
    """The user's retrieval settings from the agent-loop YAML, with the fact filter's key (if it needs one) read
    from the environment variable the YAML names rather than from the file."""
    fields = OmegaConf.to_container(retrieval, resolve=True) if isinstance(retrieval, DictConfig) else retrieval
    fields = dict(fields or {})  # type: ignore[arg-type]
    key = os.environ.get(fact_filter_api_key_env) if fact_filter_api_key_env else None
    if key:
        fields["fact_filter_api_key"] = key
    return RetrievalConfig.model_validate(fields)


def search_backend(*, retriever_url: str | None, retriever_api_key_env: str | None, index_dir: str | None,
                   retrieval: RetrievalConfig) -> SearchBackend:
    """One search backend per worker process and configuration: agent loops are created per trajectory and must
    stay cheap, and one in-process retriever shares its micro-batcher across all of them."""
    api_key = os.environ.get(retriever_api_key_env) if retriever_url and retriever_api_key_env else None
    key = (retriever_url, retriever_api_key_env, api_key, index_dir, retrieval.model_dump_json())
    if key not in _SEARCH_BACKENDS:
        if retriever_url:
            _SEARCH_BACKENDS[key] = HTTPSearch(retriever_url, api_key=api_key)
        elif index_dir:
            from routerag.retrieval import Retriever

            _SEARCH_BACKENDS[key] = LocalSearch(Retriever(index_dir, retrieval))
        else:
            raise ValueError("the RouteRAG agent loop needs retriever_url or index_dir")
    return _SEARCH_BACKENDS[key]


def response_tokens(traj: Trajectory, limit: int) -> tuple[list[int], list[int], list[float]]:
    """(ids, mask, log-probabilities) of everything after the prompt, cut to ``limit`` tokens: policy tokens get
    mask 1 and their log-probabilities, appended information gets mask 0 and 0.0."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for seg in traj.segments[1:]:
        seg_ids = list(seg.token_ids or [])
        policy = seg.kind == "policy"
        lp = list(seg.logprobs or []) if policy else []
        ids += seg_ids
        mask += [int(policy)] * len(seg_ids)
        logprobs += lp[: len(seg_ids)] + [0.0] * max(0, len(seg_ids) - len(lp))
    return ids[:limit], mask[:limit], logprobs[:limit]


_BASELINES: dict[tuple[str, str, int], str | None] = {}
"""Naive RAG's answer per (question, mode, k) in this worker: computed once, as the local trainer's is."""


class RouteRAGAgentLoop(AgentLoopBase):
    """Our policy loop behind verl's agent-loop interface (keyword arguments come from the YAML entry)."""

    def __init__(self, *args: Any, loop: dict[str, Any] | DictConfig | None = None, retriever_url: str | None = None,
                 retriever_api_key_env: str | None = None, index_dir: str | None = None,
                 retrieval: dict[str, Any] | DictConfig | None = None, fact_filter_api_key_env: str | None = None,
                 baseline: dict[str, Any] | DictConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.baseline = dict(baseline) if baseline else None
        """``{"mode", "k"}``: record naive RAG's answer in every rollout (Gain Beyond RAG); None: not needed."""
        self.loop_settings = LoopSettings(**dict(loop or {})).resolve()
        """The resolved loop settings the launcher wrote (the trainer's, else the warm start's card)."""
        self.search = search_backend(retriever_url=retriever_url, retriever_api_key_env=retriever_api_key_env,
                                     index_dir=index_dir,
                                     retrieval=retrieval_settings(retrieval, fact_filter_api_key_env))
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        prompt_ids = await self.ct_build_initial_tokens(messages)
        prompt_text = self.tokenizer.decode(prompt_ids)
        extra = kwargs.get("extra_info") or {}  # the dataset row's extra_info (prepare-data writes the question)
        question = extra.get("question") or messages[-1]["content"]
        server_fields: dict[str, Any] = {}

        def keep_steps(out: Any) -> None:  # verl's staleness tags need the weight versions the server reported
            fields = getattr(out, "extra_fields", {}) or {}
            server_fields.setdefault("min_global_steps", fields.get("min_global_steps"))
            server_fields["max_global_steps"] = fields.get("max_global_steps")

        generator = VerlServerGenerator(self.server_manager, self.tokenizer, sampling_params, uuid.uuid4().hex,
                                        on_output=keep_steps)
        settings = replace(self.loop_settings,
                           max_total_tokens=min(self.loop_settings.max_total_tokens, self.response_length))
        # temperature None: verl's sampling parameters decide (temperature 1 to train, greedy to validate)
        loop = PolicyLoop(generator, self.search, LoopConfig(**settings, temperature=None))
        traj = await loop.run(question, prompt=(prompt_text, list(prompt_ids)))
        ids, mask, logprobs = response_tokens(traj, self.response_length)
        rollout = Rollout.from_trajectory(traj)
        # what the reward parts read besides the trajectory: the question, its gold pages, naive RAG's answer
        rollout.question, rollout.gold_titles = question, supporting_titles(extra)
        if self.baseline is not None:
            rollout.baseline_answer = await self.naive_rag(generator, question)
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids), response_ids=ids, response_mask=mask,
            response_logprobs=logprobs if sampling_params.get("logprobs") else None,
            num_turns=len(traj.steps) + 1,
            metrics=AgentLoopMetrics(generate_sequences=traj.generation_ms / 1000,
                                     tool_calls=traj.retrieval_ms / 1000),
            extra_fields={**server_fields, "rollout": rollout.to_json(), "retrieval_ms": traj.retrieval_ms,
                          "searches": traj.searches, "global_steps": kwargs.get("global_steps"),
                          "turn_scores": [], "tool_rewards": []})

    async def naive_rag(self, generator: VerlServerGenerator, question: str) -> str | None:
        """Naive RAG's answer to ``question`` by the policy reading the top ``k`` (:mod:`training.baseline`)."""
        assert self.baseline is not None
        key = (question, str(self.baseline["mode"]), int(self.baseline["k"]))
        if key not in _BASELINES:
            _BASELINES[key] = await naive_rag_answer(baseline_reader(Reader(None), generator), self.search, question,
                                                     mode=key[1], k=key[2])  # type: ignore[arg-type]
        return _BASELINES[key]
