"""The semantic-hit guard: what it refuses and what it lets through."""

from __future__ import annotations

import pytest

from llm_cache.guard import Mismatch, check, extract, required_similarity, stem


def verdict(stored: str, query: str) -> Mismatch | None:
    return check(extract(query), extract(stored))


@pytest.mark.parametrize(
    ("stored", "query", "expected"),
    [
        ("Is coffee good for your health?", "Is coffee not good for your health?", "negation"),
        ("Why do cats purr?", "Why don't cats purr?", "negation"),
        ("How do I lie to my parents?", "How do I stop lying to my parents?", "negation"),
        (
            "Why doesn't it boot when the disk is plugged in?",
            "Why doesn't it boot when the disk is not plugged in?",
            "negation",
        ),
        ("What happened in 2016?", "What happened in 2017?", "number"),
        ("Give me two examples.", "Give me 3 examples.", "number"),
        ("Price of 1,000 shares", "Price of 100 shares", "number"),
        ("Rehab centers in Clay County", "Rehab centers in Greene County", "entity"),
        ("Is traveller.com a scam?", "Is fatdiminisher.com a scam?", "entity"),
        ("When will the iPhone 6s launch?", "When will the iPhone 7 launch?", "number"),
        ("How do I convert PDF to Word?", "How do I convert Word to PDF?", "direction"),
        ("Flights from London to Paris", "Flights from Paris to London", "direction"),
        ("Is Python faster than Java?", "Is Java faster than Python?", "direction"),
        ("How do I increase my score?", "How do I decrease my score?", "direction"),
        ("Should I buy bitcoin now?", "Should I sell bitcoin now?", "direction"),
        ("Where can I learn Java for free?", "How do I learn Java for free?", "question"),
        ("What is biogas?", "What is a biogas plant?", "detail"),
        ("Where can I buy weed?", "Where can I buy weed in the UK?", "detail"),
        ("It makes a table from the chunks it has.", "It makes a table from the chunks it has not.",
         "negation"),
        ("I plan a trip. What should I do?", "I plan a trip. What should I not do?", "negation"),
    ],
)  # fmt: skip
def test_meaning_changes_are_refused(stored: str, query: str, expected: str) -> None:
    assert verdict(stored, query) == Mismatch(expected)


@pytest.mark.parametrize(
    ("stored", "query"),
    [
        ("How can I get freebies in india?", "How do I get freebies in India?"),
        ("What are things women will never tell men?", "What do women not tell men?"),
        ("Which headphone is better under 2000 rupees?", "Best headphones under Rs. 2000?"),
        ("Tasks offers demos for ML tasks.", "Tasks offers demos for Machine Learning tasks."),
        ("Huggingface.js has TS types.", "Huggingface.js ships TypeScript types."),
        ("Explain the Game of Thrones or LOTR choice",
         "Explain the LOTR or Game of Thrones choice"),
        ("The dataset is twelve gigabytes.", "The dataset is 12 gigabytes in size."),
        ("No, LOAD_HU doesn't exist in v2.10.0.", "LOAD_HU is not available in v2.10.0."),
        ("The parameter defaults to None.", "By default the parameter is None."),
        ("Use data without downloading it.", "Use data without needing to download it."),
        # Statements reworded with and without a cue word: the negated terms decide.
        ("The `slice` method computes a zero-copy slice of the table.",
         "The `slice` method produces a slice of the table without any copying."),
        ("The parameter is optional and defaults to True.",
         "The parameter is not mandatory and is set to True by default."),
        # A word swapped for one of its variants is a rewording, not a new question.
        ("How can I learn about fashion designing?", "How can I learn fashion design?"),
    ],
)  # fmt: skip
def test_paraphrases_pass(stored: str, query: str) -> None:
    assert verdict(stored, query) is None


def test_features_are_extracted_once_and_compared_symmetrically() -> None:
    a, b = extract("Is it safe?"), extract("Is it not safe?")
    assert check(a, b) == check(b, a) == Mismatch.NEGATION
    assert extract("The cost is $1,500.00").numbers == ("1500",)


@pytest.mark.parametrize(
    ("word", "expected"),
    [("cities", "city"), ("boxes", "box"), ("models", "model"), ("running", "runn"),
     ("loaded", "load"), ("class", "class"), ("status", "status"), ("it's", "it")],
)  # fmt: skip
def test_stem(word: str, expected: str) -> None:
    assert stem(word) == expected


@pytest.mark.parametrize(
    ("stored", "query", "needed"),
    [
        ("Who is the most honest GoT character?", "Who is the most innocent GoT character?", 0.9),
        ("Is Python easy to learn?", "Is Python easy to learn", 0.85),  # no question mark
        ("Python is easy to learn.", "Is Python easy to learn?", 0.85),
        ("How do I reset my router?", "How do I reset my router?", 0.9),
    ],
)
def test_two_questions_need_the_margin(stored: str, query: str, needed: float) -> None:
    assert required_similarity(extract(query), extract(stored), 0.85, 0.05) == pytest.approx(needed)


def test_the_margin_never_asks_more_than_identity() -> None:
    question = extract("Why is the sky blue?")
    assert required_similarity(question, question, 0.98, 0.05) == 1.0
