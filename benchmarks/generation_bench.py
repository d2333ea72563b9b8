"""Generation speed of the embedded policy: eager transformers against the ONNX Runtime GenAI engine at each
precision (and llama.cpp with ``--llama``), side by side in one process, on the same prompts; and ``/ask``'s p50
with each.

Why: every user-facing and training path waits on generation (issue 35). Eager ``generate`` spends most of a token
on per-operation overhead; a decoder step need only read the weights once, so the floor is the weights' bytes over
the memory bandwidth, printed beside the measurements.

Tokens/s at batch 1 (each prompt alone, interleaved across engines) and at batch 16 (all prompts in one batch),
greedy, the shipped router (adapter merged in the engine), policy prompts built from the sample questions with and
without an ``<information>`` block; greedy equality with eager per prompt. ``--ask`` adds ``Engine.ask`` p50 on the
sample index, one question at a time after a warm-up::

    python benchmarks/generation_bench.py --new-tokens 64 --ask indexes/sample --json /tmp/gen.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

SAMPLES = Path(__file__).resolve().parents[1] / "routerag" / "samples"


def policy_prompts(gen: Any, n: int) -> list[tuple[str, list[int]]]:
    """``n`` first-turn and later-turn policy prompts from the sample questions and corpus."""
    from routerag.prompts import DEFAULT_INSTRUCTION, DOCUMENT, INFORMATION_BLOCK

    qs = [json.loads(x)["question"] for x in (SAMPLES / "questions.jsonl").read_text().splitlines() if x.strip()]
    docs = [json.loads(x) for x in (SAMPLES / "corpus.jsonl").read_text().splitlines() if x.strip()]
    out = []
    for i in range(n):
        q = qs[i % len(qs)]
        text, _ = gen.render_prompt(DEFAULT_INSTRUCTION.format(question=q))
        if i % 2 == 0:  # a later turn: one search done, its documents appended
            chosen = [docs[(i + j) % len(docs)] for j in range(3)]
            info = INFORMATION_BLOCK.format(documents="\n".join(
                DOCUMENT.format(i=j + 1, title=d.get("title", ""), text=d.get("text", "")) for j, d in enumerate(chosen)))
            text += f"<think> I need to look this up. </think>\n<search> [passage] {q} </search>{info}"
        out.append((text, list(gen.tokenizer.encode(text, add_special_tokens=False))))
    return out


def timed(gen: Any, prompts: list[tuple[str, list[int]]], new_tokens: int) -> tuple[list[list[int]], float, int]:
    from routerag.policy.types import GenerationRequest

    reqs = [GenerationRequest(t, ids, new_tokens, (), temperature=0.0) for t, ids in prompts]
    if hasattr(getattr(gen, "engine", None), "forget"):  # llama.cpp: no kept sequence from an earlier timing
        gen.engine.forget()
    t0 = time.perf_counter()
    out = gen.generate_batch(reqs)
    dt = time.perf_counter() - t0
    return [g.token_ids for g in out], dt, sum(len(g.token_ids) for g in out)


def bandwidth_gbs() -> float:
    """Memory read bandwidth: a sum over 1 GiB of float32, best of three."""
    a = np.ones(256 * 1024 * 1024, dtype=np.float32)
    best = min(_time(lambda: a.sum()) for _ in range(3))
    return a.nbytes / best / 1e9


def _time(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def speed(engines: dict[str, Any], prompts: list[tuple[str, list[int]]], new_tokens: int,
          singles: int) -> dict[str, dict[str, Any]]:
    res: dict[str, dict[str, Any]] = {n: {"b1_s": 0.0, "b1_tokens": 0} for n in engines}
    for name, gen in engines.items():  # warm-up
        timed(gen, prompts[:1], 8)
    for i in range(singles):  # batch 1, interleaved
        for name, gen in engines.items():
            _, dt, n = timed(gen, prompts[i : i + 1], new_tokens)
            res[name]["b1_s"] += dt
            res[name]["b1_tokens"] += n
    outs = {}
    for name, gen in engines.items():
        outs[name], dt, n = timed(gen, prompts, new_tokens)
        res[name]["b16_tokens_s"] = round(n / dt, 1)
    for name, r in res.items():
        r["b1_tokens_s"] = round(r.pop("b1_tokens") / r.pop("b1_s"), 1)
        differ = [i for i, (a, b) in enumerate(zip(outs["eager"], outs[name])) if a != b]
        r["greedy_equal_to_eager"] = f"{len(prompts) - len(differ)}/{len(prompts)}"
        r["differ"] = differ
        r["b1_ratio"] = round(r["b1_tokens_s"] / res["eager"]["b1_tokens_s"], 2)
        r["b16_ratio"] = round(r["b16_tokens_s"] / res["eager"]["b16_tokens_s"], 2)
    return res


def ask_p50(index: str, generator: Any, questions: int) -> float:
    """Seconds per ``Engine.ask`` at the median, one question at a time after one warm-up question."""
    from routerag.config import Settings
    from routerag.engine import Engine

    qs = [json.loads(x)["question"] for x in (SAMPLES / "questions.jsonl").read_text().splitlines() if x.strip()]
    eng = Engine(index, Settings(), generator=generator)
    asyncio.run(eng.ask(qs[-1]))
    times = []
    for q in qs[:questions]:
        t0 = time.perf_counter()
        asyncio.run(eng.ask(q))
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--singles", type=int, default=4, help="prompts timed alone (batch 1)")
    ap.add_argument("--precisions", default="float32,int4")
    ap.add_argument("--llama", action="store_true", help="also time llama.cpp (float32 GGUF, runtime LoRA)")
    ap.add_argument("--ask", metavar="INDEX", help="also time Engine.ask on this index (e.g. indexes/sample)")
    ap.add_argument("--ask-questions", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    from routerag.config import GeneratorConfig
    from routerag.policy.backends.onnx_backend import OnnxGenerator
    from routerag.policy.backends.transformers_backend import TransformersGenerator
    from routerag.runtime import configure_threads

    configure_threads()
    eager = TransformersGenerator(GeneratorConfig(engine="transformers"))
    engines: dict[str, Any] = {"eager": eager}
    for p in args.precisions.split(","):
        engines[f"onnx-{p}"] = OnnxGenerator(GeneratorConfig(engine="onnx", precision=p), model=eager.model,
                                             tokenizer=eager.tokenizer)
    if args.llama:
        from routerag.policy.backends.llama_backend import LlamaGenerator

        engines["llama-float32"] = LlamaGenerator(GeneratorConfig(), model=eager.model, tokenizer=eager.tokenizer)
    prompts = policy_prompts(eager, args.prompts)
    gbs = bandwidth_gbs()
    params = sum(p.numel() for n, p in eager.model.named_parameters() if "lora_" not in n)
    floors = {"float32": params * 4}
    for name, gen in engines.items():
        if name.startswith("onnx-"):
            folder = gen._engines[True].folder
            floors[name.removeprefix("onnx-")] = sum(f.stat().st_size for f in folder.glob("model.onnx*"))
    result: dict[str, Any] = {
        "prompt_tokens_median": statistics.median(len(p[1]) for p in prompts), "new_tokens": args.new_tokens,
        "read_bandwidth_gbs": round(gbs, 1),
        "floor_tokens_s_batch1": {k: round(gbs * 1e9 / b, 1) for k, b in floors.items()},
        "weights_mb": {k: round(b / 1e6) for k, b in floors.items()},
        "speed": speed(engines, prompts, args.new_tokens, args.singles)}
    if args.ask:
        result["ask_p50_s"] = {name: ask_p50(args.ask, gen, args.ask_questions) for name, gen in engines.items()}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
