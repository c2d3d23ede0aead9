"""The semantic-hit guard: lexical checks that catch what sentence embeddings miss.

Embeddings score a question and its negation, or the same question about 2016 and 2017, as
near-identical (GPTCache #694: 0.83-0.9997 across encoders). Before a semantic hit is served
the stored prompt and the new one must agree on negation, numbers, named entities, the
direction of relations (A to B vs B to A, increase vs decrease) and the kind of question.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from dataclasses import dataclass

_WORD = re.compile(r"\d+(?:[.,]\d+)*|[^\W_]+(?:['’.\-][^\W_]+)*")
# A capitalised word right after one of these (or at the start) is grammar, not a name.
_SENTENCE_END = frozenset(".!?:;\n")
_CAMEL = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _words(
    """
    a about above after again all also am an and any are as at be because been being below
    between both but by can could did do does doing down during each else etc ever few for from
    further get got had has have having he her here hers herself him himself his how i if in
    into is it its itself just let like ll me might mine more most must my myself of off on once
    only or other our ours ourselves out over own re really same shall she should so some such
    than that the their theirs them themselves then there these they this those through thus to
    too under until up us ve very was we were what when where which while who whom whose why
    will with would yet you your yours yourself yourselves one ones thing things way ways anyone
    someone something people
    """
)
# Words that negate what follows, including verbs that turn "X" into "not X" ("stop lying").
NEGATIONS = _words(
    """
    not no never none nobody nothing neither nor nowhere without cannot cant dont doesnt didnt
    isnt arent wasnt werent wont wouldnt shouldnt couldnt hasnt havent hadnt stop stopped
    stopping quit avoid avoiding prevent preventing lack lacking absence
    """
)
# Opposite ends of one scale; a prompt that has one end and not the other differs in
# meaning from a prompt that has only the other end.
_POLAR_PAIRS = (
    ("increase", "decrease"), ("increase", "reduce"), ("raise", "lower"), ("rise", "fall"),
    ("gain", "lose"), ("gain", "loss"), ("more", "less"), ("more", "fewer"), ("most", "least"),
    ("higher", "lower"), ("high", "low"), ("above", "below"), ("best", "worst"),
    ("better", "worse"), ("max", "min"), ("maximum", "minimum"), ("buy", "sell"),
    ("import", "export"), ("upload", "download"), ("before", "after"),
    ("open", "close"), ("win", "lose"), ("male", "female"), ("men", "women"), ("man", "woman"),
    ("north", "south"), ("east", "west"), ("left", "right"), ("true", "false"),
    ("pros", "cons"), ("advantage", "disadvantage"), ("like", "dislike"), ("love", "hate"),
    ("encrypt", "decrypt"), ("enable", "disable"), ("add", "remove"), ("push", "pull"),
    ("cheap", "expensive"), ("fast", "slow"), ("easy", "hard"), ("easiest", "hardest"),
    ("big", "small"), ("largest", "smallest"), ("long", "short"), ("old", "young"),
    ("first", "last"), ("positive", "negative"), ("good", "bad"), ("legal", "illegal"),
    ("possible", "impossible"), ("happy", "unhappy"), ("hot", "cold"), ("input", "output"),
    ("inside", "outside"), ("internal", "external"), ("minimum", "maximum"),
    ("success", "failure"), ("pass", "fail"), ("accept", "reject"), ("allow", "deny"),
    ("benefit", "disadvantage"), ("benefit", "drawback"), ("advantage", "drawback"),
    ("boy", "girl"), ("guy", "girl"), ("husband", "wife"), ("boyfriend", "girlfriend"),
    ("he", "she"), ("his", "her"), ("son", "daughter"), ("father", "mother"),
    ("brother", "sister"), ("king", "queen"), ("rich", "poor"), ("win", "loss"),
)  # fmt: skip
# Words after which the order of the surrounding terms carries meaning.
DIRECTION_MARKERS = frozenset({"to", "into", "from", "than", "vs", "versus", "towards", "onto"})
_DIRECTION_WINDOW = 2  # content words considered on each side of a marker
_NEGATION_REACH = 4  # words after a negation cue searched for the term it negates
# "zero", "one", "first", "second" and "half" are left out: mostly not numbers ("one can",
# "it first downloads").
_SMALL_NUMBERS = (
    "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
)  # fmt: skip
NUMBER_WORDS = {w: str(i) for i, w in enumerate(_SMALL_NUMBERS, start=2)} | {
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "sixty": "60",
    "seventy": "70",
    "eighty": "80",
    "ninety": "90",
    "hundred": "100",
    "thousand": "1000",
    "million": "1000000",
    "billion": "1000000000",
    "third": "3",
    "fourth": "4",
    "fifth": "5",
    "twice": "2",
    "dozen": "12",
}
_WH_CLASS = {
    "what": "info", "which": "info", "how": "info", "why": "reason", "when": "time",
    "where": "place", "who": "person", "whom": "person", "whose": "person",
}  # fmt: skip
_AUX = _words(
    """
    is are was were am do does did can could will would should shall may might must has have had
    isn't aren't don't doesn't didn't can't won't
    """
)
# Tokens that open a sentence without starting its question: "So, why ...", "Hey, what ...".
_OPENERS = frozenset({"so", "and", "but", "hey", "hi", "hello", "ok", "okay", "well", "please"})


class Mismatch(enum.StrEnum):
    """Why the guard refused a semantic hit (also a metric label)."""

    NEGATION = "negation"
    NUMBER = "number"
    ENTITY = "entity"
    DETAIL = "detail"
    DIRECTION = "direction"
    QUESTION = "question"
    SIMILARITY = "similarity"  # two questions below the threshold plus the question margin
    VERIFIER = "verifier"  # the learned verifier's score is below the mode's operating point


@dataclass(frozen=True, slots=True)
class Features:
    """What the guard compares, extracted once per prompt (stored entries keep theirs)."""

    words: frozenset[str]  # every word's stem, lower case
    initialisms: frozenset[str]  # initials of capitalised word runs ("ml" for Machine Learning)
    content: frozenset[str]  # stems of the words that are not stopwords
    negated: bool  # has a negation cue (parity fails on "No, it doesn't ...")
    bare_negation: bool  # a cue with no content word after it ("has not.", "should I not do?")
    asks: bool  # contains a question mark anywhere
    negated_terms: frozenset[str]  # first term after a cue, odd count ("not [safe]")
    negation_scope: frozenset[str]  # every term a few words after any cue
    numbers: tuple[str, ...]  # sorted, normalised ("2,000" -> "2000", "two" -> "2")
    entities: frozenset[str]  # stems of names, acronyms and model numbers
    polar: frozenset[str]  # words of _POLAR_PAIRS present (stemmed)
    ordered: tuple[str, ...]  # content stems and direction markers, in text order
    question: str | None  # wh-class, "yesno", or None (not a question)


def extract(text: str) -> Features:
    """The guard features of one prompt (the last user message, or a completion prompt)."""
    text = unicodedata.normalize("NFKC", text)
    matches = list(_WORD.finditer(text))
    raw = [m.group() for m in matches]
    lower = [_fold(w) for w in raw]
    stems = [stem(w) for w in lower]
    starts = [_starts_sentence(text, m.start()) for m in matches]
    cues = _negation_cues(text, matches, lower, starts)
    content = [s for w, s in zip(lower, stems, strict=True) if _is_content(w)]
    return Features(
        words=frozenset(stems),
        initialisms=_initialisms(raw),
        content=frozenset(content),
        negated=any(cues),
        bare_negation=_bare_negation(cues, lower),
        asks="?" in text,
        negated_terms=_negated_terms(cues, lower, stems),
        negation_scope=_negation_scope(cues, lower, stems),
        numbers=_numbers(lower),
        entities=_entities(raw, lower, stems, starts),
        polar=frozenset(s for s in stems if s in _POLAR_STEMS),
        ordered=tuple(
            w if w in DIRECTION_MARKERS else s
            for w, s in zip(lower, stems, strict=True)
            if w in DIRECTION_MARKERS or _is_content(w)
        ),
        question=_question_class(lower, text.rstrip().endswith("?")),
    )


def check(query: Features, stored: Features) -> Mismatch | None:
    """The first reason the two prompts must not share an answer, or None."""
    if _negation_differs(query, stored):
        return Mismatch.NEGATION
    if query.numbers != stored.numbers:
        return Mismatch.NUMBER
    if _unmatched_entities(query, stored) and _unmatched_entities(stored, query):
        return Mismatch.ENTITY  # one name replaced by another: Clay County / Greene County
    if query.question and stored.question and _adds_detail(query.content, stored.content):
        return Mismatch.DETAIL  # one question narrows the other: "... in India", "... for free"
    if _polar_conflict(query.polar, stored.polar) or _swapped(query.ordered, stored.ordered):
        return Mismatch.DIRECTION
    if query.question and stored.question and query.question != stored.question:
        return Mismatch.QUESTION
    return None


def check_with_verifier(query: Features, stored: Features) -> Mismatch | None:
    """The rule checks kept next to the learned verifier: on the tuning split they removed
    false hits the verifier let through (terms swapped around "to"/"than"/"from") or they are
    exact facts a wrong answer must not cross (negation, numbers); the other checks cost more
    hits than they saved there (services/cache/training/README.md)."""
    if _negation_differs(query, stored):
        return Mismatch.NEGATION
    if query.numbers != stored.numbers:
        return Mismatch.NUMBER
    if _swapped(query.ordered, stored.ordered):
        return Mismatch.DIRECTION
    return None


def required_similarity(
    query: Features, stored: Features, threshold: float, question_margin: float
) -> float:
    """The similarity a candidate needs: short questions that ask different things (honest /
    innocent, Chennai / Kolkata) embed closer together than reworded statements do, so two
    questions need `question_margin` more."""
    if query.question and stored.question:
        return min(1.0, threshold + question_margin)
    return threshold


def _negation_differs(one: Features, other: Features) -> bool:
    """A term negated in one prompt only; or a negation in one prompt only, where that is
    telling: in a question, or when the cue negates no content word the term check could see.
    Statements are reworded with and without cue words ("optional" / "not mandatory", "zero-
    copy" / "without copying"), so there the term check alone decides."""
    if _negation_flips(one, other):
        return True
    if one.negated == other.negated:
        return False
    negated = one if one.negated else other
    return one.asks or other.asks or negated.bare_negation


def _negation_flips(one: Features, other: Features) -> bool:
    """A term both prompts contain is negated in one and nowhere near a negation in the
    other ("can [not] specify the device" / "can specify the device")."""
    return _flips_into(one, other) or _flips_into(other, one)


def _flips_into(one: Features, other: Features) -> bool:
    return any(t in other.words and t not in other.negation_scope for t in one.negated_terms)


def _unmatched_entities(one: Features, other: Features) -> bool:
    """Whether `one` names something `other` does not (an acronym may match initials)."""
    missing = one.entities - other.words
    return bool(missing - other.initialisms)


def _adds_detail(one: frozenset[str], other: frozenset[str]) -> bool:
    # Only for questions: there an added qualifier changes what is asked, while statements
    # and instructions are reworded with extra words far more often.
    return one != other and (one <= other or other <= one)


def stem(word: str) -> str:
    """A light suffix stripper: enough to equate plurals and simple verb forms."""
    if word.endswith(("'s", "’s")):
        word = word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed"):
        return word[:-2]
    return word


def _fold(word: str) -> str:
    return word.lower().replace("’", "'")


def _starts_sentence(text: str, position: int) -> bool:
    before = text[:position].rstrip(" \t\"'`(*#-")
    return not before or before[-1] in _SENTENCE_END


def _negation_cues(
    text: str, matches: list[re.Match[str]], lower: list[str], starts: list[bool]
) -> list[bool]:
    """Which words negate. Not: "No,"/"No." as an answer, and "None" inside a sentence
    (the value, as in "defaults to None")."""
    cues = []
    for m, word, first in zip(matches, lower, starts, strict=True):
        answer = word == "no" and text[m.end() : m.end() + 1] in (",", ".", "!")
        value = m.group() == "None" and not first
        cues.append(_is_negation(word) and not answer and not value)
    return cues


def _is_negation(word: str) -> bool:
    return word in NEGATIONS or word.endswith("n't") or word.startswith(("non-", "no-"))


def _is_content(word: str) -> bool:
    return word not in STOPWORDS and not _is_negation(word)


def _negated_terms(cues: list[bool], lower: list[str], stems: list[str]) -> frozenset[str]:
    """The first content word within a few words after each cue, by parity (a term negated
    twice, "not not specified", is not negated). Compounds ("non-streaming") negate only
    themselves."""
    counts: dict[str, int] = {}
    for i in _scoping_cues(cues, lower):
        for j in range(i + 1, min(i + 1 + _NEGATION_REACH, len(lower))):
            if _is_content(lower[j]):
                counts[stems[j]] = counts.get(stems[j], 0) + 1
                break
    return frozenset(term for term, n in counts.items() if n % 2)


def _bare_negation(cues: list[bool], lower: list[str]) -> bool:
    return any(
        not any(_is_content(w) for w in lower[i + 1 : i + 1 + _NEGATION_REACH])
        for i in _scoping_cues(cues, lower)
    )


def _negation_scope(cues: list[bool], lower: list[str], stems: list[str]) -> frozenset[str]:
    return frozenset(
        stems[j]
        for i in _scoping_cues(cues, lower)
        for j in range(i + 1, min(i + 1 + _NEGATION_REACH, len(lower)))
        if _is_content(lower[j])
    )


def _scoping_cues(cues: list[bool], lower: list[str]) -> list[int]:
    return [i for i, cue in enumerate(cues) if cue and "-" not in lower[i]]


def _numbers(lower: list[str]) -> tuple[str, ...]:
    found: list[str] = []
    for word in lower:
        found.extend(NUMBER_WORDS[part] for part in word.split("-") if part in NUMBER_WORDS)
        found.extend(_normalise_number(digits) for digits in _DIGITS.findall(word))
    return tuple(sorted(found))


def _normalise_number(digits: str) -> str:
    # "2,000" and "2000" are one number; "1.50" and "1.5" too.
    plain = digits.replace(",", "")
    if "." in plain:
        plain = plain.rstrip("0").rstrip(".")
    return plain.lstrip("0") or "0"


def _entities(
    raw: list[str], lower: list[str], stems: list[str], starts: list[bool]
) -> frozenset[str]:
    """Capitalised words inside a sentence, acronyms, words with inner capitals, dots or
    digits mixed with letters (iPhone, NASA, 6s, traveller.com)."""
    found = set()
    for word, folded, stemmed, first in zip(raw, lower, stems, starts, strict=True):
        if folded in STOPWORDS or _is_negation(folded) or folded in NUMBER_WORDS:
            continue
        if word.isdigit() or (len(word) < 2 and not (word.isupper() and not first)):
            continue
        mixed = any(c.isdigit() for c in word) or "." in word or word[1:] != word[1:].lower()
        if mixed or (word[0].isupper() and not first):
            found.add(stemmed)
    return frozenset(found)


def _initialisms(raw: list[str]) -> frozenset[str]:
    """Initials of 2-5 consecutive capitalised words or camel-case parts, so that "ML"
    matches "Machine Learning" and "JS" matches "JavaScript"."""
    found: set[str] = set()
    run = ""
    for part in (p for word in raw for p in _CAMEL.findall(word)):
        run = run + part[0].lower() if part[0].isupper() else ""
        found.update(run[-n:] for n in range(2, min(len(run), 5) + 1))
    return frozenset(found)


def _question_class(lower: list[str], ends_with_question_mark: bool) -> str | None:
    words = lower
    while words and words[0] in _OPENERS:
        words = words[1:]
    if not words:
        return None
    head = words[0]
    if head in _WH_CLASS:
        return _WH_CLASS[head]
    if head in _AUX and ends_with_question_mark:
        return "yesno"
    return None


def _polar_conflict(query: frozenset[str], stored: frozenset[str]) -> bool:
    """One prompt holds one end of a scale (buy) and the other only the opposite (sell)."""
    for one, other in _POLAR_STEM_PAIRS:
        if one in query and other not in query and other in stored and one not in stored:
            return True
        if other in query and one not in query and one in stored and other not in stored:
            return True
    return False


def _swapped(query: tuple[str, ...], stored: tuple[str, ...]) -> bool:
    """Whether two terms sit on opposite sides of a direction marker in both prompts, in
    opposite orders (convert Celsius to Fahrenheit / Fahrenheit to Celsius)."""
    once = {t for t in query if query.count(t) == 1} & {t for t in stored if stored.count(t) == 1}
    forward = _directed_pairs(query, once)
    return any((b, a) in forward for a, b in _directed_pairs(stored, once))


def _directed_pairs(ordered: tuple[str, ...], terms: set[str]) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for i, token in enumerate(ordered):
        if token not in DIRECTION_MARKERS:
            continue
        before = [t for t in ordered[:i] if t not in DIRECTION_MARKERS][-_DIRECTION_WINDOW:]
        after = [t for t in ordered[i + 1 :] if t not in DIRECTION_MARKERS][:_DIRECTION_WINDOW]
        pairs.update((a, b) for a in before for b in after if a != b and {a, b} <= terms)
    return pairs


_POLAR_STEM_PAIRS = tuple((stem(a), stem(b)) for a, b in _POLAR_PAIRS)
_POLAR_STEMS = frozenset(w for pair in _POLAR_STEM_PAIRS for w in pair)
