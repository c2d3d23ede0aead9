"""Downstream statuses → domain errors: client errors keep code and details, faults become
UNAVAILABLE naming the dependency, replica faults become re-dispatchable failures."""

from __future__ import annotations

import grpc
import pytest

from llm_common.errors import (
    FieldViolation,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    QuotaViolation,
    ServiceError,
)
from llm_router.errors import DependencyUnavailable, ReplicaFailed, from_rpc_error
from llm_router.routing.replica_stream import replica_error


def rpc_error(
    error: ServiceError | None, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
) -> grpc.aio.AioRpcError:
    if error is None:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "boom")
    status = error.to_status()
    trailing = grpc.aio.Metadata(*status.trailing_metadata)
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(), trailing, status.details)


def test_client_errors_keep_their_details() -> None:
    bad = from_rpc_error(
        rpc_error(InvalidArgument([FieldViolation("messages", "roles must alternate")])),
        "tokenizer",
    )
    assert isinstance(bad, InvalidArgument)
    assert bad.violations == (FieldViolation("messages", "roles must alternate"),)
    quota = from_rpc_error(
        rpc_error(QuotaExceeded([QuotaViolation("tenant:a", "tpm")], 12.5)), "auth"
    )
    assert isinstance(quota, QuotaExceeded)
    assert quota.retry_after_s == 12.5
    assert quota.violations[0].subject == "tenant:a"
    missing = from_rpc_error(rpc_error(NotFound("model", "x")), "tokenizer")
    assert isinstance(missing, NotFound)
    assert missing.resource_name == "x"


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN]
)
def test_faults_become_unavailable_naming_the_dependency(code: grpc.StatusCode) -> None:
    error = from_rpc_error(rpc_error(None, code), "billing")
    assert isinstance(error, DependencyUnavailable)
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert "billing" in error.message
    assert "boom" not in error.message  # downstream internals are not passed on
    assert error.retry_after_s is not None


def test_replica_errors() -> None:
    failed = replica_error("r:1", rpc_error(None, grpc.StatusCode.UNAVAILABLE))
    assert isinstance(failed, ReplicaFailed)
    assert failed.exclude
    busy = replica_error("r:1", rpc_error(QuotaExceeded([])))
    assert isinstance(busy, ReplicaFailed)
    assert not busy.exclude
    client = replica_error(
        "r:1", rpc_error(InvalidArgument([FieldViolation("sampling.max_tokens", "too big")]))
    )
    assert isinstance(client, InvalidArgument)
    late = replica_error("r:1", rpc_error(None, grpc.StatusCode.DEADLINE_EXCEEDED))
    assert isinstance(late, ServiceError)
    assert late.code == grpc.StatusCode.DEADLINE_EXCEEDED
