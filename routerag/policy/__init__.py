"""The routing policy: a language model that reasons in turns and decides, per search, between dense passages, the
knowledge graph or both (RouteRAG). :class:`PolicyLoop` runs it; backends generate; search backends retrieve."""

from .loop import LoopConfig, PolicyLoop
from .parsing import Action, parse_turn
from .types import (Generation, GenerationRequest, Generator, SearchBackend, Segment, Step, Trajectory,
                    UpstreamError)

__all__ = ["Action", "Generation", "GenerationRequest", "Generator", "LoopConfig", "PolicyLoop", "SearchBackend",
           "Segment", "Step", "Trajectory", "UpstreamError", "parse_turn"]
