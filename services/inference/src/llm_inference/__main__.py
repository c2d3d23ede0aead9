"""Entry point: `python -m llm_inference [serve]` runs the service; `... generate` runs one
prompt through the same engine and prints JSON (scripting, debugging)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm_common.cli import config_errors_exit, serve_service
from llm_common.config import ConfigError
from llm_common.logging import configure_logging
from llm_inference.config import EngineSettings, Settings

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> None:
    """Dispatch `serve` (the default) or `generate`."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "generate":
        with config_errors_exit("llm-inference"):
            _generate(args)
    else:
        serve_service("llm-inference", Settings.from_env, _start)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-inference", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="run the gRPC service (settings from the environment)")
    gen = commands.add_parser(
        "generate",
        help="generate for one prompt and print JSON (INFERENCE_* engine settings apply)",
    )
    gen.add_argument("--model", required=True, type=Path, help="HF checkpoint directory")
    gen.add_argument(
        "--prompt-token-ids", required=True, type=_token_ids, help="comma-separated ids"
    )
    gen.add_argument("--max-tokens", type=_positive, default=16)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    return parser


def _token_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not ids:
        raise argparse.ArgumentTypeError("at least one token id is needed")
    return ids


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


async def _start(settings: Settings) -> None:
    # Imported after logging is configured, so errors while importing are logged as JSON.
    from llm_inference.server import serve

    await serve(settings)


def _generate(args: argparse.Namespace) -> None:
    engine = EngineSettings.from_env(os.environ)
    configure_logging("inference-cli", "WARNING")  # stdout carries only the JSON result
    if not (args.model / "config.json").is_file():
        raise ConfigError(f"--model: no config.json in {args.model}")
    from llm_inference.engine.api import SamplingOptions

    sampling = SamplingOptions(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    result = asyncio.run(_run_one(engine, args.model, args.prompt_token_ids, sampling))
    print(json.dumps(result))


async def _run_one(
    engine: EngineSettings, model: Path, prompt: tuple[int, ...], sampling: Any
) -> dict[str, Any]:
    from llm_inference.backends.factory import build_backend
    from llm_inference.deployment import checkpoint_context
    from llm_inference.engine.api import EngineError

    max_context = checkpoint_context(model)
    backend = await asyncio.to_thread(build_backend, engine, model, model.name, max_context)
    await backend.start()
    try:
        token_ids: list[int] = []
        text, last = [], None
        async for event in backend.generate(uuid.uuid4().hex, prompt, sampling):
            token_ids.extend(event.token_ids)
            text.append(event.text_delta)
            last = event
    except EngineError as exc:
        raise ConfigError(f"generate: {exc}") from exc
    finally:
        await backend.stop()
    return _result(token_ids, "".join(text), last)


def _result(token_ids: list[int], text: str, last: Any) -> dict[str, Any]:
    timings = getattr(last, "timings", None)
    reason = getattr(last, "finish_reason", None)
    return {
        "token_ids": token_ids,
        "text": text,
        "finish_reason": None if reason is None else reason.value,
        "usage": {
            "prompt_tokens": 0 if last is None else last.prompt_tokens,
            "completion_tokens": len(token_ids),
            "cached_tokens": 0 if last is None else last.cached_tokens,
        },
        "timings_ms": None if timings is None else {
            "queue": timings.queue_ms, "prefill": timings.prefill_ms,
            "ttft": timings.ttft_ms, "decode": timings.decode_ms,
        },
    }  # fmt: skip


if __name__ == "__main__":
    main()
