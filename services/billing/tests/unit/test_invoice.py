"""CSV lines of the usage export: RFC 4180 quoting and the row of each record state."""

from __future__ import annotations

import csv

from llm_billing.invoice import HEADER, csv_line, invoice_row

FIELDS = [
    "st",
    "k",
    "m",
    "at",
    "sa",
    "xa",
    "pt",
    "ct",
    "ch",
    "c",
    "cur",
    "fr",
    "pt0",
    "mc",
    "rs",
    "cr",
]


def record(**values: str) -> list[str | None]:
    return [values.get(name) for name in FIELDS]


def test_lines_are_rfc4180_without_line_breaks() -> None:
    line = csv_line(["a,b", 'say "hi"', "plain"])
    assert line == '"a,b","say ""hi""",plain'
    assert next(csv.reader([line])) == ["a,b", 'say "hi"', "plain"]
    assert csv_line(list(HEADER)).startswith("request_id,tenant_id,key_id,model,admitted_at")


def test_settled_corrected_and_expired_rows() -> None:
    base = {"k": "k1", "m": "small", "at": "1000", "cur": "USD", "pt0": "10", "mc": "5"}
    settled = invoice_row("r1", "acme", record(st="S", sa="2000", pt="10", ct="3", ch="2", c="7",
                                        fr="2", cr="0", **base))  # fmt: skip
    assert settled == ["r1", "acme", "k1", "small", "1970-01-01T00:00:01.000Z",
                       "1970-01-01T00:00:02.000Z", "settled", "10", "3", "2", "7", "USD",
                       "length"]  # fmt: skip
    corrected = invoice_row("r2", "acme", record(st="S", cr="1", c="1", fr="0", **base))
    assert corrected is not None
    assert (corrected[6], corrected[-1]) == ("corrected", "")
    expired = invoice_row("r3", "acme", record(st="E", xa="5000", rs="9", **base))
    assert expired is not None
    assert expired[5:11] == ["1970-01-01T00:00:05.000Z", "expired", "10", "5", "0", "9"]


def test_open_and_released_requests_are_not_invoiced() -> None:
    for state in ("R", "X", None):
        assert invoice_row("r", "acme", record(st=state) if state else record()) is None
