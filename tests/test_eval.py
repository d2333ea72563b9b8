"""The evaluation harness with a scripted policy (no model, no index): exact metrics, recall, cost and mode mix per
strategy; resuming; reports and plots; the CLI's argument handling."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from routerag.cli import app
from routerag.config import Settings
from routerag.engine import Engine
from routerag.evaluation import (EvalOptions, ResultsLog, evaluate_strategy, parse_strategies, run_evaluation,
                                 summarize, tradeoff)
from routerag.policy.card import resolve_policy
from routerag.prompts import DIRECT_TEMPLATE, chatml

from .helpers.scripted import CharTokenizer, FakeSearch, ScriptedGenerator

# -- a scripted policy whose every turn depends on the question -------------------------------------------------------

POLICY = {
    "Where was Joran Veld born?": ["<think>look</think><search>[graph] Joran Veld</search>", "<answer>Tarsk</answer>"],
    "What does Tarsk trade?": ["<search>[passage] Tarsk</search>", "<search>[graph][passage] Tarsk harbour</search>",
                               "<answer>amber and wool</answer>"],
    "Who made the chapel windows?": ["<answer>Mira Joran</answer>"],
    "Which river flows through Vass?": ["I think it is a river.", "<search>[graph] Vass river</search>",
                                        "<answer>River Aun.</answer>"],
}
DIRECT = {  # what the model says without documents, and from naive RAG's documents
    "Where was Joran Veld born?": "Kesh", "What does Tarsk trade?": "salt and amber",
    "Who made the chapel windows?": "Joran Veld", "Which river flows through Vass?": "",
}
SEARCH_DOCS = {
    "Joran Veld": ["Joran Veld", "Veld family", "Mira Joran"],
    "Tarsk": ["Tarsk", "Amber", "Kesh"],
    "Tarsk harbour": ["Tarsk", "Ossel", "Amber"],
    "Vass river": ["Vass", "River Pell", "Brannock"],
    "Where was Joran Veld born?": ["Joran Veld", "Tarsk", "Kesh"],
}


def gold(title: str) -> dict:
    return {"title": title, "text": f"Text about {title}."}  # FakeSearch's text, so content hashes match


QUESTIONS = [
    {"id": "q1", "question": "Where was Joran Veld born?", "answers": ["Tarsk"],
     "supporting": [gold("Joran Veld"), gold("Tarsk")]},
    {"id": "q2", "question": "What does Tarsk trade?", "answers": ["amber and salt", "Amber"],
     "supporting": [gold("Tarsk"), {"title": "Ossel"}]},  # title-only gold is matched by title
    {"id": "q3", "question": "Who made the chapel windows?", "answers": ["Joran Veld"],
     "supporting": [gold("Joran Veld")]},
    {"id": "q4", "question": "Which river flows through Vass?", "answers": ["the River Aun"]},  # no gold passages
]


def respond(req) -> str:
    prompt = req.prompt_text
    question = prompt.split("Question: ", 1)[1].split("\n", 1)[0]
    if "Answer the question using the documents below" in prompt or "Answer the question. Write only" in prompt:
        return f"<answer> {DIRECT[question]} </answer>"  # naive RAG or no retrieval
    after = prompt.split("<|im_start|>assistant\n", 1)[1]
    turn = after.count("</information>") + after.count("My previous action is invalid")
    return POLICY[question][turn]


def make_engine(tmp_path: Path | None = None, *, tokenizer=None, search: FakeSearch | None = None,
                settings: Settings | None = None) -> Engine:
    gen = ScriptedGenerator([respond] * 1000, tokenizer=tokenizer)
    settings = settings or Settings()
    if settings.policy.query is None:  # the scripted policy's queries are searched as written (test_grounding.py)
        settings = settings.model_copy(update={"policy": settings.policy.model_copy(update={"query": "free"})})
    return Engine("unused", settings, generator=gen, search=search or FakeSearch(dict(SEARCH_DOCS)),
                  retriever=SimpleNamespace(passages=[]))  # type: ignore[arg-type]


def calls(engine: Engine) -> int:
    return len(engine.generator.requests)  # type: ignore[attr-defined]


@pytest.fixture
def qfile(tmp_path: Path) -> Path:
    p = tmp_path / "toy.jsonl"
    p.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return p


def evaluate(engine: Engine, files, out: Path, **kw) -> dict:
    kw.setdefault("progress", False)
    kw.setdefault("concurrency", 3)
    return run_evaluation(engine, files if isinstance(files, list) else [files], out, EvalOptions(**kw),
                          command="routerag eval test")


def records_of(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


# -- exact metrics ----------------------------------------------------------------------------------------------------

def test_learned_policy_metrics_are_exact(tmp_path: Path, qfile: Path) -> None:
    engine = make_engine()
    overview = evaluate(engine, qfile, tmp_path / "out", strategies=["learned"])
    s = overview["datasets"][0]["summaries"]["learned"]
    assert calls(engine) == 2 + 3 + 1 + 3
    assert s["questions"] == 4 and s["errors"] == 0
    assert s["em"] == 0.5
    assert s["f1"] == pytest.approx((1 + 2 / 3 + 0.5 + 1) / 4)  # "amber and wool" vs "amber and salt": 2/3
    assert s["gen_acc"] == 0.75  # the alias "Amber" is a span of "amber and wool"
    assert s["searches"] == 1.0
    assert s["tradeoff"] == pytest.approx(100 * (0.5 + (1 + 2 / 3 + 0.5 + 1) / 4 + 0.75) / 3)
    assert s["mode_mix"] == {"passage": 0.25, "graph": 0.5, "hybrid": 0.25}
    assert s["mode_counts"] == {"passage": 1, "graph": 2, "hybrid": 1}
    # recall over q1..q3 (q4 has no gold): q1 finds 1 of 2; q2 Tarsk at 1, Ossel at 4; q3 never searched
    assert s["recall@2"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert s["recall@5"] == s["recall@10"] == s["recall_all"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert s["format_ok"] == 0.75  # q4's invalid first turn
    assert s["retrieval_ms"] == 3.0 and s["retrieval_ms_per_search"] == 3.0  # FakeSearch: 3 ms per search
    assert s["finish"] == {"answer": 4}

    recs = records_of(tmp_path / "out" / "toy" / "learned.jsonl")
    q2 = recs["q2"]
    assert q2["modes"] == ["passage", "hybrid"] and q2["queries"] == ["Tarsk", "Tarsk harbour"]
    assert q2["doc_ids"] == ["id-Tarsk", "id-Amber", "id-Kesh", "id-Ossel"] and q2["retrieved"] == 4
    assert (q2["recall@2"], q2["recall@5"]) == (0.5, 1.0)
    assert q2["prediction"] == "amber and wool" and q2["answers"] == ["amber and salt", "Amber"]
    assert recs["q3"]["searches"] == 0 and recs["q3"]["recall_all"] == 0.0 and recs["q3"]["f1"] == 0.5
    assert recs["q4"]["recall@2"] is None and recs["q4"]["format_ok"] is False and recs["q4"]["em"] == 1.0
    assert recs["q1"]["search_ms"] == [3.0] and recs["q1"]["wall_ms"] >= 0


def test_forced_modes_route_every_search(tmp_path: Path, qfile: Path) -> None:
    engine = make_engine()
    overview = evaluate(engine, qfile, tmp_path / "out", strategies=["graph", "passage"])
    summ = overview["datasets"][0]["summaries"]
    assert list(summ) == ["graph", "passage"]
    assert summ["graph"]["mode_mix"] == {"passage": 0.0, "graph": 1.0, "hybrid": 0.0}
    assert summ["passage"]["mode_mix"] == {"passage": 1.0, "graph": 0.0, "hybrid": 0.0}
    assert summ["graph"]["em"] == summ["passage"]["em"] == 0.5  # same scripted answers
    modes = {m for _, m, _ in engine.search.calls}  # type: ignore[attr-defined]
    assert modes == {"graph", "passage"}


def test_naive_rag_and_no_retrieval(tmp_path: Path, qfile: Path) -> None:
    engine = make_engine()
    overview = evaluate(engine, qfile, tmp_path / "out", strategies=["naive-rag", "no-retrieval"])
    summ = overview["datasets"][0]["summaries"]
    # one search per question: the question itself, in the settings' mode (hybrid), k = 3
    assert sorted(engine.search.calls) == sorted((q["question"], "hybrid", 3) for q in QUESTIONS)  # type: ignore
    prompts = [r.prompt_text for r in engine.generator.requests]  # type: ignore[attr-defined]
    assert sum("Doc 1 (Title: Joran Veld) Text about Joran Veld." in p for p in prompts) == 1
    naive, none = summ["naive-rag"], summ["no-retrieval"]
    # answers: Kesh (wrong), "salt and amber" (F1 1: a bag of words; GenAcc via the alias Amber; not EM),
    # Joran Veld (right), "" (empty)
    assert (naive["em"], naive["f1"], naive["gen_acc"]) == (0.25, 0.5, 0.5)
    assert naive["searches"] == 1.0 and naive["mode_mix"]["hybrid"] == 1.0
    assert naive["tradeoff"] == pytest.approx(100 * (0.25 + 0.5 + 0.5) / 3)
    assert naive["recall@2"] == pytest.approx((1.0 + 0.0 + 0.0) / 3)  # only q1's question retrieves gold
    assert naive["format_ok"] is None and none["format_ok"] is None
    assert (none["em"], none["f1"], none["gen_acc"]) == (naive["em"], naive["f1"], naive["gen_acc"])
    assert none["searches"] == 0 and none["tradeoff"] == 0.0 and none["recall@5"] is None
    assert none["mode_mix"] == {"passage": 0.0, "graph": 0.0, "hybrid": 0.0}
    assert len(engine.search.calls) == 4  # type: ignore[attr-defined]  (no-retrieval searched nothing)
    recs = records_of(tmp_path / "out" / "toy" / "no-retrieval.jsonl")
    assert recs["q4"]["prediction"] == "" and recs["q4"]["f1"] == 0.0 and recs["q4"]["gen_acc"] == 0.0


def test_naive_rag_uses_the_settings_mode_and_k(tmp_path: Path, qfile: Path) -> None:
    engine = make_engine(settings=Settings(retrieval={"mode": "passage"}))
    evaluate(engine, qfile, tmp_path / "out", strategies=["naive-rag"], k=2)
    assert {(m, k) for _, m, k in engine.search.calls} == {("passage", 2)}  # type: ignore[attr-defined]


def test_one_search_in_each_fixed_mode_with_the_policys_reader(tmp_path: Path, qfile: Path) -> None:
    """naive-passage / naive-graph / naive-hybrid: the question searched once in that mode, then read by the same
    reader as the policy's final answer (here the policy model with the short-answer step, which cuts a sentence to
    the span of the documents it names); answer recall and the per-type breakdown are recorded."""
    rows = [{**q, "type": "bridge" if n % 2 else "comparison"} for n, q in enumerate(QUESTIONS)]
    qf = tmp_path / "typed.jsonl"
    qf.write_text("".join(json.dumps(q) + "\n" for q in rows))

    def reply(req):
        if "Answer the question using the documents below" in req.prompt_text and "chapel windows" in req.prompt_text:
            return "<answer> I think Joran Veld made them </answer>"
        return respond(req)

    settings = Settings(policy={"reader": "policy", "short_answer": True, "query": "free"})
    docs = {**SEARCH_DOCS, "Who made the chapel windows?": ["Chapel", "Joran Veld"]}
    engine = Engine("unused", settings, generator=ScriptedGenerator([reply] * 100), search=FakeSearch(docs),
                    retriever=SimpleNamespace(passages=[]))
    strategies = ["learned", "naive-passage", "naive-graph", "naive-hybrid"]
    overview = evaluate(engine, qf, tmp_path / "out", strategies=strategies)
    calls = engine.search.calls  # type: ignore[attr-defined]
    questions = sorted(r["question"] for r in rows)
    for mode in ("passage", "graph", "hybrid"):
        assert sorted(q for q, m, _ in calls if m == mode and q in questions) == questions
    summ = overview["datasets"][0]["summaries"]
    for name in strategies[1:]:
        recs = records_of(tmp_path / "out" / "typed" / f"{name}.jsonl")
        assert recs["q3"]["prediction"] == "Joran Veld" and recs["q3"]["em"] == 1.0, (name, recs["q3"])
        assert recs["q3"]["answer_recall"] == 1.0 and recs["q3"]["type"] == "comparison"
        assert recs["q1"]["answer_recall"] == 1.0  # the page "Tarsk" came back
        assert recs["q2"]["answer_recall"] == 0.0  # no document names amber
    assert summ["naive-graph"]["mode_mix"]["graph"] == 1.0 and summ["naive-graph"]["searches"] == 1.0
    assert set(summ["learned"]["by_type"]) == {"bridge", "comparison"}
    assert summ["learned"]["by_type"]["comparison"]["questions"] == 2
    report = (tmp_path / "out" / "typed" / "report.md").read_text()
    assert "## By question type" in report and "| comparison | naive-graph |" in report


def test_tokens_and_generation_time_are_counted_without_the_loop(tmp_path: Path, qfile: Path) -> None:
    engine = make_engine(tokenizer=CharTokenizer())
    evaluate(engine, qfile, tmp_path / "out", strategies=["no-retrieval"], limit=1)
    rec = records_of(tmp_path / "out" / "toy" / "no-retrieval.jsonl")["q1"]
    q = QUESTIONS[0]["question"]
    assert rec["prompt_tokens"] == len(chatml(DIRECT_TEMPLATE.format(question=q)))  # one toy token per character
    assert rec["completion_tokens"] == len("<answer> Kesh </answer>")
    assert rec["generation_ms"] >= 0 and rec["prediction"] == "Kesh"


def test_metric_edge_cases_through_the_harness(tmp_path: Path) -> None:
    """PopQA's JSON-encoded alias lists, normalisation, aliases, verbose and empty predictions."""
    rows = [
        ("Rankin's occupation?", ["politician", "political leader"], "The Politician!", (1.0, 1.0, 1.0)),
        ("Smith's occupation?", ["politician", "political leader"], "a Political Leader.", (1.0, 1.0, 1.0)),
        ("Jones's occupation?", ["politician"], "He was a politician in Australia", (0.0, 1 / 3, 1.0)),
        ("Brown's occupation?", ["politician"], "", (0.0, 0.0, 0.0)),
        ("Green's occupation?", ["Saint Paul"], "St Paul", (0.0, 0.5, 0.0)),
    ]
    data = [{"id": i, "question": q, "possible_answers": json.dumps(golds),
             "paragraphs": [{"title": "Politician", "text": "Text about Politician.", "is_supporting": True},
                            {"title": "Other", "text": "Text about Other.", "is_supporting": False}]}
            for i, (q, golds, _, _) in enumerate(rows)]
    qf = tmp_path / "popqa.json"
    qf.write_text(json.dumps(data))
    answers = {q: a for q, _, a, _ in rows}
    gen = ScriptedGenerator([lambda r: f"<answer>{answers[r.prompt_text.split('Question: ')[1].split(chr(10))[0]]}"
                                       "</answer>"] * 20)
    search = FakeSearch({row[0]: ["Politician", "Other"] if n % 2 else ["Other", "Politician"]
                         for n, row in enumerate(rows)})
    engine = Engine("unused", Settings(), generator=gen, search=search, retriever=SimpleNamespace(passages=[]))
    evaluate(engine, qf, tmp_path / "out", strategies=["naive-rag"], k=2)
    recs = records_of(tmp_path / "out" / "popqa" / "naive-rag.jsonl")
    for i, (_, golds, pred, (em, f, ga)) in enumerate(rows):
        r = recs[str(i)]
        assert r["answers"] == golds and r["prediction"] == pred
        assert (r["em"], r["gen_acc"]) == (em, ga) and r["f1"] == pytest.approx(f), r
        assert r["recall@2"] == 1.0 and r["gold_passages"] == 1


# -- resuming ---------------------------------------------------------------------------------------------------------

def test_resume_evaluates_only_missing_questions(tmp_path: Path, qfile: Path) -> None:
    out = tmp_path / "out"
    engine = make_engine()
    evaluate(engine, qfile, out, strategies=["learned"], limit=2)  # "killed" after q1, q2
    assert calls(engine) == 2 + 3
    log = out / "toy" / "learned.jsonl"
    assert set(records_of(log)) == {"q1", "q2"}

    engine = make_engine()
    overview = evaluate(engine, qfile, out, strategies=["learned"])
    assert calls(engine) == 1 + 3  # q3 and q4 only
    assert overview["datasets"][0]["this_run"]["learned"] == {"evaluated": 2, "resumed": 2,
                                                             "elapsed_s": pytest.approx(0, abs=5)}
    assert overview["datasets"][0]["summaries"]["learned"]["questions"] == 4

    # delete q1's line and tear the last line: both are evaluated again, nothing else
    lines = log.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if json.loads(ln)["id"] != "q1"]
    torn_id = json.loads(kept[-1])["id"]
    log.write_text("".join(kept[:-1]) + kept[-1][: len(kept[-1]) // 2])
    engine = make_engine()
    overview = evaluate(engine, qfile, out, strategies=["learned"])
    expected = {"q1": 2, "q2": 3, "q3": 1, "q4": 3}
    assert calls(engine) == expected["q1"] + expected[torn_id]
    recs = [json.loads(ln) for ln in log.read_text().splitlines()]  # every line parses again
    assert sorted(r["id"] for r in recs) == ["q1", "q2", "q3", "q4"]
    assert overview["datasets"][0]["summaries"]["learned"]["em"] == 0.5  # same numbers as one clean run

    # a last call over everything evaluates nothing
    engine = make_engine()
    evaluate(engine, qfile, out, strategies=["learned"])
    assert calls(engine) == 0


def test_failed_questions_are_recorded_then_retried(tmp_path: Path, qfile: Path) -> None:
    def flaky(req):
        if "Vass" in req.prompt_text:
            raise ConnectionError("backend down")
        return respond(req)

    out = tmp_path / "out"
    gen = ScriptedGenerator([flaky] * 100)
    engine = Engine("unused", Settings(policy={"query": "free"}), generator=gen, search=FakeSearch(dict(SEARCH_DOCS)),
                    retriever=SimpleNamespace(passages=[]))
    overview = evaluate(engine, qfile, out, strategies=["learned"])
    s = overview["datasets"][0]["summaries"]["learned"]
    assert s["errors"] == 1 and s["finish"] == {"answer": 3, "error": 1} and s["em"] == 0.25
    assert "ConnectionError: backend down" in records_of(out / "toy" / "learned.jsonl")["q4"]["error"]
    engine = make_engine()
    overview = evaluate(engine, qfile, out, strategies=["learned"])
    assert calls(engine) == 3 and overview["datasets"][0]["summaries"]["learned"]["errors"] == 0


def test_too_many_failures_stop_the_run(tmp_path: Path, qfile: Path) -> None:
    from routerag.evaluation import EvaluationError

    def broken(req):
        raise RuntimeError("no model")

    engine = Engine("unused", Settings(), generator=ScriptedGenerator([broken] * 10), search=FakeSearch(),
                    retriever=SimpleNamespace(passages=[]))
    with pytest.raises(EvaluationError, match="2 questions failed"):
        evaluate(engine, qfile, tmp_path / "out", strategies=["learned"], max_errors=2, concurrency=1)


def test_other_settings_refuse_to_mix_unless_fresh(tmp_path: Path, qfile: Path) -> None:
    out = tmp_path / "out"
    evaluate(make_engine(), qfile, out, strategies=["learned", "no-retrieval"])
    with pytest.raises(ValueError, match="budget"):
        evaluate(make_engine(), qfile, out, strategies=["learned"], budget=3)
    with pytest.raises(ValueError, match="policy.generator.model"):
        evaluate(make_engine(settings=Settings(policy={"generator": {"model": "other"}})), qfile, out,
                 strategies=["learned"])
    # speed-only settings and concurrency may change between runs
    fast = Settings(policy={"generator": {"max_batch": 2}}, retrieval={"batch_size": 8})
    engine = make_engine(settings=fast)
    evaluate(engine, qfile, out, strategies=["learned"], concurrency=1)
    assert calls(engine) == 0
    engine = make_engine()
    evaluate(engine, qfile, out, strategies=["no-retrieval"], budget=3)  # budget does not matter without the loop
    assert calls(engine) == 0
    engine = make_engine()
    evaluate(engine, qfile, out, strategies=["learned"], budget=2, fresh=True)
    assert calls(engine) == 9
    assert len((out / "toy" / "learned.jsonl").read_text().splitlines()) == 4


def test_results_log_repairs_a_torn_tail(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"id": "a", "em": 1}\n{"id": "a", "em": 0}\n{"id": "b", "em"')
    log = ResultsLog(p)
    assert log.load() == {"a": {"id": "a", "em": 0}}  # the last record of an id wins; the torn one is gone
    log.append({"id": "b", "em": 1})
    log.close()
    assert [json.loads(x)["id"] for x in p.read_text().splitlines()] == ["a", "a", "b"]


def test_concurrency_bounds_questions_in_flight(tmp_path: Path, qfile: Path) -> None:
    inner = ScriptedGenerator([respond] * 100)
    state = {"now": 0, "max": 0}

    class Slow:
        name, tracks_tokens, tokenizer = "slow", False, None

        def render_prompt(self, message):
            return inner.render_prompt(message)

        async def generate(self, request):
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            await asyncio.sleep(0.01)
            state["now"] -= 1
            return await inner.generate(request)

    engine = Engine("unused", Settings(), generator=Slow(), search=FakeSearch(dict(SEARCH_DOCS)),
                    retriever=SimpleNamespace(passages=[]))
    overview = evaluate(engine, qfile, tmp_path / "out", strategies=["learned"], concurrency=2, progress=True)
    assert state["max"] == 2 and overview["datasets"][0]["summaries"]["learned"]["em"] == 0.5


# -- reports ----------------------------------------------------------------------------------------------------------

def test_reports_and_plots_are_written_and_parse(tmp_path: Path, qfile: Path) -> None:
    import matplotlib.image

    second = tmp_path / "sub" / "toy.jsonl"  # same stem: gets its own folder
    second.parent.mkdir()
    second.write_text(qfile.read_text())
    out = tmp_path / "out"
    modes = ["learned", "hybrid", "naive-rag", "no-retrieval"]
    evaluate(make_engine(), [qfile, second], out, strategies=modes)
    overview = json.loads((out / "report.json").read_text())
    assert overview["command"] == "routerag eval test"
    assert [d["dataset"] for d in overview["datasets"]] == ["toy", "toy-2"]
    default_budget = resolve_policy(Settings().policy).loop["budget"]  # the shipped router's card
    assert overview["config"]["strategies"] == modes and overview["config"]["budget"] == default_budget
    assert "tradeoff" in overview["definitions"]
    top_md = (out / "report.md").read_text()
    assert "[toy-2/report.md](toy-2/report.md)" in top_md
    finish = overview["datasets"][0]["summaries"]["learned"]["finish"]
    assert f"| {', '.join(f'{k} {v}' for k, v in sorted(finish.items(), key=lambda kv: -kv[1]))} |" in top_md
    for name in ("toy", "toy-2"):
        d = out / name
        rep = json.loads((d / "report.json").read_text())
        assert list(rep["summaries"]) == modes and rep["questions"] == 4
        assert rep["summaries"]["learned"]["em"] == 0.5
        md = (d / "report.md").read_text()
        header = next(ln for ln in md.splitlines() if ln.startswith("| strategy | n |"))
        table = md.splitlines()[md.splitlines().index(header):]
        rows = [ln for ln in table[2:] if ln.startswith("|")][: len(modes)]
        assert [r.split("|")[1].strip() for r in rows] == modes
        ncols = header.count("|")
        assert all(r.count("|") == ncols for r in rows)
        assert re.search(r"^\| learned \| 4 \| 50\.0 \|", md, re.M)
        assert "| strategy | searches | passage % | graph % | hybrid % |" in md
        for png in rep["plots"].values():
            data = (d / png).read_bytes()
            assert data.startswith(b"\x89PNG\r\n\x1a\n")
            assert matplotlib.image.imread(d / png).ndim == 3
        assert not list(d.glob("*.tmp*"))


def test_summary_of_nothing_and_tradeoff_definition() -> None:
    s = summarize([])
    assert s["questions"] == 0 and s["em"] == 0.0 and s["tradeoff"] == 0.0 and s["recall@2"] is None
    assert tradeoff(0.5, 0.5, 0.5, 0.0) == 0.0
    assert tradeoff(0.3, 0.6, 0.9, 2.0) == pytest.approx(30.0)


def test_parse_strategies() -> None:
    assert parse_strategies("learned, naive-rag,learned") == ["learned", "naive-rag"]
    assert parse_strategies(["passage,graph", "hybrid"]) == ["passage", "graph", "hybrid"]
    with pytest.raises(ValueError, match="unknown mode 'web'"):
        parse_strategies("learned,web")
    with pytest.raises(ValueError, match="no modes"):
        parse_strategies(" , ")


def test_evaluate_strategy_directly(tmp_path: Path) -> None:
    from routerag.datasets import load_questions

    p = tmp_path / "q.jsonl"
    p.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    engine = make_engine()
    items = load_questions(p)
    run = asyncio.run(evaluate_strategy(engine, items, "no-retrieval", tmp_path / "o",
                                        EvalOptions(progress=False), {"policy": {}, "index": None}))
    assert [r["id"] for r in run.records] == ["q1", "q2", "q3", "q4"] and run.evaluated == 4 and run.resumed == 0


# -- CLI --------------------------------------------------------------------------------------------------------------

def test_cli_help_and_argument_errors(tmp_path: Path, qfile: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "--help"])
    assert res.exit_code == 0
    for opt in ("--questions", "--out", "--modes", "--limit", "--concurrency", "--budget", "-k", "--policy",
                "--backend", "--base-url", "--adapter", "--config", "--fresh"):
        assert opt in res.output
    res = runner.invoke(app, ["eval", str(tmp_path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--questions" in res.output
    res = runner.invoke(app, ["eval", str(tmp_path), "-q", str(qfile), "--out", str(tmp_path / "o"),
                              "--modes", "learned,web"])
    assert res.exit_code == 2 and "unknown mode 'web'" in res.output
    res = runner.invoke(app, ["eval", str(tmp_path), "-q", str(tmp_path / "missing.json"), "--out",
                              str(tmp_path / "o")])
    assert res.exit_code == 2 and "no such question file" in res.output
    res = runner.invoke(app, ["eval", str(tmp_path / "noindex"), "-q", str(qfile), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "no such index directory" in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\n')
    res = runner.invoke(app, ["eval", str(tmp_path), "-q", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "no gold answer" in res.output  # the file's content, not the command line
    res = runner.invoke(app, ["eval", str(tmp_path), "-q", str(qfile), "--out", str(tmp_path / "o"),
                              "--concurrency", "0"])
    assert res.exit_code == 2
