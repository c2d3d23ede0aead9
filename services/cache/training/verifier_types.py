"""The verifier's training example (shared by the data generators)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Example:
    a: str  # stored prompt
    b: str  # new prompt
    label: int  # 1: one answer serves both
    category: str
