"""A policy's card: the loop settings, prompt template and reader it was trained for, saved beside its weights.

A policy trained with 2 searches, 256-token information blocks and 96-token turns, then served with 4 searches and
500-token blocks, runs in a context it never saw, and slowly (one ``/ask`` on the embedded router took 123 s that
way). So every trainer writes ``routerag_policy.json`` into the adapter or model folder it saves, the shipped router
carries one, and ``serve``, ``ask``, ``eval`` and ``train`` fill every loop setting the user left unset from it.

Precedence, highest first: flag > environment > TOML file > the policy's card > :class:`routerag.config.Loop`'s
defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from graph_index.atomic import write_text_atomic

from ..config import EMBEDDED_POLICY, EMBEDDED_ROUTER, GeneratorConfig, Loop, LoopSettings
from ..vocabulary import ReaderKind, ReaderPrompt
from ..prompts import DEFAULT_INSTRUCTION, load_template

CARD_FILE = "routerag_policy.json"


class CardError(ValueError):
    """A policy card that cannot be read (named with its path)."""


class PolicyCard(BaseModel):
    """What a trained policy expects of the loop that runs it."""

    format: Literal[1] = 1
    loop: LoopSettings = LoopSettings()
    """The loop settings it was trained with (unset fields: the built-in defaults)."""
    template: str | None = None
    """The instruction template it was trained on; None: the built-in default."""
    reader: ReaderKind = "policy"
    """Who writes the final answer: the policy in its ``<answer>``, the policy's base model with the adapter off
    reading the retrieved documents (s3's decoupled design: the router searches, the base model reads), or a
    configured ``answer_generator``."""
    reader_prompt: ReaderPrompt = "instruct"
    """How the reader is asked (:class:`~routerag.policy.answering.Reader`)."""
    short_answer: bool = False
    """Reduce the reader's reply to the span of the documents it names (:mod:`routerag.policy.short_answer`)."""
    trained: dict[str, Any] = Field(default_factory=dict)
    """Provenance, for people: recipe, data, steps, measured results."""


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """Every loop setting decided: the user's where set, else the card's, else the built-in default."""

    loop: Loop
    template: str
    reader: ReaderKind
    reader_prompt: ReaderPrompt
    short_answer: bool
    card_path: Path | None
    """Where the card came from (None: the policy has none)."""


def card_folder(gen: GeneratorConfig) -> Path | None:
    """Where the policy's card would be: the adapter folder, the shipped router's folder, or a local model folder."""
    if gen.adapter:
        return Path(gen.adapter).expanduser()
    if gen.model == EMBEDDED_ROUTER:
        from .backends.transformers_backend import embedded_router_adapter

        return embedded_router_adapter()
    if gen.model != EMBEDDED_POLICY and gen.backend != "openai" and Path(gen.model).expanduser().is_dir():
        return Path(gen.model).expanduser()
    return None


def read_card(folder: str | Path | None) -> PolicyCard | None:
    """The card in ``folder``, or None when there is none."""
    if folder is None:
        return None
    path = Path(folder) / CARD_FILE
    if not path.is_file():
        return None
    try:
        return PolicyCard.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, ValidationError, UnicodeDecodeError) as exc:
        raise CardError(f"{path}: not a valid policy card ({exc})") from None


def write_card(folder: str | Path, card: PolicyCard) -> Path:
    """Write ``folder/routerag_policy.json`` atomically (a trainer may be killed while saving)."""
    path = Path(folder) / CARD_FILE
    write_text_atomic(path, card.model_dump_json(indent=2, exclude_defaults=False) + "\n")
    return path


def resolve_policy(policy: Any) -> ResolvedPolicy:
    """The effective loop of a ``[policy]`` section (:class:`~routerag.config.PolicyConfig`): its settings, else the
    card of the policy it names."""
    folder = card_folder(policy.generator)
    return resolve_with(policy, read_card(folder), folder)


def training_policy(settings: Any) -> ResolvedPolicy:
    """The loop a trainer's rollouts and examples use: ``[train]``'s loop settings, else ``[policy]``'s, else the card
    of ``train.init_adapter`` (a warm start carries its own), else the defaults; template and reader from
    ``[policy]``, else that card."""
    folder = settings.train.init_adapter
    return resolve_with(settings.policy, read_card(folder), folder, loop=settings.train)


def resolve_with(policy: Any, card: PolicyCard | None, folder: str | Path | None, *,
                 loop: LoopSettings | None = None) -> ResolvedPolicy:
    """``policy``'s settings over ``card``'s over the defaults; ``loop`` (a trainer's) wins over ``policy``'s."""
    values = (loop.resolve(policy, card.loop if card else None) if loop is not None
              else policy.resolve(card.loop if card else None))
    if policy.template_file is not None:
        template = load_template(policy.template_file)
    else:
        template = card.template if card and card.template else DEFAULT_INSTRUCTION
    reader = policy.reader or (card.reader if card else None)
    if reader is None:
        reader = "generator" if policy.answer_generator is not None else "policy"
    if reader == "generator" and policy.answer_generator is None:
        raise ValueError("policy.reader = 'generator' needs a [policy.answer_generator]")
    short = policy.short_answer if policy.short_answer is not None else bool(card and card.short_answer)
    prompt = policy.reader_prompt or (card.reader_prompt if card else "instruct")
    return ResolvedPolicy(loop=values, template=template, reader=reader, reader_prompt=prompt, short_answer=short,
                          card_path=(Path(folder) / CARD_FILE) if card is not None and folder else None)


def card_for(resolved: ResolvedPolicy, trained: dict[str, Any] | None = None) -> PolicyCard:
    """The card a trainer writes beside the weights it saves: the loop it trained with."""
    return PolicyCard(loop=LoopSettings.of(resolved.loop), template=resolved.template, reader=resolved.reader,
                      reader_prompt=resolved.reader_prompt, short_answer=resolved.short_answer,
                      trained=dict(trained or {}))
