"""Any OpenAI-compatible server (``vllm serve``, SGLang, OpenAI) through the ``openai`` client, using the completions
endpoint with stop strings, so the policy continues one running text exactly as RouteRAG's loop does.

The chat template is applied here: from a local tokenizer when one is configured (``tokenizer``), else ChatML (Qwen,
SmolLM2). Requests run concurrently up to ``max_concurrency``; there is no lock around the client.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...config import GeneratorConfig
from ..prompt import chatml
from ..types import Generation, GenerationRequest

_OPEN_TAGS = ("<search>", "<answer>")


class OpenAIGenerator:
    tracks_tokens = False

    def __init__(self, cfg: GeneratorConfig) -> None:
        import openai

        if not cfg.base_url and cfg.model.startswith(("smollm2",)):
            raise ValueError("the openai backend needs base_url and the served model's name")
        self.cfg = cfg
        self.name = f"openai:{cfg.base_url or 'api.openai.com'}:{cfg.model}"
        self.client = openai.AsyncOpenAI(base_url=cfg.base_url, api_key=(cfg.api_key.get_secret_value()
                                                                         if cfg.api_key else "EMPTY"),
                                         timeout=cfg.timeout_s, max_retries=2)
        self.tokenizer = _load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None

    def render_prompt(self, user_message: str) -> tuple[str, list[int] | None]:
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": user_message}], add_generation_prompt=True,
                                           tokenize=False)
            return text, None
        return chatml(user_message), None

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.cfg.max_concurrency), loop
        return self._sem

    async def generate(self, request: GenerationRequest) -> Generation:
        temp = self.cfg.temperature if request.temperature is None else request.temperature
        async with self._semaphore():
            resp = await self.client.completions.create(
                model=self.cfg.model, prompt=request.prompt_text, max_tokens=request.max_tokens,
                temperature=temp, top_p=self.cfg.top_p if temp > 0 else 1.0, stop=list(request.stop) or None)
        choice = resp.choices[0]
        text = choice.text or ""
        finish = {"length": "length"}.get(choice.finish_reason or "", "stop")
        if finish == "stop":
            # vLLM says which stop string fired (stop_reason); plain OpenAI does not: a stop string fired when the
            # text leaves a search/answer tag open (the server cut off its closing tag)
            matched = getattr(choice, "stop_reason", None)
            if not (isinstance(matched, str) and matched in request.stop) and not _leaves_tag_open(text, request):
                finish = "eos"
        usage = resp.usage
        return Generation(text=text, finish_reason=finish,
                          prompt_tokens=usage.prompt_tokens if usage else 0,
                          completion_tokens=usage.completion_tokens if usage else 0)

    async def aclose(self) -> None:
        await self.client.close()


def _leaves_tag_open(text: str, request: GenerationRequest) -> bool:
    low = text.lower()
    if request.stop == ("</answer>",):  # a forced answer: its <answer> was in the prompt
        return "</answer>" not in low
    last = max(low.rfind(t) for t in _OPEN_TAGS)
    if last < 0:
        return False
    tag = low[last + 1 : low.index(">", last)]
    return f"</{tag}>" not in low[last:]


def _load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
