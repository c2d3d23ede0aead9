"""TenantRegister: the hot path sends SADD for a tenant once per interval, not every call."""

from __future__ import annotations

from llm_billing import ledger
from llm_billing.ledger import TenantRegister


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_is_due_again_only_after_the_interval() -> None:
    clock = FakeClock()
    register = TenantRegister(interval_s=60.0, clock=clock)
    assert register.due("acme")
    register.registered("acme")
    assert not register.due("acme")
    assert register.due("other")
    clock.now += 59.9
    assert not register.due("acme")
    clock.now += 0.2
    assert register.due("acme")


def test_memory_is_bounded() -> None:
    register = TenantRegister(interval_s=60.0, clock=FakeClock())
    for i in range(ledger.MAX_REGISTERED_TENANTS):
        register.registered(f"t{i}")
    assert not register.due("t0")
    register.registered("one-too-many")  # forgets the others: they are due again
    assert register.due("t0")
    assert not register.due("one-too-many")
