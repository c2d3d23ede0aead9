"""Accuracy of one engine against another (int8 vs full precision) on teacher-forced decoding."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from .api import SamplingOptions
from .core import EngineCore
from .sequence import Sequence


@dataclass(frozen=True, slots=True)
class AccuracyReport:
    """Logit error and top-1 agreement of a candidate engine against a reference engine."""

    positions: int
    max_abs_logit_error: float
    mean_abs_logit_error: float
    max_relative_logit_error: float  # max |candidate - reference| / std(reference), per position
    reference_logit_std: float  # mean spread of the reference logits, for scale
    top1_agreement: float  # share of positions where both engines pick the same greedy token


def teacher_forced_logits(
    core: EngineCore, prompt: Seq[int], steps: int, forced: Seq[int] | None = None
) -> tuple[torch.Tensor, list[int]]:
    """Logits [steps + 1, vocab] after the prompt and after each of `steps` appended tokens.

    The appended tokens are `forced` when given, else the engine's own greedy picks; the core
    must be idle (the sequence runs alone, through the normal scheduler and paged cache).
    """
    request_id = f"accuracy-{core.num_steps}-{len(prompt)}"
    seq = Sequence(request_id, list(prompt), len(prompt), SamplingOptions(), steps + 1)
    core.scheduler.add(seq)
    rows: list[torch.Tensor] = []
    appended: list[int] = []
    try:
        while len(rows) <= steps:
            output = core.scheduler.schedule()
            result = core.runner.execute(output.chunks)
            for chunk in output.chunks:
                chunk.seq.num_computed_tokens = chunk.end
            if not result.sampled:
                continue
            rows.append(result.logits[0])
            if len(rows) <= steps:
                token = forced[len(appended)] if forced is not None else int(rows[-1].argmax())
                appended.append(int(token))
                seq.token_ids.append(int(token))
    finally:
        core.scheduler.finish(seq)
    return torch.stack(rows), appended


def compare_engines(
    reference: EngineCore, candidate: EngineCore, prompts: Seq[Seq[int]], steps: int
) -> AccuracyReport:
    """Teacher-force the reference's greedy continuation through both engines and compare."""
    errors: list[torch.Tensor] = []
    relative: list[float] = []
    spreads: list[torch.Tensor] = []
    agree = total = 0
    for prompt in prompts:
        ref, tokens = teacher_forced_logits(reference, prompt, steps)
        cand, _ = teacher_forced_logits(candidate, prompt, steps, forced=tokens)
        diff = (cand - ref).abs()
        errors.append(diff.flatten())
        spread = ref.std(dim=1)
        spreads.append(spread)
        relative.append(float((diff.amax(dim=1) / spread).max()))
        agree += int((cand.argmax(dim=1) == ref.argmax(dim=1)).sum())
        total += ref.shape[0]
    flat = torch.cat(errors)
    return AccuracyReport(
        positions=total,
        max_abs_logit_error=float(flat.max()),
        mean_abs_logit_error=float(flat.mean()),
        max_relative_logit_error=max(relative),
        reference_logit_std=float(torch.cat(spreads).mean()),
        top1_agreement=agree / total,
    )
