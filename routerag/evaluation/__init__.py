"""Evaluation harness (``routerag eval``): answer accuracy (EM, F1, GenAcc), supporting-passage recall and cost
(searches, retrieval and generation time, tokens) of the learned router against forced-mode ablations, naive RAG
and no retrieval; resumable per-question records and reports with plots."""

from .records import DEFINITIONS, RECALL_KS, ResultsLog, score, summarize, tradeoff
from .runner import EvalOptions, EvaluationError, StrategyRun, evaluate, evaluate_strategy, run_evaluation
from .strategies import STRATEGIES, Strategy, parse_strategies, run_strategy

__all__ = ["DEFINITIONS", "RECALL_KS", "STRATEGIES", "EvalOptions", "EvaluationError", "ResultsLog",
           "Strategy", "StrategyRun", "evaluate", "evaluate_strategy", "parse_strategies", "run_evaluation",
           "run_strategy", "score", "summarize", "tradeoff"]
