"""Admin endpoints: alignment rounds and the model registry (admin token only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request, status
from harmony_mobile.server.core.schemas import (
    INT64_MAX,
    AlignmentParams,
    ErrorBody,
    RegistryResponse,
    RoundResponse,
    SetDefaultRequest,
    VersionInfo,
)
from harmony_mobile.server.routes.bodies import openapi_body, read_json_body
from harmony_mobile.server.routes.deps import AdminDep, StateDep, StoreDep
from harmony_mobile.server.services.registry import NoParentVersion, UnknownVersion
from harmony_mobile.server.services.store import RoundRecord, Store

router = APIRouter(prefix="/v1", tags=["alignment and registry (admin)"])
ERRORS = {code: {"model": ErrorBody} for code in (401, 403, 404, 409, 413, 422)}


def _round(record: RoundRecord) -> RoundResponse:
    return RoundResponse(**record.__dict__)


def _registry(store: Store) -> RegistryResponse:
    return RegistryResponse(
        default=store.default_version(), versions=[VersionInfo(**v.__dict__) for v in store.versions()]
    )


async def _round_params(request: Request, _: AdminDep) -> AlignmentParams | None:
    """The optional body, read after the admin token was checked."""
    return await read_json_body(request, AlignmentParams, required=False)


async def _default_body(request: Request, _: AdminDep) -> SetDefaultRequest:
    return await read_json_body(request, SetDefaultRequest, required=True)


@router.post(
    "/alignment/rounds",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RoundResponse,
    responses=ERRORS,
    openapi_extra=openapi_body(AlignmentParams, required=False, title="Params"),
)
def start_round(
    state: StateDep, _: AdminDep, params: Annotated[AlignmentParams | None, Depends(_round_params)]
) -> RoundResponse:
    """Queue an alignment round over the stored uploads; poll GET .../rounds/{id} for progress."""
    if not state.settings.run_alignment:
        raise HTTPException(
            409, "this replica does not run alignment rounds; send the request to the one that does"
        )
    round_id = state.alignment.submit(params or AlignmentParams())
    return _round(state.store.round(round_id))


@router.get("/alignment/rounds", response_model=list[RoundResponse], responses=ERRORS)
def list_rounds(store: StoreDep, _: AdminDep) -> list[RoundResponse]:
    return [_round(r) for r in store.rounds()]


@router.get("/alignment/rounds/{round_id}", response_model=RoundResponse, responses=ERRORS)
def get_round(
    round_id: Annotated[int, Path(ge=1, le=INT64_MAX, description="round id (ids start at 1)")],
    store: StoreDep,
    _: AdminDep,
) -> RoundResponse:
    record = store.round(round_id)
    if record is None:
        raise HTTPException(404, f"unknown alignment round {round_id}")
    return _round(record)


@router.get("/registry/versions", response_model=RegistryResponse, responses=ERRORS)
def list_versions(store: StoreDep, _: AdminDep) -> RegistryResponse:
    return _registry(store)


@router.put(
    "/registry/default",
    response_model=RegistryResponse,
    responses=ERRORS,
    openapi_extra=openapi_body(SetDefaultRequest, required=True),
)
def set_default(
    _: AdminDep, body: Annotated[SetDefaultRequest, Depends(_default_body)], state: StateDep
) -> RegistryResponse:
    """Serve another stored version by default (takes effect for the next request)."""
    try:
        state.registry.set_default(body.version)
    except UnknownVersion as error:
        raise HTTPException(404, str(error)) from None
    state.metrics.model_swaps.inc()
    return _registry(state.store)


@router.post("/registry/rollback", response_model=RegistryResponse, responses=ERRORS)
def rollback(state: StateDep, _: AdminDep) -> RegistryResponse:
    """Make the current default's parent the default again."""
    try:
        state.registry.rollback()
    except NoParentVersion as error:
        raise HTTPException(409, str(error)) from None
    state.metrics.model_swaps.inc()
    return _registry(state.store)
