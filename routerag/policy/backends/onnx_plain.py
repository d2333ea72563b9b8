"""A batch of the exported policy decoded by plain ONNX Runtime, each prompt's shared prefix read once.

Why: ONNX Runtime GenAI reads a batch's prompts in one right-padded pass, and on a CPU that pass is most of a batch's
time (16 policy prompts: 12 of 15 seconds). Every policy prompt starts with the same instruction, a GRPO group holds
the same prompt eight times, and a later turn repeats the earlier one. Here the prompts are read one at a time, each
from the cache of the previous one up to where they differ (sorted, so neighbours share the most), and a prompt that
occurs twice is read once. Each prompt's cache is then copied into one buffer per layer that the decoder reads and
writes in place (GroupQueryAttention shares the past and present buffers when they are the same memory), so a step of
the whole batch reads the weights once, as GenAI's does (docs/benchmarks.md, generation).

The graph is the one GenAI exported: its attention takes the per-row lengths from the attention mask, so rows of
different lengths need no padding inside the cache, and the prompts may hold any token id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


@dataclass
class Layout:
    """What the exported decoder's inputs and outputs are called, and its cache's shape per row."""

    layers: int
    kv_heads: int
    head_size: int
    past: tuple[str, str]
    present: tuple[str, str]

    @classmethod
    def read(cls, folder: Path) -> Layout:
        dec = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        return cls(int(dec["num_hidden_layers"]), int(dec["num_key_value_heads"]), int(dec["head_size"]),
                   (dec["inputs"]["past_key_names"], dec["inputs"]["past_value_names"]),
                   (dec["outputs"]["present_key_names"], dec["outputs"]["present_value_names"]))

    def past_names(self) -> list[str]:
        return [name % layer for layer in range(self.layers) for name in self.past]

    def present_names(self) -> list[str]:
        return [name % layer for layer in range(self.layers) for name in self.present]


class PlainDecoder:
    """The exported decoder in a plain ONNX Runtime session; the caller holds the cache."""

    def __init__(self, folder: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self.layout = Layout.read(folder)
        kinds = {i.name: i.type for i in self.session.get_inputs()}
        self.dtype = np.float16 if "float16" in kinds[self.layout.past_names()[0]] else np.float32
        self._outputs = ["logits", *self.layout.present_names()]

    def empty_cache(self) -> list[np.ndarray]:
        lay = self.layout
        return [np.zeros((1, lay.kv_heads, 0, lay.head_size), self.dtype) for _ in range(2 * lay.layers)]

    def read(self, tokens: list[int], past: list[np.ndarray], length: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """The last position's logits and the cache after reading ``tokens`` after ``past`` (one sequence, whose
        cache holds ``length`` tokens)."""
        feed: dict[str, Any] = {"input_ids": np.asarray([tokens], dtype=np.int64),
                                "attention_mask": np.ones((1, length + len(tokens)), dtype=np.int64)}
        feed.update(zip(self.layout.past_names(), past))
        logits, *cache = self.session.run(self._outputs, feed)
        return logits[0, -1].copy(), cache  # not a view: it would hold every position's logits

    def read_prompts(self, prompts: list[list[int]]) -> Iterator[tuple[tuple[int, ...], np.ndarray,
                                                                        list[np.ndarray]]]:
        """Each distinct prompt with its last logits and cache, read once from the cache of the previous one (in
        sorted order) up to where they differ. At least a prompt's last token is read: its logits choose the first
        new token. Only the previous prompt's cache is held."""
        previous: tuple[int, ...] = ()
        cache = self.empty_cache()
        for prompt in sorted({tuple(p) for p in prompts}):
            keep = min(common_prefix(previous, prompt), len(prompt) - 1)
            past = [np.ascontiguousarray(c[:, :, :keep]) for c in cache]
            logits, cache = self.read(list(prompt[keep:]), past, keep)
            previous = prompt
            yield prompt, logits, cache

    def batch(self, prompts: list[list[int]], length: int) -> tuple[np.ndarray, BatchCache]:
        """The prompts read (:meth:`read_prompts`) into a cache for the batch that holds ``length`` tokens a row;
        the first logits, one row each."""
        batch = BatchCache(self, [len(p) for p in prompts], length)
        first: list[np.ndarray] = [np.empty(0)] * len(prompts)
        for prompt, last, cache in self.read_prompts(prompts):
            rows = [i for i, p in enumerate(prompts) if tuple(p) == prompt]
            batch.write(rows, cache)
            for row in rows:
                first[row] = last
        return np.stack(first), batch


class BatchCache:
    """One buffer per layer's keys and values for a whole batch, bound as both the decoder's past and its present,
    so each step writes one position per row in place instead of returning a copy of the cache."""

    def __init__(self, decoder: PlainDecoder, lengths: list[int], length: int) -> None:
        import onnxruntime as ort

        lay = decoder.layout
        self.decoder = decoder
        self.capacity = length
        self.lengths = np.asarray(lengths, dtype=np.int64)
        shape = (len(lengths), lay.kv_heads, length, lay.head_size)
        self.buffers = [np.zeros(shape, decoder.dtype) for _ in range(2 * lay.layers)]
        self.binding = decoder.session.io_binding()
        self._values = [ort.OrtValue.ortvalue_from_numpy(b) for b in self.buffers]
        for past, present, value in zip(lay.past_names(), lay.present_names(), self._values):
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)
        self.binding.bind_output("logits")  # bound last: :meth:`step` reads it as the last output

    def write(self, rows: list[int], cache: list[np.ndarray]) -> None:
        """Copy one prompt's cache (batch 1) into ``rows``."""
        n = cache[0].shape[2]
        for buf, part in zip(self.buffers, cache):
            buf[rows, :, :n] = part[0]

    def full(self) -> bool:
        return int(self.lengths.max()) >= self.capacity

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Append one token to every row; the next logits, one row each."""
        self.lengths += 1
        width = int(self.lengths.max())
        mask = (np.arange(width)[None, :] < self.lengths[:, None]).astype(np.int64)
        self.binding.bind_cpu_input("input_ids", np.asarray(tokens, dtype=np.int64).reshape(-1, 1))
        self.binding.bind_cpu_input("attention_mask", mask)
        self.decoder.session.run_with_iobinding(self.binding)
        logits = self.binding.get_outputs()[-1].numpy()
        return logits.reshape(len(self.lengths), -1)
