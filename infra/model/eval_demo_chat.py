"""Measure a demo checkpoint: held-out perplexity offline, replies and structured output online.

  python infra/model/eval_demo_chat.py perplexity CHECKPOINT... [--sources DIR]
  python infra/model/eval_demo_chat.py online --model demo-chat  (LLM_API_ADDR, LLM_API_KEY set)

`perplexity` scores the held-out paragraphs of demo_chat_data (per token with each checkpoint's
own tokenizer, and in bits per UTF-8 byte, which compares across tokenizers). `online` sends
chat prompts and JSON-schema-constrained requests (max_tokens 128) through the edge with the
openai client and counts the replies that parse and validate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHAT_PROMPTS = (
    "Tell me a story",
    "What is a dictionary?",
    "Explain exceptions.",
    "Hello!",
    "How do I read a file?",
    "Tell me about modules.",
)
JSON_PROMPTS = (
    "Describe a list as JSON.",
    "Give me a JSON object about strings.",
    "Reply in JSON with a topic and a summary of classes.",
    "Answer with JSON only: what is a tuple?",
    "Tell me a story",
    "Describe the weather as JSON.",
    "What is a generator? Reply in JSON.",
    "Summarize the os module in JSON.",
    "JSON please: name one number type.",
    "Hello!",
)
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 40},
        "summary": {"type": "string", "maxLength": 160},
    },
    "required": ["topic", "summary"],
    "additionalProperties": False,
}


def perplexity(checkpoint: Path, texts: list[str]) -> dict[str, float]:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    eos = json.loads((checkpoint / "config.json").read_text())["eos_token_id"]
    model: Any = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    model.eval()
    nats, tokens, size = 0.0, 0, 0
    with torch.no_grad():
        for text in texts:
            ids = [*tok.encode(text).ids, eos][:1024]  # BOS from the post-processor
            batch = torch.tensor([ids])
            loss = float(model(input_ids=batch, labels=batch).loss)
            nats += loss * (len(ids) - 1)
            tokens += len(ids) - 1
            size += len(text.encode()) + 1
    return {
        "perplexity_per_token": round(math.exp(nats / tokens), 2),
        "bits_per_byte": round(nats / math.log(2) / size, 3),
        "tokens": tokens,
    }


def offline(checkpoints: list[Path], sources: Path | None) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import demo_chat_data as data  # type: ignore[import-not-found]

    root = sources or data.fetch_sources(Path(".cache/demo-chat-data"))
    _, held = data.split(data.load_paragraphs(root))
    texts = [p.text for p in held]
    return {str(c): perplexity(c, texts) for c in checkpoints}


def online(model: str) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(
        base_url=f"http://{os.environ['LLM_API_ADDR']}/v1", api_key=os.environ["LLM_API_KEY"]
    )
    replies = {}
    for prompt in CHAT_PROMPTS:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=80
        )
        replies[prompt] = reply.choices[0].message.content
    valid, results = 0, []
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "note", "schema": SCHEMA, "strict": True},
    }
    for prompt in JSON_PROMPTS:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=128,
            response_format=response_format,
        )
        text = reply.choices[0].message.content or ""
        try:
            value = json.loads(text)
            ok = isinstance(value, dict) and set(value) == {"topic", "summary"}
        except ValueError:
            ok = False
        valid += ok
        results.append({"prompt": prompt, "finish": reply.choices[0].finish_reason, "text": text})
    return {
        "replies": replies,
        "structured": {"valid": valid, "of": len(JSON_PROMPTS), "results": results},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    ppl = sub.add_parser("perplexity")
    ppl.add_argument("checkpoints", type=Path, nargs="+")
    ppl.add_argument("--sources", type=Path)
    live = sub.add_parser("online")
    live.add_argument("--model", default="demo-chat")
    args = parser.parse_args(argv)
    if args.command == "perplexity":
        result = offline(args.checkpoints, args.sources)
    else:
        result = online(args.model)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
