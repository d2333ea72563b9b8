"""``GET /documents``: an index's passages, a page at a time, optionally only those whose id or title contains a
search string, so a person (the ``/ui`` documents tab) or a script can find what to delete or check what an upload
added. Adding and deleting stay in :mod:`server.app` with the other ingestion routes.

It reads the version the index serves now (the retriever's passages, in corpus order); a job that adds or deletes
shows up once it is published. The search is a case-insensitive substring of the id or the title: the listing is for
finding a document by what a person remembers of it, not retrieval (``/retrieve`` is that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Query, Request

from .errors import APIError
from .protocol import Document, DocumentPage

DOCUMENTS_PATH = "/documents"
MAX_PAGE = 100


def matching(passages: list[Any], search: str | None) -> list[Any]:
    """The passages whose id or title contains ``search`` (case-insensitive); all of them without one."""
    needle = (search or "").strip().casefold()
    if not needle:
        return passages
    return [p for p in passages if needle in p.id.casefold() or needle in p.title.casefold()]


def document_routes(*, pick: Callable[..., tuple[str, Any]], errors: dict[int | str, dict[str, Any]]) -> APIRouter:
    router = APIRouter()
    listed = {k: v for k, v in errors.items() if k in (401, 404, 409, 421, 422)}

    @router.get(DOCUMENTS_PATH, response_model=DocumentPage, responses=listed)
    async def list_documents(request: Request, index: str | None = None,
                             offset: int = Query(0, ge=0, description="Documents to skip."),
                             limit: int = Query(20, ge=1, le=MAX_PAGE, description="Documents in the page."),
                             q: str | None = Query(None, max_length=200, description=(
                                 "Only documents whose id or title contains this (case-insensitive)."))
                             ) -> DocumentPage:
        """An index's documents (passages) in corpus order, a page at a time: `total` counts those matching `q`,
        and `offset + limit < total` says there are more."""
        name, engine = pick(request, index, route=DOCUMENTS_PATH)
        retriever = getattr(engine, "retriever", None)
        if retriever is None:
            raise APIError(409, "conflict", f"index {name!r} is served from shards: list the documents on the "
                                            "shard servers")
        found = matching(list(retriever.passages), q)
        page = [Document(id=p.id, title=p.title, text=p.text, contents=f'"{p.title}"\n{p.text}')
                for p in found[offset:offset + limit]]
        return DocumentPage(index=name, total=len(found), offset=offset, limit=limit, q=q or None, documents=page)

    return router
