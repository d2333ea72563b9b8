"""The policy loop with a scripted policy, through every branch: passage, graph, both and no mode tags; malformed
tags; an exhausted budget; an answer at the first turn; information masking for training."""

from __future__ import annotations

import asyncio

import pytest

from routerag.policy import LoopConfig, PolicyLoop, parse_turn
from routerag.prompts import BUDGET_NOTICE, INVALID_NOTICE, REFUSAL_ANSWER

from .helpers.scripted import CharTokenizer, FakeSearch, ScriptedGenerator


def run(turns, *, cfg=None, search=None, tokenizer=None, **kw):
    gen = ScriptedGenerator(turns, tokenizer=tokenizer)
    search = search or FakeSearch()
    loop = PolicyLoop(gen, search, cfg or LoopConfig())
    events: list[dict] = []
    traj = asyncio.run(loop.run("Where was Joran Veld born?", on_event=events.append, **kw))
    return traj, gen, search, events


@pytest.mark.parametrize("tags, mode", [("[passage]", "passage"), ("[graph]", "graph"), ("[graph][passage]", "hybrid"),
                                        ("[passage] [graph]", "hybrid"), ("", "passage")])
def test_mode_tags_choose_the_retrieval_mode(tags: str, mode: str) -> None:
    traj, _, search, events = run([f"<think>look it up</think><search>{tags} Joran Veld birthplace</search>",
                                   "<think>it says Tarsk</think><answer> Tarsk </answer>"])
    assert search.calls == [("Joran Veld birthplace", mode, 3)]
    assert traj.answer == "Tarsk" and traj.finish == "answer" and traj.searches == 1 and traj.format_ok
    s = traj.steps[0]
    assert (s.action, s.mode, s.query, s.thought) == ("search", mode, "Joran Veld birthplace", "look it up")
    assert s.doc_titles == ["Joran Veld birthplace page 0", "Joran Veld birthplace page 1",
                            "Joran Veld birthplace page 2"]
    assert s.retrieval_ms == 3.0
    assert [e["type"] for e in events] == ["think", "search", "information", "think", "draft", "answer", "done"]


def test_information_is_appended_in_routerag_format() -> None:
    traj, gen, _, _ = run(["<search>[graph] q</search>", "<answer>x</answer>"])
    second_prompt = gen.requests[1].prompt_text
    assert second_prompt.endswith("<search>[graph] q</search>\n\n<information>Doc 1 (Title: q page 0) Text about q "
                                  "page 0.\nDoc 2 (Title: q page 1) Text about q page 1.\nDoc 3 (Title: q page 2) "
                                  "Text about q page 2.</information>\n\n")
    assert gen.requests[0].stop == ("</search>", "</answer>")


def test_answer_at_the_first_turn_needs_no_search() -> None:
    traj, _, search, _ = run(["<think>I know this</think><answer>Tarsk</answer>"])
    assert traj.answer == "Tarsk" and traj.searches == 0 and search.calls == [] and len(traj.steps) == 1


def test_malformed_tags_get_a_notice_then_an_answer_is_forced() -> None:
    traj, gen, search, _ = run(["<search>unclosed query", "<answer>half", "<search>   </search>", "Tarsk</answer>"],
                               cfg=LoopConfig(max_invalid=2))
    assert [s.action for s in traj.steps] == ["invalid", "invalid", "invalid", "forced_answer"]
    assert search.calls == []
    assert gen.requests[1].prompt_text.endswith(INVALID_NOTICE)
    assert gen.requests[3].prompt_text.endswith(BUDGET_NOTICE) and gen.requests[3].stop == ("</answer>",)
    assert traj.answer == "Tarsk" and traj.finish == "forced_answer" and not traj.format_ok


def test_budget_exhausted_forces_an_answer() -> None:
    turns = [f"<search>[passage] q{i}</search>" for i in range(3)] + ["<search>[graph] one more</search>",
                                                                       "<think>enough</think> Tarsk</answer>"]
    traj, gen, search, _ = run(turns, cfg=LoopConfig(budget=3))
    assert [c[0] for c in search.calls] == ["q0", "q1", "q2"]
    assert [s.action for s in traj.steps] == ["search", "search", "search", "over_budget", "forced_answer"]
    assert traj.steps[3].query == "one more"
    assert traj.answer == "Tarsk" and traj.searches == 3


def test_a_policy_that_answers_within_budget_is_not_forced() -> None:
    turns = ["<search>[passage] q0</search>", "<search>[passage] q1</search>", "<answer>A</answer>"]
    traj, _, _, _ = run(turns, cfg=LoopConfig(budget=2))
    assert traj.finish == "answer" and traj.format_ok


def test_force_mode_overrides_the_policy_choice_and_k_is_passed() -> None:
    traj, _, search, _ = run(["<search>[passage] q</search>", "<answer>x</answer>"],
                             cfg=LoopConfig(force_mode="graph", k=5))
    assert search.calls == [("q", "graph", 5)] and traj.steps[0].mode_tags == ["passage"]


def test_fresh_documents_show_the_next_documents_when_a_question_is_searched_again() -> None:
    turns = ["<search>[graph] q</search>", "<search>[passage] q</search>", "<search>[graph] other</search>",
             "<answer>x</answer>"]
    traj, gen, search, _ = run(turns, cfg=LoopConfig(fresh_documents=True, k=2, budget=3))
    # k more per document already shown, those left out: the same query reads its next two pages
    assert search.calls == [("q", "graph", 2), ("q", "passage", 4), ("other", "graph", 6)]
    assert [s.doc_titles for s in traj.steps[:3]] == [["q page 0", "q page 1"], ["q page 2", "q page 3"],
                                                      ["other page 0", "other page 1"]]
    assert "Doc 1 (Title: q page 2)" in gen.requests[2].prompt_text
    assert [d.title for r in traj.retrieved for d in r.docs] == [t for s in traj.steps[:3] for t in s.doc_titles]
    plain, _, _, _ = run(turns[:2] + turns[3:], cfg=LoopConfig(k=2))  # off (RouteRAG): the same pages again
    assert [s.doc_titles for s in plain.steps[:2]] == [["q page 0", "q page 1"]] * 2


def test_information_is_truncated_to_the_token_limit() -> None:
    long_docs = FakeSearch({"q": ["T"]})
    traj, gen, _, _ = run(["<search>q</search>", "<answer>x</answer>"], search=long_docs,
                          cfg=LoopConfig(max_information_tokens=10), tokenizer=CharTokenizer())
    info = [s for s in traj.segments if s.kind == "information"][0]
    assert info.text == "\n\n<information>Doc 1 (Tit</information>\n\n"  # 10 characters = 10 toy tokens


def test_token_tracking_marks_what_the_policy_wrote() -> None:
    tok = CharTokenizer()
    traj, gen, _, _ = run(["<search>[graph] q</search>", "<answer>x</answer>"], tokenizer=tok)
    kinds = [s.kind for s in traj.segments]
    assert kinds == ["prompt", "policy", "information", "policy"]
    # the context the model saw at turn 2 is exactly the concatenation of the segments so far, as tokens
    assert gen.requests[1].prompt_ids == [t for s in traj.segments[:3] for t in s.token_ids]
    assert tok.decode(traj.segments[1].token_ids) == "<search>[graph] q</search>"
    assert traj.segments[1].logprobs == [-0.5] * len("<search>[graph] q</search>")
    assert traj.segments[2].logprobs is None  # appended information has no log-probabilities: it is masked
    assert traj.text == "".join(s.text for s in traj.segments[1:])


def test_response_token_budget_cuts_a_runaway_trajectory() -> None:
    turns = ["<search>q</search>"] * 10
    traj, _, _, _ = run(turns, cfg=LoopConfig(budget=10, max_total_tokens=40), tokenizer=CharTokenizer())
    assert traj.finish == "no_answer" and traj.answer is None and traj.steps[-1].action == "truncated"


def test_answer_generator_writes_the_final_answer_from_all_documents() -> None:
    answerer = ScriptedGenerator([lambda req: "Tarsk</answer>" if "Doc 4" in req.prompt_text else "wrong"])
    turns = ["<search>a</search>", "<search>b</search>", "<answer>policy says X</answer>"]
    traj, _, _, _ = run(turns, cfg=LoopConfig(answer_generator=answerer))
    assert traj.policy_answer == "policy says X" and traj.answer == "Tarsk"
    assert "Question: Where was Joran Veld born?" in answerer.requests[0].prompt_text


@pytest.mark.parametrize("text, kind, content", [
    ("<think>a</think>\n<search>[graph] x y </search>", "search", "x y"),
    ("<answer>  New   York </answer>", "answer", "New York"),
    ("<search>[graph]</search>", "invalid", ""),
    ("no tags at all", "invalid", ""),
    ("<ANSWER>Yes</ANSWER>", "answer", "Yes"),
])
def test_parse_turn(text: str, kind: str, content: str) -> None:
    a = parse_turn(text)
    assert (a.kind, a.content) == (kind, content)


def test_an_echo_of_the_budget_notice_is_no_answer() -> None:
    turns = ["<search>q</search>", "<search>again</search>", "The search budget is used up. I must answer now.</answer>"]
    traj, _, _, _ = run(turns, cfg=LoopConfig(budget=1))
    assert [s.action for s in traj.steps] == ["search", "over_budget", "forced_answer"]
    assert traj.finish == "no_answer" and traj.answer is None


def test_answer_generator_time_counts_as_generation() -> None:
    answerer = ScriptedGenerator(["Tarsk</answer>"])
    traj, _, _, _ = run(["<answer>x</answer>"], cfg=LoopConfig(answer_generator=answerer))
    assert traj.answer == "Tarsk" and traj.generation_ms >= traj.answer_generation_ms > 0


def test_a_query_the_retriever_refuses_is_an_invalid_turn_not_a_crash() -> None:
    from routerag.retrieval.types import QueryError

    class Refusing(FakeSearch):
        async def search(self, query, mode, k):
            if len(query) > 10:
                raise QueryError("query longer than 10 characters")
            return await super().search(query, mode, k)

    traj, gen, _, _ = run(["<search>a very long query indeed</search>", "<search>short</search>", "<answer>x</answer>"],
                          search=Refusing())
    assert [s.action for s in traj.steps] == ["invalid", "search", "answer"]
    assert "That search failed: query longer than 10 characters" in gen.requests[1].prompt_text


def test_loop_config_from_policy_settings_carries_the_served_template(tmp_path) -> None:
    """Server and trainers build their loop from the same [policy] settings, so a custom prompt template is the
    one the policy is trained on too; the trainer's own budget and sampling override."""
    from routerag.config import PolicyConfig

    tpl = tmp_path / "prompt.txt"
    tpl.write_text("Answer briefly.\nQ: {question}\n")
    pol = PolicyConfig(template_file=tpl, max_invalid=5, budget=3, generator={"temperature": 0.0})
    served = LoopConfig.from_policy(pol)
    assert (served.template, served.max_invalid, served.budget, served.temperature) == (tpl.read_text(), 5, 3, 0.0)
    trained = LoopConfig.from_policy(pol, budget=2, temperature=1.0)
    assert (trained.template, trained.max_invalid, trained.budget, trained.temperature) == (tpl.read_text(), 5, 2, 1.0)


def test_citations_are_the_retrieved_passages_that_state_the_answer() -> None:
    """Each retrieved passage whose sentence holds the normalised answer as whole tokens is cited once, with that
    sentence, in retrieval order; no answer or an answer nowhere in the evidence cites nothing."""
    from routerag.policy.citations import cite, split_sentences
    from routerag.retrieval.types import RetrievedDoc

    docs = [RetrievedDoc("a", "Joran Veld", "Joran Veld is a painter. He was born in Tarsk, on the Ossel.", 1.0),
            RetrievedDoc("b", "Tarsks", "Tarsks are boats.", 0.9),
            RetrievedDoc("a", "Joran Veld", "Joran Veld is a painter. He was born in Tarsk, on the Ossel.", 0.8),
            RetrievedDoc("c", "Tarsk", "Tarsk is a town.\nThe town of Tarsk sits astride the Ossel.", 0.7)]
    got = cite("the Tarsk", docs)
    assert [(c.id, c.sentence) for c in got] == [("a", "He was born in Tarsk, on the Ossel."), ("c", "Tarsk is a town.")]
    assert cite(None, docs) == [] and cite("  ", docs) == [] and cite("Ossel waterway", docs) == []
    assert split_sentences("The U.S. army left. 1990 was next.") == ["The U.S. army left.", "1990 was next."]


@pytest.mark.parametrize("peek, refused", [(" [refuse]", True), (" Tars", False)])
def test_with_a_reader_the_answer_turn_stops_after_its_first_tokens(peek: str, refused: bool) -> None:
    """When a reader writes the final answer, the policy's answer turn stops at ``<answer>`` and a few more tokens
    tell a refusal (which stands) from an answer (the reader's replaces it); the peeked tokens continue the same
    context, so the trajectory's tokens are what the policy wrote, with their log-probabilities."""
    reader = ScriptedGenerator(["Tarsk</answer>"], tokenizer=CharTokenizer())
    traj, gen, _, events = run(["<search>[graph] q</search>", "<think>found</think>\n<answer>", peek],
                               cfg=LoopConfig(answer_generator=reader), tokenizer=CharTokenizer())
    answer_turn, peek_request = gen.requests[1], gen.requests[2]
    assert "<answer>" in answer_turn.stop and peek_request.max_tokens == 5
    assert peek_request.prompt_ids == answer_turn.prompt_ids + [ord(c) for c in "<think>found</think>\n<answer>"]
    assert traj.segments[-1].text == "<think>found</think>\n<answer>" + peek
    assert traj.segments[-1].logprobs == [-0.5] * len(traj.segments[-1].token_ids)
    assert traj.refused is refused and traj.steps[-1].thought == "found"
    assert traj.policy_answer == ("[refuse]" if refused else None)
    assert traj.answer == (REFUSAL_ANSWER if refused else "Tarsk")
    assert len(reader.requests) == (0 if refused else 1)
    assert [e for e in events if e["type"] == "answer"][0]["refused"] is refused
