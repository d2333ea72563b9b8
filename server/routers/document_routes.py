"""Documents and ingestion jobs: ``POST /documents``, ``DELETE /documents/{id}`` and ``POST /documents/delete``
queue a job (:mod:`server.jobs`: the incremental update of ``routerag index add``, then the new version swapped in),
``GET /jobs/{id}`` and ``GET /jobs`` follow them, and ``GET /documents`` lists an index's passages a page at a time.

The listing reads the version the index serves now (the retriever's passages, in corpus order); a job that adds or
deletes shows up once it is published. Its search is a case-insensitive substring of the id or the title: it is for
finding a document by what a person remembers of it, not retrieval (``/retrieve`` is that).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from ..errors import APIError
from ..jobs import JobError
from ..protocol import DeleteDocuments, Document, DocumentPage, ErrorResponse, Job, JobAccepted
from ..service import Service, service_of
from .common import Responses, json_response, only, without

DOCUMENTS_PATH = UPLOAD_PATH = "/documents"
MAX_PAGE = 100
UPLOAD_TYPES = {"application/x-ndjson": "jsonl", "application/jsonl": "jsonl", "application/json": "json",
                "multipart/form-data": "file"}
"""The body types ``POST /documents`` declares (and the request guard enforces); ``text/plain``, which a browser
sends cross-site without asking, is not one."""
UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "application/x-ndjson": {"schema": {"type": "string"}},
    "application/jsonl": {"schema": {"type": "string"}},
    "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "file": {"type": "string", "format": "binary"}}, "required": ["file"]}}}}}


async def add_documents(request: Request, index: str | None = None) -> Response:
    """Add passages while serving: a JSONL body (`application/x-ndjson`), a JSON array, or a multipart file
    upload, each record `{"title", "text"}` with an optional `"id"` (the corpus format of `routerag build-graph`).
    The body is checked and kept before the answer: `{"job"}`, which `GET /jobs/{job}` follows. The job runs the
    incremental update of `routerag index add` and then swaps the new version in; queries keep being answered
    from the current one meanwhile."""
    service = service_of(request)
    name, _ = service.pick(request, index, write=True, route=UPLOAD_PATH)
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    kind = UPLOAD_TYPES.get(media)
    if kind is None:  # (the request guard refuses these before the body is read)
        raise APIError(415, "unsupported_media_type",
                       f"Content-Type {media or '(none)'!r}: send JSONL (application/x-ndjson), a JSON array "
                       "(application/json) or a file (multipart/form-data, field 'file')")
    if kind == "file":
        body, kind = await _uploaded_file(request)
    else:
        body = await request.body()
    if not body.strip():
        raise APIError(422, "invalid_document", "the body holds no passages")
    return await _accepted(service.jobs.submit_add(name, body, kind))


async def delete_document(doc_id: str, request: Request, index: str | None = None) -> Response:
    """Delete one passage by id, in a background job (`GET /jobs/{job}`); an unknown id is a 404 at once."""
    service = service_of(request)
    name, _ = service.pick(request, index, write=True, route="/documents/{doc_id}")
    return await _accepted(service.jobs.submit_delete(name, [doc_id]))


async def delete_documents(req: DeleteDocuments, request: Request) -> Response:
    """Delete passages by id in one job; if any id is unknown, nothing is queued (404 naming them)."""
    service = service_of(request)
    name, _ = service.pick(request, req.index, write=True, route="/documents/delete")
    return await _accepted(service.jobs.submit_delete(name, list(req.ids)))


async def job_status(job_id: str, request: Request) -> Job:
    """An ingestion job: its state (queued, running, done, failed), counts, and the error that failed it."""
    service = service_of(request)
    job = service.jobs.jobs.get(job_id)
    if job is None or not service.access(request).can_read(job.index):
        raise APIError(404, "not_found", f"no job {job_id!r}")
    return job


async def job_list(request: Request, index: str | None = None) -> list[Job]:
    """The ingestion jobs of the indexes this key may read (or of one), newest first, at most 100."""
    service = service_of(request)
    access = service.access(request)
    found = [j for j in service.jobs.jobs.values() if access.can_read(j.index) and index in (None, j.index)]
    return sorted(found, key=lambda j: j.created, reverse=True)[:100]


async def list_documents(request: Request, index: str | None = None,
                         offset: int = Query(0, ge=0, description="Documents to skip."),
                         limit: int = Query(20, ge=1, le=MAX_PAGE, description="Documents in the page."),
                         q: str | None = Query(None, max_length=200, description=(
                             "Only documents whose id or title contains this (case-insensitive)."))
                         ) -> DocumentPage:
    """An index's documents (passages) in corpus order, a page at a time: `total` counts those matching `q`,
    and `offset + limit < total` says there are more."""
    name, engine = service_of(request).pick(request, index, route=DOCUMENTS_PATH)
    retriever = getattr(engine, "retriever", None)
    if retriever is None:
        raise APIError(409, "conflict", f"index {name!r} is served from shards: list the documents on the "
                                        "shard servers")
    found = matching(list(retriever.passages), q)
    page = [Document(id=p.id, title=p.title, text=p.text, contents=f'"{p.title}"\n{p.text}')
            for p in found[offset:offset + limit]]
    return DocumentPage(index=name, total=len(found), offset=offset, limit=limit, q=q or None, documents=page)


def matching(passages: list[Any], search: str | None) -> list[Any]:
    """The passages whose id or title contains ``search`` (case-insensitive); all of them without one."""
    needle = (search or "").strip().casefold()
    if not needle:
        return passages
    return [p for p in passages if needle in p.id.casefold() or needle in p.title.casefold()]


async def _accepted(submitted: Awaitable[Job]) -> Response:
    """A queued job's 202, with its ``Location``; a job the runner refuses as the error it names."""
    try:
        job = await submitted
    except JobError as exc:
        raise APIError(exc.status, exc.kind, exc.message) from None
    return json_response(JobAccepted(job=job.id, index=job.index, state=job.state), 202,
                         {"Location": f"/jobs/{job.id}"})


async def _uploaded_file(request: Request) -> tuple[bytes, str]:
    """The first file of a multipart upload, and how to read it (``.json``: a JSON document, else JSONL)."""
    from starlette.datastructures import UploadFile

    form = await request.form()
    try:
        files = [v for v in form.values() if isinstance(v, UploadFile)]
        if not files:
            raise APIError(422, "invalid_document", "the multipart body holds no file (send it as field 'file')")
        name = (files[0].filename or "").lower()
        return await files[0].read(), "json" if name.endswith(".json") else "jsonl"
    finally:
        await form.close()


def document_routes(service: Service, errors: Responses) -> APIRouter:
    cfg = service.settings.server
    job_errors = without(errors, 502, 503, 504)
    job_errors[409] = {"model": ErrorResponse, "description": "The index has server.max_pending_jobs jobs queued "
                                                              "or running, or the delete would empty it."}
    upload_errors = {**job_errors, 413: {"model": ErrorResponse,
                                         "description": f"Upload over {cfg.max_upload_bytes} bytes."},
                     415: {"model": ErrorResponse, "description": "Not JSONL, JSON or a multipart file upload."},
                     422: {"model": ErrorResponse, "description": "A malformed record (named by its line), or no "
                                                                  "passages at all."}}
    router = APIRouter()
    route = router.add_api_route
    route(UPLOAD_PATH, add_documents, methods=["POST"], status_code=202, response_model=JobAccepted,
          responses=upload_errors, openapi_extra=UPLOAD_BODY)
    route("/documents/{doc_id}", delete_document, methods=["DELETE"], status_code=202, response_model=JobAccepted,
          responses=job_errors)
    route("/documents/delete", delete_documents, methods=["POST"], status_code=202, response_model=JobAccepted,
          responses=job_errors)
    route("/jobs/{job_id}", job_status, methods=["GET"], response_model=Job, responses=only(errors, 401, 404))
    route("/jobs", job_list, methods=["GET"], response_model=list[Job], responses=only(errors, 401))
    route(DOCUMENTS_PATH, list_documents, methods=["GET"], response_model=DocumentPage,
          responses=only(errors, 401, 404, 409, 421, 422))
    return router
