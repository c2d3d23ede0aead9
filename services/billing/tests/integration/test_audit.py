"""Budget changes are audited (issue 32): who set which budget to what, from where, and the
outcome, on the audit stream (real billing server on port 0, real Redis)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import grpc
import pytest

from llm_common.audit import AUDIT_LOGGER
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.security]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(json.loads(record.getMessage()))


@pytest.fixture
def audit() -> Iterator[Lines]:
    handler, logger = Lines(), logging.getLogger(AUDIT_LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not `.level =`: setLevel clears isEnabledFor's cache
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_set_budget_is_audited(stub: pb_grpc.BillingServiceAsyncStub, audit: Lines) -> None:
    metadata = [("x-key-id", "0123456789abcdef"), ("x-tenant-id", "system")]
    budget = pb.Budget(tenant_id="acme", period=pb.BUDGET_PERIOD_MONTH, hard_limit_micros=5_000_000)
    await stub.SetBudget(pb.SetBudgetRequest(budget=budget), metadata=metadata)
    bad = pb.Budget(tenant_id="acme", period=pb.BUDGET_PERIOD_MONTH, hard_limit_micros=-1)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.SetBudget(pb.SetBudgetRequest(budget=bad), metadata=metadata)
    (event,) = audit.events  # a request refused by validation changes nothing: not audited
    assert (event["action"], event["outcome"], event["target"]) == (
        "budget.set",
        "OK",
        "budget:acme/*",
    )
    assert (event["actor"], event["actor_tenant"]) == ("0123456789abcdef", "system")
    assert event["details"] == {
        "period": "month",
        "hard_limit_micros": "5000000",
        "soft_limit_micros": "0",
    }
