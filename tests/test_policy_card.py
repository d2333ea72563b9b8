"""A policy carries its own loop settings: its card fills every setting the user left unset, serving and training
read it the same way, and the shipped router has one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from routerag.config import LOOP_DEFAULTS, LoopSettings, Settings, load_settings
from routerag.policy.card import (CARD_FILE, CardError, PolicyCard, read_card, resolve_policy, training_policy,
                                  write_card)

from .helpers.scripted import FakeSearch, ScriptedGenerator


def card_dir(tmp_path: Path, **fields) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir(exist_ok=True)
    write_card(folder, PolicyCard(**fields))
    return folder


def test_unset_settings_come_from_the_card_and_explicit_ones_win(tmp_path: Path) -> None:
    folder = card_dir(tmp_path, loop=LoopSettings(budget=2, max_information_tokens=256, max_turn_tokens=96),
                      template="Q: {question}\n", reader="policy", short_answer=True)
    settings = load_settings(Settings, policy={"generator": {"adapter": str(folder)}, "k": 5})
    resolved = resolve_policy(settings.policy)
    assert resolved.loop == {**LOOP_DEFAULTS, "budget": 2, "max_information_tokens": 256, "max_turn_tokens": 96,
                             "k": 5}  # the card's three, the user's k, defaults for the rest
    assert resolved.template == "Q: {question}\n" and resolved.short_answer is True
    assert resolved.card_path == folder / CARD_FILE
    # a TOML file and the environment are the user's too
    toml = tmp_path / "c.toml"
    toml.write_text("[policy]\nbudget = 3\nshort_answer = false\n")
    resolved = resolve_policy(load_settings(Settings, toml, policy={"generator": {"adapter": str(folder)}}).policy)
    assert resolved.loop["budget"] == 3 and resolved.loop["max_turn_tokens"] == 96 and resolved.short_answer is False


def test_without_a_card_the_defaults_apply(tmp_path: Path) -> None:
    resolved = resolve_policy(load_settings(Settings, policy={"generator": {"model": "smollm2"}}).policy)
    assert resolved.loop == LOOP_DEFAULTS and resolved.reader == "policy" and resolved.card_path is None
    empty = tmp_path / "plain"
    empty.mkdir()
    assert read_card(empty) is None


def test_a_broken_card_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / CARD_FILE).write_text('{"loop": {"budgett": 2}}')
    with pytest.raises(CardError, match=str(folder / CARD_FILE)):
        read_card(folder)
    (folder / CARD_FILE).write_text("{not json")
    with pytest.raises(CardError, match="not a valid policy card"):
        read_card(folder)


def test_the_shipped_router_carries_the_loop_it_was_trained_with() -> None:
    from routerag.policy.backends.transformers_backend import embedded_router_adapter

    card = read_card(embedded_router_adapter())
    assert card is not None, "the shipped router adapter has no policy card"
    resolved = resolve_policy(Settings().policy)  # what a new user gets with no settings at all
    assert resolved.card_path == embedded_router_adapter() / CARD_FILE
    assert resolved.loop == card.loop.resolve()
    assert resolved.reader == card.reader and resolved.short_answer == card.short_answer


def test_training_reads_train_then_policy_then_the_warm_starts_card(tmp_path: Path) -> None:
    folder = card_dir(tmp_path, loop=LoopSettings(budget=2, k=4, max_turn_tokens=96), reader="base")
    settings = load_settings(Settings, train={"init_adapter": str(folder), "max_turn_tokens": 64},
                             policy={"k": 2})
    resolved = training_policy(settings)
    assert resolved.loop["max_turn_tokens"] == 64 and resolved.loop["k"] == 2 and resolved.loop["budget"] == 2
    assert resolved.reader == "base"
    assert training_policy(load_settings(Settings)).loop == LOOP_DEFAULTS  # no warm start: no card


def test_the_engine_runs_the_cards_loop_and_refuses_a_base_reader_it_cannot_run(tmp_path: Path, index) -> None:
    import asyncio

    from routerag.engine import Engine

    folder = card_dir(tmp_path, loop=LoopSettings(budget=1, k=2), reader="policy")
    settings = load_settings(Settings, policy={"generator": {"adapter": str(folder)}})
    gen = ScriptedGenerator(["<search>[graph] a</search>", "<search>b</search>", "x</answer>"])
    search = FakeSearch()
    engine = Engine(index, settings, generator=gen, search=search)
    traj = asyncio.run(engine.ask("Where?"))
    assert [s.action for s in traj.steps] == ["search", "over_budget", "forced_answer"]  # the card's budget of 1
    assert search.calls == [("a", "graph", 2)]  # the card's k
    base = card_dir(tmp_path, loop=LoopSettings(), reader="base")
    with pytest.raises(ValueError, match="reader = 'base'"):
        Engine(index, load_settings(Settings, policy={"generator": {"adapter": str(base)}}),
               generator=ScriptedGenerator([]), search=search)


def test_card_json_is_plain_and_round_trips(tmp_path: Path) -> None:
    folder = card_dir(tmp_path, loop=LoopSettings(budget=2), reader="base", reader_prompt="fewshot",
                      trained={"steps": 3})
    raw = json.loads((folder / CARD_FILE).read_text())
    assert raw["loop"]["budget"] == 2 and raw["reader_prompt"] == "fewshot" and raw["trained"] == {"steps": 3}
    assert read_card(folder) == PolicyCard.model_validate(raw)
