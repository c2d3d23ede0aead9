"""Data recipe for the trained demo model (`demo-chat`): English prose from Python's documentation.

Source: Debian's `python3.11-doc` package (PSF License Agreement, an open licence; see the
package's /usr/share/doc/python3.11-doc/copyright). Its HTML tree ships the reStructuredText
sources (`html/_sources/**/*.rst.txt`, ~11 MB); this module keeps their prose paragraphs
(no code blocks, directives, tables or titles), strips the inline markup, and splits them into
train / held-out by a hash of the text (2 % held out), so the split never depends on order.

The chat phase: conversations built from the same paragraphs (a question about a section's
title answered with its first sentences, "Tell me a story"-style prompts answered with a
paragraph, and short JSON objects), rendered exactly as the demo chat template renders them.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEBIAN_PACKAGE = "python3.11-doc"
SOURCES_SUBDIR = "usr/share/doc/python3.11/html/_sources"
HELD_OUT_PERCENT = 2
# Parts of the docs that are mostly lists of changes, C signatures or licence text.
SKIPPED_DIRS = ("whatsnew", "c-api", "license", "copyright")

_ROLE = re.compile(r":[a-z:]+:`~?([^`<]*?)\s*(?:<[^`>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*(?:<[^`>]*>)?`_{1,2}")
_LITERAL = re.compile(r"``([^`]+)``")
_EMPH = re.compile(r"\*{1,2}([^*\n]+)\*{1,2}")
_TITLE_LINE = re.compile(r"^([=\-~^*#+\"'`])\1{3,}\s*$")
_SPACES = re.compile(r"\s+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


@dataclass(frozen=True, slots=True)
class Paragraph:
    topic: str  # the title of the section it is in
    text: str


def fetch_sources(cache: Path) -> Path:
    """`apt-get download` the package into `cache` and unpack it (once); the sources dir."""
    sources = cache / "unpacked" / SOURCES_SUBDIR
    if sources.is_dir():
        return sources
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(["apt-get", "download", DEBIAN_PACKAGE], cwd=tmp, check=True)
        deb = next(Path(tmp).glob("*.deb"))
        shutil.copy(deb, cache / deb.name)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(cache / "unpacked")], check=True)
    return sources


def clean_inline(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _EMPH.sub(r"\1", text)
    text = text.replace("::", ":").replace("\\", "")
    return _SPACES.sub(" ", text).strip()


def _is_prose(block: list[str]) -> bool:
    first = block[0]
    if first[:1].isspace() or first.startswith(("..", ":", "|", "+", ">>>", "* ", "- ", "#")):
        return False
    if any(_TITLE_LINE.match(line) for line in block):
        return False
    return not first[:2].rstrip(".").isdigit()


def paragraphs_of(text: str) -> Iterator[Paragraph]:
    """Prose paragraphs of one .rst.txt file, each with the title of its section."""
    lines = text.splitlines()
    topic = ""
    block: list[str] = []
    for i, line in enumerate([*lines, ""]):
        if i + 1 < len(lines) and _TITLE_LINE.match(lines[i + 1]) and line.strip():
            topic = clean_inline(line).split(" --- ")[0]
        if line.strip():
            block.append(line)
            continue
        if block and _is_prose(block):
            prose = clean_inline(" ".join(block))
            letters = sum(c.isalpha() or c == " " for c in prose)
            if len(prose) >= 60 and letters > 0.85 * len(prose) and prose[-1] in ".!?:":
                yield Paragraph(topic, prose)
        block = []


def load_paragraphs(sources: Path) -> list[Paragraph]:
    found: list[Paragraph] = []
    for path in sorted(sources.rglob("*.rst.txt")):
        relative = path.relative_to(sources).as_posix()
        if relative.startswith(SKIPPED_DIRS):
            continue
        found.extend(paragraphs_of(path.read_text(encoding="utf-8", errors="replace")))
    return found


def is_held_out(text: str) -> bool:
    digest = hashlib.sha256(text.encode()).digest()
    return digest[0] * 100 // 256 < HELD_OUT_PERCENT


def split(paragraphs: list[Paragraph]) -> tuple[list[Paragraph], list[Paragraph]]:
    train = [p for p in paragraphs if not is_held_out(p.text)]
    held = [p for p in paragraphs if is_held_out(p.text)]
    return train, held


# ---------------------------------------------------------------- chat phase

STORY_PROMPTS = (
    "Tell me a story",
    "Tell me a story.",
    "Tell me something interesting.",
    "Write a short paragraph.",
    "Say something.",
    "Hello!",
    "Hi",
    "Can you help me?",
    "What do you know?",
    "Teach me something.",
)
TOPIC_PROMPTS = (
    "What is {t}?",
    "Tell me about {t}.",
    "Explain {t}.",
    "Describe {t} in a few sentences.",
    "Can you explain {t}?",
    "Write a short note about {t}.",
)
JSON_PROMPTS = (
    "Reply in JSON with a topic and a summary of {t}.",
    "Give me a JSON object describing {t}.",
    "Answer with JSON only: what is {t}?",
)


def first_sentences(text: str, n: int) -> str:
    return " ".join(_SENTENCE.split(text)[:n])


def render_chat(user: str, assistant: str, system: str | None = None) -> str:
    """As the demo chat template renders it (without BOS, which the trainer adds)."""
    turns = [] if system is None else [f"<|system|>\n{system}<|eos|>\n"]
    turns.append(f"<|user|>\n{user}<|eos|>\n")
    return "".join(turns) + f"<|assistant|>\n{assistant}<|eos|>\n"


def _json_answer(rng: random.Random, p: Paragraph) -> str:
    summary = first_sentences(p.text, 1)[:160]
    words = [w.strip(".,:;()").lower() for w in summary.split()]
    keywords = [w for w in words if len(w) > 5 and w.isalpha()][: rng.randint(1, 3)]
    value = {"topic": p.topic, "summary": summary}
    if rng.random() < 0.5:
        value["keywords"] = keywords  # type: ignore[assignment]
    return json.dumps(value, ensure_ascii=False)


def chat_examples(paragraphs: list[Paragraph], count: int, seed: int) -> list[str]:
    """`count` rendered conversations drawn from `paragraphs` (deterministic for a seed)."""
    rng = random.Random(seed)
    titled = [p for p in paragraphs if 3 <= len(p.topic) <= 60]
    out: list[str] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.35:
            p = rng.choice(paragraphs)
            out.append(render_chat(rng.choice(STORY_PROMPTS), first_sentences(p.text, 4)))
        elif roll < 0.8:
            p = rng.choice(titled)
            topic = p.topic[0].lower() + p.topic[1:] if p.topic[1:2].islower() else p.topic
            question = rng.choice(TOPIC_PROMPTS).format(t=topic)
            out.append(render_chat(question, first_sentences(p.text, rng.randint(1, 3))))
        else:
            p = rng.choice(titled)
            question = rng.choice(JSON_PROMPTS).format(t=p.topic)
            out.append(render_chat(question, _json_answer(rng, p)))
    return out
