"""Wordings and slot values for the everyday request families (verifier_everyday.py).

Written for issue 37's second round after the held-out set was frozen and without reading
it: every wording is a generic way to ask for something, every slot value an everyday
subject. verifier_leak.py fails the data build if a generated sentence is the same as, or a
near-duplicate of, a held-out sentence. Slot values are split train/tune with
verifier_vocab.split, so the tuning split never shares one with training.
"""

from __future__ import annotations

# Wordings per request kind: "{}" is the request's object. Each pair of different wordings
# of one kind over one object is a "same request" example.
WRITE = (
    "Write {}.", "Please write {}.", "Can you write {}?", "Could you write me {}?",
    "I need {}.", "Draft {}.", "Help me write {}.", "Compose {}.", "write {} for me",
    "I'd like you to write {}.", "Create {}.", "Can I get {}?", "Put together {}.",
    "Would you mind writing {}?", "Generate {}.", "I want {}, please.",
)  # fmt: skip
EXPLAIN = (
    "Explain {}.", "What is {}?", "Can you explain {}?", "What's {}?", "Help me understand {}.",
    "I don't understand {}. Can you explain it?", "Give me an explanation of {}.",
    "Break down {} for me.", "Could you clarify what {} is?", "explain {} pls",
    "Tell me what {} is.", "What exactly is {}?", "I'd like to know what {} is.",
    "Walk me through {}.", "Define {}.", "what is {} exactly",
)  # fmt: skip
LIST = (
    "List {}.", "Give me a list of {}.", "What are some {}?", "Can you list some {}?",
    "Name a few {}.", "I'm looking for {}. Any suggestions?", "Suggest some {}.",
    "What are good {}?", "Share some {}.", "Could you give me some {}?", "list some {}",
    "Any {}?", "I need some {}.", "Tell me some {}.", "What would you recommend for {}?",
)  # fmt: skip
LIST_N = (
    "List {} {}.", "Give me {} {}.", "Name {} {}.", "What are {} {}?", "Can you suggest {} {}?",
    "I need {} {}.", "Share {} {}.", "Come up with {} {}.", "Suggest {} {}.",
)  # fmt: skip
SUMMARIZE = (
    "Summarize {}.", "Give me a summary of {}.", "Can you sum up {}?", "Sum up {}.",
    "What's the gist of {}?", "I need a summary of {}.", "Provide an overview of {}.",
    "Recap {} for me.", "summarize {} please", "Could you summarize {}?",
    "Give me the short version of {}.", "Write a summary of {}.",
)  # fmt: skip
COMPARE_SYM = (
    "What's the difference between {} and {}?", "Compare {} and {}.", "How do {} and {} differ?",
    "{} vs {}: what's the difference?", "Explain the difference between {} and {}.",
    "What is the difference between {} and {}?", "Can you compare {} with {}?",
    "difference between {} and {}", "How are {} and {} different?", "{} versus {}?",
)  # fmt: skip
PREFER = (
    "Is {} better than {}?", "Should I choose {} over {}?", "Why is {} better than {}?",
    "Is {} a better choice than {}?", "Would you pick {} over {}?",
)  # fmt: skip
CONVERT_N = (
    "Convert {} {} to {}.", "How many {2} is {0} {1}?", "What is {} {} in {}?", "{} {} to {}",
    "How much is {} {} in {}?", "Can you convert {} {} into {}?", "{} {} in {}?",
    "what's {} {} in {}", "Change {} {} to {}.",
)  # fmt: skip
CODE = (
    "How do I {1} in {0}?", "How to {1} in {0}", "In {0}, how can I {1}?", "{0}: how to {1}?",
    "What's the {0} code to {1}?", "Show me how to {1} in {0}.", "Write {0} code to {1}.",
    "How can I {1} using {0}?", "how do you {1} in {0}", "Give me a {0} example that shows "
    "how to {1}.", "What is the way to {1} in {0}?", "I'm using {0}. How do I {1}?",
)  # fmt: skip
RECIPE = (
    "How do I make {}?", "Give me a recipe for {}.", "What's a good recipe for {}?",
    "How to cook {}", "Teach me to make {}.", "Recipe for {}?", "How can I make {} at home?",
    "Can you share a recipe for {}?", "I want to cook {}. How?", "how do you make {}",
    "What's the best way to make {}?", "Walk me through making {}.",
)  # fmt: skip
CITY = (
    "What are the best things to do in {}?", "Top attractions in {}?", "What should I see in {}?",
    "Things to do in {}", "What to visit in {}?", "Recommend some sights in {}.",
    "What are the must-see places in {}?", "I'm visiting {}. What should I do there?",
    "Best places to visit in {}?", "What's worth seeing in {}?",
)  # fmt: skip
FIX = (
    "How do I fix {}?", "How can I fix {}?", "{}: how do I fix it?", "What's the fix for {}?",
    "How to resolve {}", "I keep getting {}. What should I do?", "How do I get rid of {}?",
    "Any idea how to fix {}?", "Help, I have {}. How do I solve it?", "Solve {} for me.",
)  # fmt: skip
OPEN_ENDED = (  # wrappers that keep a request the same: "{}" is a whole request
    "{}", "Quick question: {}", "Hey, {}", "Hi! {}", "{} Thanks!", "{} Thanks in advance.",
    "I was wondering: {}", "Question: {}", "{} Please help.", "Hello, {}",
)  # fmt: skip

WRITE_OBJECTS = (
    "a cover letter for a nursing job", "a birthday message for my sister",
    "a haiku about the ocean", "a product description for a standing desk",
    "a short story about a lost robot", "an apology email to a customer",
    "a LinkedIn summary for a data analyst", "a toast for my best friend's wedding",
    "a limerick about a lazy cat", "a resignation letter", "a tagline for a coffee shop",
    "a workout plan for beginners", "a weekly meal plan", "a README for a command-line tool",
    "unit tests for a login function", "a thank-you email after an interview",
    "a poem about autumn rain", "a complaint letter to my landlord",
    "an out-of-office reply", "a bio for my personal website", "a speech for a retirement party",
    "a job posting for a barista", "a lullaby for a toddler", "a slogan for a recycling campaign",
    "a short horror story set in a lighthouse",
)  # fmt: skip
EXPLAIN_OBJECTS = (
    "an annuity", "a Gantt chart", "a VPN", "a mesh network", "the electoral college",
    "a credit score", "tidal locking", "the Coriolis effect", "an API gateway", "a Roth IRA",
    "a hedge fund", "a heat index", "the gig economy", "DNS", "cholesterol",
    "the sunk cost fallacy", "carbon offsets", "dark matter", "an insurance deductible",
    "garbage collection", "a sonnet", "opportunity cost", "a load balancer", "osmosis",
    "the butterfly effect",
)  # fmt: skip
LIST_OBJECTS = (
    "healthy breakfast ideas", "audiobooks for long drives", "fun things to do on a "
    "rainy day", "ways to decorate a small flat", "signs of a vitamin D deficiency",
    "common Python "
    "interview questions", "ways to save electricity at home", "houseplants that need little "
    "light", "side dishes for grilled chicken", "hobbies for retirees", "board games for two "
    "players", "signs of burnout", "ways to sleep better", "podcasts about history",
    "cheap date ideas", "stretches for lower back pain", "names for a golden retriever",
    "team-building activities for remote teams", "snacks for a road trip",
    "questions to ask a landlord", "easy vegetables to grow on a balcony",
    "things to pack for a beach holiday", "icebreaker questions for a meeting",
    "ways to practice mindfulness", "classic science fiction films",
)  # fmt: skip
SUMMARY_OBJECTS = (
    "the plot of King Lear", "the theory of evolution", "the history of the internet",
    "the causes of World War I", "the book Atomic Habits", "the main ideas of stoicism",
    "the Paris climate agreement", "the life of Marie Curie", "the story of the Titanic",
    "the plot of Pride and Prejudice", "the Cold War", "the history of the Olympic Games",
    "the main points of Keynesian economics", "the plot of The Odyssey",
    "the story of the Apollo 11 mission",
)  # fmt: skip
SYMMETRIC_PAIRS = (
    ("Python", "JavaScript"), ("a Roth IRA", "a traditional IRA"), ("TCP", "UDP"),
    ("baking soda", "baking powder"), ("a lake", "a pond"), ("a mutual fund", "an ETF"),
    ("stocks", "bonds"), ("RAM", "storage"), ("a latte", "a cappuccino"), ("SQL", "NoSQL"),
    ("an LLC", "a sole proprietorship"), ("a crocodile", "an alligator"),
    ("a condo", "a townhouse"), ("HTTP", "HTTPS"), ("a debit card", "a credit card"),
    ("Docker", "a virtual machine"), ("empathy", "sympathy"), ("a tornado", "a hurricane"),
    ("git merge", "git rebase"), ("term life insurance", "whole life insurance"),
)  # fmt: skip
UNIT_PAIRS = (
    ("miles", "kilometers"), ("pounds", "kilograms"), ("Fahrenheit", "Celsius"),
    ("gallons", "cubic feet"), ("ounces", "grams"), ("euros", "dollars"), ("yards", "meters"),
    ("tablespoons", "teaspoons"), ("acres", "hectares"), ("megabytes", "gigabytes"),
    ("knots", "miles per hour"), ("stones", "pounds"), ("quarts", "liters"),
    ("minutes", "hours"), ("square feet", "square meters"),
)  # fmt: skip
AMOUNTS = ("3", "5", "12", "20", "25", "40", "75", "100", "150", "250", "2.5", "1000")
COUNTS = ("3", "5", "7", "10", "12", "15", "20")
PROGRAMMING = (
    "Python", "JavaScript", "Java", "Go", "Rust", "C#", "Ruby", "PHP", "TypeScript", "Kotlin",
    "Swift", "C++", "Bash", "R", "Scala",
)  # fmt: skip
CODE_TASKS = (
    "reverse a string", "read a CSV file", "sort a dictionary by value", "make an HTTP request",
    "remove duplicates from a list", "get the current date", "check if a file exists",
    "split a string by commas", "connect to a PostgreSQL database", "parse command-line "
    "arguments", "generate a random number", "write to a text file", "parse a JSON string",
    "flatten a nested list", "convert a string to an integer", "find the length of an array",
    "send an email", "measure how long a function takes", "create a class",
    "handle exceptions",
)  # fmt: skip
# Operations on one object that ask for different things (different_operation negatives).
CODE_OPS = (
    (("reverse", "sort", "shuffle", "copy"), "a list"),
    (("read", "write to", "delete", "rename"), "a file"),
    (("merge", "compare", "invert", "copy"), "two dictionaries"),
    (("encode", "decode"), "a base64 string"),
    (("upload", "download", "delete"), "a file on S3"),
    (("compress", "extract", "encrypt"), "a zip archive"),
    (("create", "drop", "truncate", "index"), "a SQL table"),
    (("start", "stop", "restart", "inspect"), "a Docker container"),
    (("lowercase", "uppercase", "capitalize", "trim"), "a string"),
    (("round", "truncate", "format"), "a float"),
    (("add", "remove", "find"), "an element in a set"),
    (("push", "pull", "delete"), "a git branch"),
)  # fmt: skip
DISHES = (
    "banana bread", "pho", "chicken curry", "pad thai", "a Caesar salad", "guacamole", "lasagna",
    "French onion soup", "hummus", "beef stew", "fried rice", "chocolate chip "
    "cookies", "mushroom risotto", "paella", "shakshuka", "apple pie",
    "tomato soup", "falafel", "carbonara", "lemon drizzle cake",
)  # fmt: skip
DISH_VARIANTS = (  # (plain, changed): the changed dish is another request
    ("{}", "vegan {}"), ("{}", "gluten-free {}"), ("{} with eggs", "{} without eggs"),
    ("{} with meat", "{} without meat"), ("spicy {}", "mild {}"), ("{}", "{} without an oven"),
)  # fmt: skip
CITIES = (
    "Lisbon", "Barcelona", "Kyoto", "Istanbul", "Budapest", "Edinburgh", "Montreal",
    "Copenhagen", "Marrakech", "Buenos Aires", "Singapore", "Cape Town", "Amsterdam",
    "Florence", "Chicago", "San Francisco", "Mexico City", "Hong Kong", "Reykjavik",
    "Melbourne",
)  # fmt: skip
PROBLEMS = (
    "a dripping radiator valve", "a slow laptop", "a squeaky door", "a 404 error on my website",
    "a flat bike tire", "a frozen iPhone", "a clogged drain", "a Wi-Fi connection that "
    "keeps dropping", "a blue screen on Windows", "a merge conflict in git", "a printer "
    "that won't print", "a car battery that keeps dying", "a running toilet",
    "an 'npm install' permission error", "a cracked phone screen",
)  # fmt: skip
# Output formats and audiences appended to a request (output_format negatives).
FORMATS = (
    "as a table", "as a bulleted list", "in JSON", "in YAML", "in one paragraph",
    "in three sentences", "as a numbered list", "in plain English", "as a poem",
    "in Markdown", "as an email", "as a step-by-step guide", "for a five-year-old",
    "for an expert", "in a formal tone", "in a funny way", "as a tweet", "in CSV",
)  # fmt: skip
HUMAN_LANGUAGES = (
    "French", "German", "Spanish", "Italian", "Japanese", "Portuguese", "Chinese", "Korean",
    "Russian", "Dutch", "Hindi", "Arabic", "Turkish", "Swedish", "Vietnamese",
)  # fmt: skip
