"""The refusal action end to end: the convention and its parser, the loop (with and without a reader), the
server's response and ``routerag ask``, evaluation's counts, EVO-RAG's refusal reward, and the warm start's refusal
turn with its instruction template."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from routerag.cli import app
from routerag.config import Settings
from routerag.datasets import QAItem
from routerag.engine import Engine
from routerag.evaluation import EvalOptions, run_evaluation, summarize
from routerag.evaluation.records import score
from routerag.evaluation.report import dataset_markdown, refusal_table
from routerag.policy import LoopConfig, PolicyLoop, parse_turn
from routerag.policy.parsing import is_refusal
from routerag.policy.types import Summary
from routerag.prompts import (DEFAULT_INSTRUCTION, REFUSAL_ANSWER, REFUSAL_INSTRUCTION, REFUSE_MARKER,
                              REFUSE_THOUGHT, TEMPLATES)
from routerag.retrieval.types import RetrievalResult, RetrievedDoc
from server.protocol import AskResponse
from training.rewards import (REFUSAL_JUSTIFIED, REFUSAL_UNJUSTIFIED, RewardConfig, Rollout, batch_rewards,
                              refusal_reward)

from .helpers.scripted import CharTokenizer, FakeSearch, ScriptedGenerator

QUESTION = "Where was Joran Veld born?"
SEARCH = "<think>look it up</think><search>[graph] Joran Veld</search>"
REFUSE = "<think>none of these says it</think><answer> [refuse] </answer>"


def run(turns, cfg: LoopConfig | None = None):
    events: list[dict] = []
    loop = PolicyLoop(ScriptedGenerator(turns), FakeSearch(), cfg or LoopConfig())
    return asyncio.run(loop.run(QUESTION, on_event=events.append)), events


# -- the convention ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, kind, content", [
    ("<answer> [refuse] </answer>", "refuse", "[refuse]"),
    ("<think>t</think><answer>[REFUSE] the pages do not say</answer>", "refuse", "[REFUSE] the pages do not say"),
    ("<answer> I refuse </answer>", "answer", "I refuse"),
    ("<answer> Tarsk [refuse] </answer>", "answer", "Tarsk [refuse]"),  # only an answer that begins with it
    ("<search>[refuse] q</search>", "search", "[refuse] q"),
])
def test_parse_turn_reads_a_refusal(text: str, kind: str, content: str) -> None:
    a = parse_turn(text)
    assert (a.kind, a.content) == (kind, content)


def test_the_marker_is_defined_once_and_the_default_instruction_is_unchanged() -> None:
    assert REFUSE_MARKER == "[refuse]" and is_refusal(f"  {REFUSE_MARKER}") and not is_refusal(None)
    # the default's text is frozen: trained policies carry it in their cards and evaluation numbers depend on it
    assert hashlib.sha256(DEFAULT_INSTRUCTION.encode()).hexdigest()[:16] == "bf6863277994f473"
    head, question = DEFAULT_INSTRUCTION.split("\nQuestion:")
    assert REFUSAL_INSTRUCTION.startswith(head) and REFUSAL_INSTRUCTION.endswith("\nQuestion:" + question)
    assert f"<answer> {REFUSE_MARKER} </answer>" in REFUSAL_INSTRUCTION and REFUSE_MARKER not in DEFAULT_INSTRUCTION
    assert TEMPLATES["policy_instruction_refusal"] == REFUSAL_INSTRUCTION


# -- the loop ---------------------------------------------------------------------------------------------------------


def test_a_refusal_ends_the_trajectory_and_is_traced() -> None:
    traj, events = run([SEARCH, REFUSE])
    assert traj.finish == "refused" and traj.refused and traj.format_ok
    assert traj.answer == REFUSAL_ANSWER and traj.policy_answer == "[refuse]"
    assert [s.action for s in traj.steps] == ["search", "refuse"]
    assert traj.steps[1].thought == "none of these says it"
    draft = next(e for e in events if e["type"] == "draft")
    assert draft == {"type": "draft", "text": REFUSAL_ANSWER, "forced": False, "refused": True}
    final = next(e for e in events if e["type"] == "answer")
    assert final == {"type": "answer", "text": REFUSAL_ANSWER, "answered_by": "policy", "refused": True}
    assert events[-1]["finish"] == "refused"
    out = traj.summary().to_json()
    assert (out["answer"], out["finish"], out["refused"], out["citations"]) == (REFUSAL_ANSWER, "refused", True, [])
    assert out["trace"][1]["action"] == "refuse"
    response = AskResponse(**out, total_ms=1.0)  # the /ask response carries it
    assert response.refused and response.finish == "refused"


def test_an_answer_is_not_a_refusal() -> None:
    traj, events = run([SEARCH, "<answer> Tarsk </answer>"])
    assert traj.finish == "answer" and not traj.refused and traj.summary().to_json()["refused"] is False
    assert next(e for e in events if e["type"] == "answer")["refused"] is False


@pytest.mark.parametrize("short_answer", [False, True])
def test_a_reader_does_not_overwrite_a_refusal(short_answer: bool) -> None:
    reader = ScriptedGenerator([])  # an empty script: any call to the reader fails the test
    traj, _ = run([SEARCH, REFUSE], LoopConfig(answer_generator=reader, short_answer=short_answer))
    assert reader.requests == [] and traj.answer_generation_ms == 0.0
    assert traj.answer == REFUSAL_ANSWER and traj.finish == "refused"


def test_the_reader_still_answers_when_the_policy_answers() -> None:
    reader = ScriptedGenerator(["Tarsk</answer>"])
    traj, _ = run([SEARCH, "<answer>somewhere</answer>"], LoopConfig(answer_generator=reader))
    assert len(reader.requests) == 1 and traj.answer == "Tarsk" and not traj.refused


def test_a_forced_answer_is_not_a_refusal() -> None:
    over = [SEARCH, "<search>[graph] more</search>"]  # the second search is past a budget of 1: the answer is forced
    traj, _ = run([*over, "[refuse]</answer>"], LoopConfig(budget=1))
    assert [s.action for s in traj.steps] == ["search", "over_budget", "forced_answer"]
    assert traj.finish == "no_answer" and traj.answer is None and not traj.refused
    traj, _ = run([*over, "Tarsk</answer>"], LoopConfig(budget=1))
    assert traj.finish == "forced_answer" and traj.answer == "Tarsk" and not traj.refused


# -- /ask and routerag ask ---------------------------------------------------------------------------------------------


def test_ask_over_http_reports_a_refusal(index: Path, retriever) -> None:
    """The live app (not only its model): JSON and streamed ``/ask`` both say the policy refused."""
    import httpx

    from server.app import create_app

    from .helpers.server_helpers import parse_sse

    async def ask(body: dict) -> httpx.Response:
        engine = Engine(index, Settings(), generator=ScriptedGenerator([SEARCH, REFUSE]), retriever=retriever)
        app_ = create_app(engine, Settings())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_), base_url="http://localhost") as c:
            return await c.post("/ask", json=body)

    with asyncio.Runner() as runner:
        r = runner.run(ask({"question": QUESTION}))
        streamed = runner.run(ask({"question": QUESTION, "stream": True}))
    body = r.json()
    assert r.status_code == 200 and body["refused"] is True and body["finish"] == "refused"
    assert body["answer"] == REFUSAL_ANSWER and body["citations"] == []
    assert [s["action"] for s in body["trace"]] == ["search", "refuse"]
    events = dict(parse_sse(streamed.text))
    assert events["draft"] == {"type": "draft", "text": REFUSAL_ANSWER, "forced": False, "refused": True}
    assert events["answer"]["refused"] is True and events["answer"]["text"] == REFUSAL_ANSWER
    assert events["done"]["refused"] is True




def test_routerag_ask_shows_a_refusal(monkeypatch, tmp_path: Path) -> None:
    traj, _ = run([SEARCH, REFUSE])

    async def ask(question, **_):
        return traj

    monkeypatch.setattr("routerag.cli.ask.load_engine", lambda *a, **k: SimpleNamespace(ask=ask))
    res = CliRunner().invoke(app, ["ask", str(tmp_path), QUESTION], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert f"refused: {REFUSAL_ANSWER}" in res.output and "(1 searches)" in res.output
    assert "answer:" not in res.output and "no retrieved passage" not in res.output
    res = CliRunner().invoke(app, ["ask", str(tmp_path), QUESTION, "--json"])
    out = json.loads(res.output)
    assert out["refused"] is True and out["finish"] == "refused" and out["answer"] == REFUSAL_ANSWER


# -- evaluation -------------------------------------------------------------------------------------------------------


def test_a_refusal_scores_zero_even_when_its_sentence_overlaps_the_gold() -> None:
    item = QAItem("q", QUESTION, ["retrieved documents"])  # a whole-token span of the refusal's sentence
    refused = score(item, "learned", Summary(REFUSAL_ANSWER, "refused"), 1.0)
    assert refused["refused"] is True and refused["prediction"] == REFUSAL_ANSWER
    assert (refused["em"], refused["f1"], refused["gen_acc"]) == (0.0, 0.0, 0.0)
    answered = score(item, "learned", Summary(REFUSAL_ANSWER, "answer"), 1.0)  # the same words as an answer score
    assert answered["refused"] is False and answered["gen_acc"] == 1.0 and answered["f1"] > 0


def rec(em: float, f1: float, gen_acc: float, refused: bool | None) -> dict:
    r = {"em": em, "f1": f1, "gen_acc": gen_acc, "searches": 1, "modes": ["graph"], "finish": "answer"}
    if refused is not None:  # None: a record written before refusals existed
        r["refused"] = refused
        r["finish"] = "refused" if refused else "answer"
    return r


def test_summary_counts_refusals_and_accuracy_on_answered_questions() -> None:
    records = [rec(1, 1, 1, False), rec(0, 0.5, 1, False), rec(0, 0, 0, True), rec(1, 1, 1, None)]
    s = summarize(records)
    assert s["refusal_rate"] == 0.25
    assert s["em"] == 0.5 and s["em_answered"] == pytest.approx(2 / 3)  # plain EM counts the refusal as 0
    assert s["f1_answered"] == pytest.approx(2.5 / 3) and s["gen_acc_answered"] == 1.0
    assert s["finish"] == {"answer": 3, "refused": 1}
    none = summarize([rec(0, 0, 0, True)] * 2)
    assert none["refusal_rate"] == 1.0 and none["em_answered"] is None
    assert summarize([])["refusal_rate"] is None
    assert refusal_table({"learned": s})[2] == "| learned | 25.0 | 66.7 | 83.3 | 100.0 | — | — | 0.0 | answer 3, refused 1 |"
    assert refusal_table({"all": none})[2] == "| all | 100.0 | — | — | — | — | — | 0.0 | refused 2 |"


def test_the_harness_records_refusals_and_reports_them(tmp_path: Path) -> None:
    """A scripted policy refuses one of two questions; the reader is never asked about the refused one."""
    script = {"Where was Joran Veld born?": [SEARCH, "<answer>Tarsk</answer>"],
              "Who painted the Ossel lighthouse?": ["<search>[passage] Ossel lighthouse</search>", REFUSE]}

    def respond(req) -> str:
        after = req.prompt_text.split("<|im_start|>assistant\n", 1)[1]
        question = req.prompt_text.split("Question: ", 1)[1].split("\n", 1)[0]
        return script[question][after.count("</information>")]

    reader = ScriptedGenerator([lambda req: "Tarsk</answer>"])  # one answer only: a second call fails
    engine = Engine("unused", Settings(), generator=ScriptedGenerator([respond] * 10), search=FakeSearch(),
                    retriever=SimpleNamespace(passages=[]), answer_generator=reader)  # type: ignore[arg-type]
    qfile = tmp_path / "qs.jsonl"
    qfile.write_text(json.dumps({"id": "a", "question": "Where was Joran Veld born?", "answers": ["Tarsk"]}) + "\n"
                     + json.dumps({"id": "r", "question": "Who painted the Ossel lighthouse?",
                                   "answers": ["Quillon Fenn"]}) + "\n")
    overview = run_evaluation(engine, [qfile], tmp_path / "out", EvalOptions(progress=False, concurrency=1),
                              command="test")
    assert len(reader.requests) == 1
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / "qs" / "learned.jsonl").read_text().splitlines())}
    assert records["r"]["refused"] is True and records["r"]["finish"] == "refused"
    assert records["r"]["prediction"] == REFUSAL_ANSWER and records["a"]["refused"] is False
    s = overview["datasets"][0]["summaries"]["learned"]
    assert (s["em"], s["refusal_rate"], s["em_answered"]) == (0.5, 0.5, 1.0)
    md = (tmp_path / "out" / "qs" / "report.md").read_text()
    assert "## Refusals" in md and "| learned | 50.0 | 100.0 | 100.0 | 100.0 |" in md
    assert "| learned | 50.0 | 100.0 | 100.0 | 100.0 |" in (tmp_path / "out" / "report.md").read_text()
    assert dataset_markdown(json.loads((tmp_path / "out" / "qs" / "report.json").read_text())) == md


# -- EVO-RAG's refusal reward -----------------------------------------------------------------------------------------

GOLD = ["Tarsk"]
HIT, MISS = "Joran Veld Joran Veld was born in Tarsk.", "Kesh A town of weavers."


def rollout(answer: str | None, *, refused: bool = False, docs: tuple[str, ...] = (), searches: int = 1,
            ms: float = 0.0) -> Rollout:
    return Rollout(answer=answer, searches=searches, retrieval_ms=ms, format_ok=True, documents=list(docs),
                   refused=refused)


def test_refusal_reward_values() -> None:
    assert (REFUSAL_JUSTIFIED, REFUSAL_UNJUSTIFIED) == (0.5, -0.5)
    assert refusal_reward(rollout(REFUSAL_ANSWER, refused=True, docs=(MISS,)), GOLD, 0.0) == 0.5
    assert refusal_reward(rollout(REFUSAL_ANSWER, refused=True, docs=(MISS, HIT)), GOLD, 0.0) == -0.5
    assert refusal_reward(rollout(REFUSAL_ANSWER, refused=True, searches=0), GOLD, 0.0) == 0.0  # refused unsearched
    assert refusal_reward(rollout("Tarsk", docs=(HIT,)), GOLD, 1.0) == 1.0  # an answer keeps its correctness
    assert refusal_reward(rollout("Kesh", docs=(MISS,)), GOLD, 0.0) == 0.0


def test_refusal_presets_through_batch_rewards() -> None:
    rs = [rollout("Tarsk", docs=(HIT,)), rollout("Kesh", docs=(MISS,)),
          rollout(REFUSAL_ANSWER, refused=True, docs=(MISS,)), rollout(REFUSAL_ANSWER, refused=True, docs=(HIT,)),
          rollout(REFUSAL_ANSWER, refused=True, searches=0)]
    golds = [GOLD] * len(rs)
    out = batch_rewards(rs, golds, RewardConfig.preset("refusal-stage1"))
    assert [b.total for b in out] == [1.0, 0.0, 0.5, -0.5, 0.0]
    assert [b.parts["em"] for b in out] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert [b.parts["refused"] for b in out] == [0.0, 0.0, 1.0, 1.0, 1.0]
    # without the refusal reward a refusal is no answer: 0, even where its sentence holds a gold alias
    plain = batch_rewards([rollout(REFUSAL_ANSWER, refused=True)], [["retrieved documents"]],
                          RewardConfig.preset("routerag-stage1"))
    assert plain[0].total == 0.0
    # stage 2: RouteRAG's time term on top; a justified refusal earns it like a right answer, a penalty never does
    timed = [rollout("Tarsk", docs=(HIT,), ms=0.0), rollout(REFUSAL_ANSWER, refused=True, docs=(MISS,), ms=100.0),
             rollout(REFUSAL_ANSWER, refused=True, docs=(HIT,), ms=200.0)]
    big_t = float(np.percentile([0.0, 100.0, 200.0], 95))
    s = np.minimum(0.5 * np.array([0.0, 100.0, 200.0]) / big_t, 0.5)
    out = batch_rewards(timed, [GOLD] * 3, RewardConfig.preset("refusal-stage2"))
    assert [b.total for b in out] == pytest.approx([1 + s.mean() - s[0], 0.5 + s.mean() - s[1], -0.5])


def test_a_rollout_carries_the_refusal_from_its_trajectory() -> None:
    traj, _ = run([SEARCH, REFUSE])
    r = Rollout.from_trajectory(traj)
    assert r.refused and r.scored_answer is None and r.answer == REFUSAL_ANSWER
    assert Rollout.from_json(json.dumps(r.to_json())).refused  # through verl's extra_fields


# -- the warm start ---------------------------------------------------------------------------------------------------


def chat_tokenizer() -> CharTokenizer:
    tok = CharTokenizer()
    tok.apply_chat_template = lambda m, **kw: f"<user>{m[0]['content']}</user>"  # type: ignore[attr-defined]
    return tok


def policy_text(tok: CharTokenizer, ex) -> tuple[str, str]:
    text = tok.decode(ex.ids)
    return text, "".join(ch for ch, m in zip(text, ex.mask) if m)


def test_warm_start_refuses_where_no_retrieved_document_holds_the_answer() -> None:
    from training.sft import build_example, retrieval_plan

    tok = chat_tokenizer()
    item = QAItem("1", QUESTION, ["Tarsk"])
    miss = RetrievedDoc("b", "Other", "Nothing here.", 0.5)
    nowhere = {m: RetrievalResult(QUESTION, m, [miss]) for m in ("passage", "graph", "hybrid")}
    plan = retrieval_plan(item, nowhere, random.Random(0), label="graph")
    ex = build_example(item, plan, tok, random.Random(0), template=REFUSAL_INSTRUCTION, refuse=True)
    text, policy = policy_text(tok, ex)
    assert policy.endswith(f"<think>{REFUSE_THOUGHT}</think>\n<answer> [refuse] </answer>")
    assert parse_turn(policy.rsplit("</search>", 1)[1]).kind == "refuse"
    assert f"<answer> {REFUSE_MARKER} </answer> instead of guessing" in text.split("</user>")[0]  # the instruction
    # without refusals the same question ends with a guess
    _, guess = policy_text(tok, build_example(item, plan, tok, random.Random(0)))
    assert guess.endswith("<answer> Tarsk </answer>") and REFUSE_MARKER not in guess
    # where the answer was retrieved the policy answers, refusals on or not
    hit = RetrievedDoc("a", "Joran Veld", "Joran Veld was born in Tarsk.", 1.0)
    found = retrieval_plan(item, {**nowhere, "graph": RetrievalResult(QUESTION, "graph", [hit])}, random.Random(0),
                           label="graph")
    _, answered = policy_text(tok, build_example(item, found, tok, random.Random(0), template=REFUSAL_INSTRUCTION,
                                                 refuse=True))
    assert answered.endswith("<answer> Tarsk </answer>")


def test_refusal_examples_need_an_instruction_that_states_the_convention() -> None:
    from training.sft import PlannedSearch, build_example, refusal_template

    assert refusal_template(DEFAULT_INSTRUCTION) == REFUSAL_INSTRUCTION
    own = "Say [refuse] when unsure.\nQuestion: {question}\n"
    assert refusal_template(own) == own
    with pytest.raises(ValueError, match="refus"):
        refusal_template("Answer it.\nQuestion: {question}\n")
    plan = [PlannedSearch("graph", QUESTION, [RetrievedDoc("b", "Other", "Nothing here.", 0.5)])]
    with pytest.raises(ValueError, match="refusal convention"):
        build_example(QAItem("1", QUESTION, ["Tarsk"]), plan, chat_tokenizer(), random.Random(0), refuse=True)


def test_train_sft_with_refusals_writes_the_refusal_template_into_the_card(tmp_path: Path, monkeypatch, minilm,
                                                                          spacy_extractor) -> None:
    """``routerag train-sft --refusals`` end to end on a tiny random model: the question no document answers ends
    with a refusal, and the adapter's card carries the instruction that states the convention."""
    from routerag.policy.card import read_card

    from .helpers.server_helpers import build_small_index

    monkeypatch.setenv("ROUTERAG_CACHE_DIR", str(tmp_path / "cache"))
    index = build_small_index(tmp_path / "idx", minilm, spacy_extractor)
    qs = tmp_path / "qs.jsonl"
    qs.write_text("\n".join(json.dumps(q) for q in [
        {"question": "Where was Joran Veld born?", "answers": ["Tarsk"]},
        {"question": "Who painted the Ossel lighthouse?", "answers": ["Quillon Fenn"]},  # in no document
    ]) + "\n")
    out = tmp_path / "sft"
    res = CliRunner().invoke(app, ["train-sft", "--index", str(index), "--questions", str(qs), "--model",
                                   "tiny-random", "--refusals", "--out", str(out)], terminal_width=200)
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # the console wraps long lines
    assert "2 warm-start examples" in said and "retrieval plan" in said
    assert "1 end with a refusal" in said
    card = read_card(out / "adapter")
    assert card is not None and card.template == REFUSAL_INSTRUCTION
    assert card.trained["refusals"] is True and card.trained["refusal_examples"] == 1
