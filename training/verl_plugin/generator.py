"""A policy backend over verl's rollout server (``server_manager.generate``): token ids in, token ids and
log-probabilities out, stop strings passed to vLLM. It lets verl's agent loop run our policy loop unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from routerag.policy.types import Generation, GenerationRequest


class VerlServerGenerator:
    name = "verl-rollout"
    tracks_tokens = True

    def __init__(self, server_manager: Any, tokenizer: Any, sampling_params: dict[str, Any], request_id: str, *,
                 on_output: Callable[[Any], None] | None = None) -> None:
        self.server = server_manager
        self.tokenizer = tokenizer
        self.sampling = dict(sampling_params)
        self.request_id = request_id  # one id per trajectory: sticky replica, prefix cache hits
        self.on_output = on_output

    def render_prompt(self, user_message: str) -> tuple[str, list[int]]:
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": user_message}],
                                                  add_generation_prompt=True, tokenize=False)
        return text, list(self.tokenizer.encode(text, add_special_tokens=False))

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.prompt_ids is None:
            raise ValueError("the verl backend works on token ids")
        params = {**self.sampling, "max_tokens": request.max_tokens, "stop": list(request.stop),
                  "include_stop_str_in_output": True}
        if request.temperature is not None:
            params["temperature"] = request.temperature
        out = await self.server.generate(request_id=self.request_id, prompt_ids=list(request.prompt_ids),
                                         sampling_params=params)
        if self.on_output is not None:
            self.on_output(out)
        ids = list(out.token_ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if any(s in text for s in request.stop):
            finish = "stop"
        elif len(ids) >= request.max_tokens:
            finish = "length"
        else:
            finish = "eos"
        return Generation(text=text, token_ids=ids, logprobs=list(out.log_probs) if out.log_probs else None,
                          finish_reason=finish, prompt_tokens=len(request.prompt_ids), completion_tokens=len(ids))
