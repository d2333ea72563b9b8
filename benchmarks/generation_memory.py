"""Peak memory of one batch of policy turns in the transformers backend, with and without per-token log-probabilities.

Why: ``routerag eval`` with the old defaults (500-token turns, 500-token information blocks, 16 questions in flight)
grew to 10 GB on the embedded 135M model. Generating with ``output_scores`` keeps a (batch × vocabulary) float tensor
for every generated step: 16 × 49,152 × 500 × 4 bytes = 1.6 GB, then ``compute_transition_scores`` stacks and
normalises it (two more copies). Only trainers that use the log-probabilities need them, so the backend now asks for
them only when a request does (``GenerationRequest.logprobs``).

Each variant runs in a fresh child process, so its peak RSS is its own::

    python benchmarks/generation_memory.py --batch 16 --prompt-tokens 1500 --new-tokens 500
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time


def _run(logprobs: bool, batch: int, prompt_tokens: int, new_tokens: int, queue: mp.Queue) -> None:
    import asyncio

    from routerag.config import GeneratorConfig
    from routerag.policy.backends.transformers_backend import TransformersGenerator
    from routerag.policy.types import GenerationRequest
    from routerag.runtime import configure_threads

    configure_threads()
    gen = TransformersGenerator(GeneratorConfig(model="smollm2", max_batch=batch, temperature=1.0))
    tok = gen.tokenizer
    filler = tok.encode(" ".join(["The harbour town trades amber and wool along the river."] * 400),
                        add_special_tokens=False)
    prompts = [filler[i : i + prompt_tokens] for i in range(batch)]
    # ignore the end of sequence, so every row generates all its tokens, as a long rambling turn does
    gen.model.generation_config.eos_token_id = None

    async def go() -> list:
        reqs = [GenerationRequest(tok.decode(p), list(p), max_tokens=new_tokens, stop=(), temperature=1.0,
                                  logprobs=logprobs) for p in prompts]
        return await asyncio.gather(*(gen.generate(r) for r in reqs))

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    out = asyncio.run(go())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put({"logprobs": logprobs, "seconds": round(time.perf_counter() - t0, 1), "rss_before_mb": round(before),
               "peak_rss_mb": round(peak), "generated_tokens": sum(len(g.token_ids) for g in out)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--new-tokens", type=int, default=500)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    rows = []
    for logprobs in (True, False):
        q: mp.Queue = ctx.Queue()
        p = ctx.Process(target=_run, args=(logprobs, args.batch, args.prompt_tokens, args.new_tokens, q))
        p.start()
        rows.append(q.get())
        p.join()
    print(f"batch {args.batch}, prompts of {args.prompt_tokens} tokens, {args.new_tokens} new tokens each")
    print("| log-probabilities | peak RSS (MB) | RSS after loading (MB) | seconds |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {'kept' if r['logprobs'] else 'not asked for'} | {r['peak_rss_mb']} | {r['rss_before_mb']} | "
              f"{r['seconds']} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
