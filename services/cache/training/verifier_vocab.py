"""Slot values for the verifier's generated pairs (verifier_data.py).

Written for issue 37 after the held-out set (bench/data/semantic-cache/held_out.jsonl) was
frozen and without reading it back: topics and names were picked to be everyday ones, not
to match it. Every list is split by position into a training part and a tuning part
(`split`), so the tuning split never shares a slot value with the training data.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")

# (thing, adjective-er) comparisons: "Is {a} {adj} than {b}?"
COMPARABLES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("a horse", "a zebra"), ("a wolf", "a fox"), ("an eagle", "a hawk"), ("a whale", "a dolphin")),
    (("Java", "C#"), ("Swift", "Objective-C"), ("Haskell", "OCaml"), ("Ruby", "PHP")),
    (("Paris", "Rome"), ("Madrid", "Lisbon"), ("Oslo", "Helsinki"), ("Cairo", "Nairobi")),
    (("copper", "aluminium"), ("iron", "steel"), ("wood", "bamboo"), ("glass", "plastic")),
    (("oat milk", "almond milk"), ("honey", "sugar"), ("butter", "margarine"), ("rice", "quinoa")),
    (("a Kindle", "an iPad"), ("Windows", "macOS"), ("Vim", "Emacs"), ("Redis", "Memcached")),
    (("cycling", "rowing"), ("tennis", "squash"), ("boxing", "judo"), ("hiking", "jogging")),
    (("Jupiter", "Saturn"), ("Venus", "Mercury"), ("the Sun", "Sirius"), ("Europa", "Titan")),
)
ADJECTIVES = (
    "faster", "bigger", "cheaper", "healthier", "older", "stronger", "heavier", "more popular",
    "more expensive", "better", "safer", "harder to learn", "more efficient", "warmer",
)  # fmt: skip

# Objects of "how do I ..." requests and operations that change what is asked.
TASK_OBJECTS = (
    "a spreadsheet", "a database table", "a calendar event", "a Slack channel", "a GitHub repo",
    "a Kubernetes pod", "an email filter", "a playlist", "a cron job", "a printer driver",
    "a WordPress plugin", "a savings account", "a gym membership", "a phone contract",
    "a browser extension", "an SSH key", "a Python package", "a Google Doc", "a YouTube video",
    "a Zoom meeting", "a firewall rule", "a shared folder", "a Shopify store", "a domain name",
)  # fmt: skip
OPERATION_PAIRS = (
    ("create", "delete"), ("enable", "disable"), ("share", "unshare"), ("back up", "restore"),
    ("rename", "duplicate"), ("archive", "unarchive"), ("upload", "download"), ("open", "close"),
    ("lock", "unlock"), ("export", "import"), ("start", "stop"), ("hide", "unhide"),
    ("install", "remove"), ("sort", "filter"), ("copy", "move"), ("subscribe to", "cancel"),
    ("schedule", "reschedule"), ("publish", "unpublish"), ("merge", "split"), ("edit", "print"),
)  # fmt: skip

# Unit / format / language pairs for direction swaps.
CONVERSIONS = (
    ("grams", "ounces"), ("liters", "gallons"), ("inches", "centimeters"), ("feet", "meters"),
    ("kelvin", "Celsius"), ("hours", "seconds"), ("yen", "pounds"), ("rupees", "dollars"),
    ("PNG", "JPEG"), ("MP4", "GIF"), ("Markdown", "HTML"), ("Excel", "CSV"), ("epub", "PDF"),
    ("decimal", "binary"), ("octal", "decimal"), ("tabs", "spaces"), ("UTC", "Pacific time"),
)  # fmt: skip
PLACES = (
    "Denver", "Dallas", "Lyon", "Munich", "Vienna", "Prague", "Dublin", "Glasgow", "Osaka",
    "Seoul", "Bangkok", "Hanoi", "Lima", "Quito", "Perth", "Toronto", "Vancouver", "Athens",
    "Zurich", "Geneva", "Warsaw", "Krakow", "Manila", "Jakarta",
)  # fmt: skip
LANGUAGES = (
    "French", "German", "Italian", "Spanish", "Portuguese", "Dutch", "Japanese", "Korean",
    "Mandarin", "Hindi", "Arabic", "Russian", "Polish", "Turkish", "Greek", "Swedish",
)  # fmt: skip
PHRASES = (
    "good night", "see you tomorrow", "how much is this", "I am hungry", "where is the toilet",
    "nice to meet you", "happy new year", "I don't understand", "congratulations", "welcome",
)  # fmt: skip

# Output formats and styles.
FORMAT_PAIRS = (
    ("as a table", "as a bulleted list"), ("in JSON", "in YAML"), ("in one sentence", "in detail"),
    ("as a numbered list", "as a paragraph"), ("in CSV", "in XML"),
    ("in Markdown", "as plain text"),
    ("for a child", "for an expert"), ("in a formal tone", "in a casual tone"),
    ("in under 100 words", "in about 500 words"), ("as a poem", "as a news article"),
    ("with code examples", "without any code"), ("as a tweet", "as a blog post"),
    ("in Python", "in Rust"), ("in SQL", "in Excel formulas"), ("as a checklist", "as an essay"),
)  # fmt: skip
FORMAT_TOPICS = (
    "the causes of the Great Depression", "how vaccines are tested", "the history of the Roman "
    "Empire", "the main features of Kubernetes", "how to brew beer", "the stages of grief",
    "the rules of rugby", "the benefits of unit testing", "how interest rates affect housing",
    "the life cycle of a star", "how to care for a bonsai tree", "the plot of Macbeth",
    "the differences between TCP and UDP", "how a bill becomes law", "the structure of a cell",
    "how to start a podcast", "the pros and cons of remote work", "the history of jazz",
)  # fmt: skip

# Same-template entity swaps.
ENTITY_TEMPLATES = (
    ("Who founded {}?", ("Google", "IBM", "Nike", "Samsung", "Ikea", "Netflix", "Spotify", "Uber")),
    ("What is the currency of {}?", ("Chile", "Kenya", "Norway", "Vietnam", "Egypt", "Peru",
                                     "Poland", "Israel")),
    ("How do I cook {}?", ("salmon", "lentils", "quinoa", "tofu", "duck breast", "couscous",
                           "asparagus", "scallops")),
    ("What are the health benefits of {}?", ("turmeric", "ginger", "kale", "green tea",
                                             "blueberries", "walnuts", "oats", "garlic")),
    ("Write a short biography of {}.", ("Ada Lovelace", "Nikola Tesla", "Frida Kahlo",
                                        "Nelson Mandela", "Alan Turing", "Jane Austen",
                                        "Charles Darwin", "Mozart")),
    ("How do I use {} in Python?", ("decorators", "generators", "dataclasses", "asyncio",
                                    "f-strings", "list comprehensions", "context managers",
                                    "type hints")),
    ("What is the climate like in {}?", ("Norway", "Chile", "Kenya", "Mongolia", "Portugal",
                                         "Vietnam", "Scotland", "Texas")),
    ("Explain how {} works.", ("a heat pump", "a microwave", "GPS", "a solar panel", "Wi-Fi",
                               "a transistor", "a hydraulic press", "an electric motor")),
)  # fmt: skip

# Topics for paraphrase templates: (noun phrase, verb phrase).
HOWTO = (
    "learn to swim as an adult", "write a good essay introduction", "negotiate a higher salary",
    "make homemade pasta", "get better at public speaking", "fall asleep faster",
    "set up a home Wi-Fi network", "teach a dog to fetch", "save money on groceries",
    "write clean code", "start a vegetable garden", "reduce stress at work",
    "prepare for a marathon", "learn a new language fast", "organize my email inbox",
    "make friends in a new city", "clean a microwave", "get rid of hiccups",
    "choose a good laptop", "write a business plan", "improve my posture", "make sushi at home",
    "write a SQL join", "debug a segmentation fault", "set up two-factor authentication",
    "invest in index funds", "write a thank-you note", "remove rust from metal",
    "parse JSON in Go", "deploy a static website", "care for a sourdough starter",
    "keep a New Year's resolution", "train for a 10k", "paint with watercolors",
)  # fmt: skip
CONCEPTS = (
    "inflation targeting", "a neural network", "the greenhouse effect", "quantum entanglement",
    "a mortgage", "the stock market", "a REST API", "the immune system", "plate tectonics",
    "supply chain management", "a mutual fund", "the French Revolution", "general relativity",
    "a compiler", "Docker containers", "the Fibonacci sequence", "an index fund",
    "the placebo effect", "a credit default swap", "the Doppler effect", "natural selection",
    "object-oriented design", "the tragedy of the commons", "a hash function",
    "the Monty Hall problem",
)  # fmt: skip
UNRELATED = HOWTO + tuple(f"explain {c}" for c in CONCEPTS)


def split(values: tuple[T, ...], part: str) -> tuple[T, ...]:
    """Every fifth value (offset 4) is for tuning, the rest for training."""
    if part == "tune":
        return values[4::5]
    return tuple(v for i, v in enumerate(values) if i % 5 != 4)
