"""The policy prompt (RouteRAG's scheme, our wording) and how a context is turned into model input.

The model reasons in ``<think>``, searches with ``<search>[passage] q</search>`` (dense), ``<search>[graph] q
</search>`` (knowledge graph) or both tags (fused), reads ``<information>``, and ends with ``<answer>``. A different
template can be loaded from a file; it must contain ``{question}``.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_INSTRUCTION = """Answer the question. Reason inside <think> </think>. To look something up, write \
<search>[passage] query</search> (search passages), <search>[graph] query</search> (search a knowledge graph of \
facts, for chains of facts) or <search>[graph][passage] query</search> (both). Results come back inside \
<information> </information>. Search only when needed. Give the final answer inside <answer> </answer>, for \
example <answer> Paris </answer>.
Question: {question}
"""


def load_template(path: str | Path | None) -> str:
    """The instruction template: the default, or a file that contains ``{question}``."""
    if path is None:
        return DEFAULT_INSTRUCTION
    text = Path(path).read_text(encoding="utf-8")
    if "{question}" not in text:
        raise ValueError(f"{path}: a prompt template must contain {{question}}")
    return text


def user_message(template: str, question: str) -> str:
    return template.replace("{question}", question.strip())


# ChatML, as used by Qwen2.5 and SmolLM2: the fallback when no tokenizer with a chat template is at hand (e.g. a
# remote completions endpoint).
CHATML_SYSTEM = "You are a helpful assistant."


def chatml(user: str, system: str | None = CHATML_SYSTEM) -> str:
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{sys_part}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
