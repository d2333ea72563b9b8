"""Open information extraction: swappable extractors behind one interface, plus imported results."""

from __future__ import annotations

from ..config import ExtractorConfig

from .base import ExtractionStats, Extractor, OpenIEResult, Triple, run_extraction

__all__ = ["Extractor", "ExtractionStats", "OpenIEResult", "Triple", "make_extractor", "run_extraction"]


def make_extractor(cfg: ExtractorConfig) -> Extractor:
    if cfg.kind == "cpu":
        from .cpu import SpacyExtractor

        return SpacyExtractor(cfg.spacy_model, n_process=cfg.n_process, batch_size=cfg.batch_size)
    from .llm import LLMExtractor

    return LLMExtractor.from_config(cfg)
