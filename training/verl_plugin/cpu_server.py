"""verl's rollout-server client (``LLMServerClient``) answered in-process by our transformers backend, so verl's own
agent-loop worker can run :class:`~training.verl_plugin.agent_loop.RouteRAGAgentLoop` end to end without vLLM or a
GPU: the CPU checks of the verl path (``tests/test_verl_agent_loop.py``) and debugging the agent loop by hand.

It honours the part of vLLM's sampling parameters the agent loop sends (``max_tokens``, ``stop``, ``temperature``,
``logprobs``) and answers with verl's own :class:`~verl.workers.rollout.replica.TokenOutput`. Every call is
recorded, so a check can rebuild what the policy generated independently of the trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from routerag.policy.types import Generation, GenerationRequest, Generator


@dataclass(slots=True)
class ServerCall:
    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    token_ids: list[int]
    log_probs: list[float] | None


class InProcessServerClient(LLMServerClient):
    """``generate(request_id=, prompt_ids=, sampling_params=)`` → ``TokenOutput``, served by a token-tracking
    :class:`~routerag.policy.types.Generator` (e.g. :class:`~routerag.policy.backends.transformers_backend.
    TransformersGenerator` with any local model) instead of a remote vLLM replica."""

    def __init__(self, config: DictConfig, generator: Generator, *, global_steps: int = 0) -> None:
        super().__init__(config=config, load_balancer_handle=None)
        if not generator.tracks_tokens:
            raise ValueError("the in-process server needs a generator that works on token ids")
        self.generator = generator
        self.global_steps = global_steps
        self.calls: list[ServerCall] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        tok = self.generator.tokenizer
        gen: Generation = await self.generator.generate(GenerationRequest(
            prompt_text=tok.decode(prompt_ids), prompt_ids=list(prompt_ids),
            max_tokens=int(sampling_params.get("max_tokens") or self.config.actor_rollout_ref.rollout.response_length),
            stop=tuple(sampling_params.get("stop") or ()), temperature=float(sampling_params.get("temperature", 1.0)),
            logprobs=bool(sampling_params.get("logprobs"))))
        ids = list(gen.token_ids or [])
        logprobs = list(gen.logprobs or [0.0] * len(ids)) if sampling_params.get("logprobs") else None
        self.calls.append(ServerCall(request_id, list(prompt_ids), dict(sampling_params), ids, logprobs))
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})
