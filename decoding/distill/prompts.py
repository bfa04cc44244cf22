"""Agent-style prompts written by the project, for distillation: never a downloaded data set.

Two stages. Stage one asks for text the target writes itself (paragraphs, code, answers, tool calls,
JSON); stage two builds prompts on the target's stage-one texts: copy with edits, summarise, extract
JSON, edit code, answer after a tool result. Everything is drawn from the lists below with a seeded RNG,
so a seed gives the same prompts on every machine. None of these prompts is in the bench workload.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("chat", "tool", "json", "copy", "summary", "code")

TOPICS = [
    "a lighthouse keeper's daily routine", "how tides work", "the history of the bicycle", "urban beekeeping",
    "a small bakery opening in a mountain village", "the water cycle", "how vaccines are tested",
    "a library that lends tools", "solar panels on apartment roofs", "the first day at a new job",
    "a night train across Europe", "composting at home", "a chess tournament in a school gym",
    "how a bill becomes a law", "the migration of swallows", "a community garden dispute",
    "the invention of the printing press", "a power outage in a big city", "learning to play the violin",
    "a ferry service between two islands", "the rise of electric scooters", "a museum's new dinosaur exhibit",
    "how coffee is roasted", "a volunteer fire brigade", "remote work and small towns", "the life of a glacier",
    "a data center's cooling system", "a marathon through an old city", "how recycling plants sort plastic",
    "a farmer switching to drip irrigation", "the restoration of an old cinema", "a robot vacuum's first week",
    "a city replacing street lights with LEDs", "how bridges are inspected", "a hiking trail closed by storms",
    "the opening of a new metro line", "a startup making plant-based cheese", "a school trip to an observatory",
    "a hospital adopting electronic records", "a harbor upgrading its cranes",
]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Osaka", "Lima", "Toronto", "Krakow", "Hanoi", "Tunis", "Perth",
          "Bergen", "Quito", "Seville", "Tallinn", "Accra", "Denver", "Lyon", "Busan", "Cordoba", "Aarhus"]
NAMES = ["Amira", "Tomasz", "Keiko", "Lucas", "Priya", "Olu", "Freya", "Mateo", "Ingrid", "Sanjay", "Lena",
         "Kwame", "Yuki", "Rafael", "Noor", "Elias", "Chiara", "Dmitri", "Zanele", "Henrik"]
THINGS = ["laptop", "bicycle", "desk lamp", "coffee grinder", "backpack", "router", "kettle", "monitor",
          "headphones", "printer", "tent", "camera", "blender", "keyboard", "umbrella"]
QUESTIONS = [
    "What is the difference between {a} and {b}?", "Explain {c} in simple terms.",
    "Give me three tips for {d}.", "Why is {c} important?", "How do I get started with {d}?",
    "What are common mistakes when {d}?", "Can you compare {a} and {b} in a short table?",
    "Write a haiku about {t}.", "I'm feeling unmotivated about {d}. Any advice?",
    "What should I pack for a weekend in {city}?", "Describe {t} to a ten-year-old.",
    "List five questions to ask before {d}.",
]
PAIRS = [("TCP", "UDP"), ("a list", "a tuple in Python"), ("RAM", "storage"), ("weather", "climate"),
         ("a virus", "a bacterium"), ("SQL", "NoSQL databases"), ("stocks", "bonds"), ("HTTP", "HTTPS"),
         ("a compiler", "an interpreter"), ("mitosis", "meiosis"), ("git merge", "git rebase")]
CONCEPTS = ["recursion", "compound interest", "photosynthesis", "public key cryptography", "inflation",
            "garbage collection", "the greenhouse effect", "caching", "supply and demand", "unit testing",
            "load balancing", "the immune system", "version control", "interest rates"]
ACTIVITIES = ["learning a new language", "running a first 10k", "writing a cover letter", "moving to a new city",
              "planning a team offsite", "reviewing code", "saving for a trip", "starting a vegetable garden",
              "preparing for a job interview", "training a puppy", "organising a small conference"]
CODE_TASKS = [
    "parses a date string like '2024-03-15' and returns the weekday name",
    "counts the words in a text file and returns the ten most common",
    "validates an email address with a regular expression",
    "merges two sorted lists into one sorted list",
    "computes the moving average of a list of numbers with a window size",
    "reads a CSV file of orders and returns the total per customer",
    "retries an HTTP GET request up to three times with exponential backoff",
    "converts a temperature between Celsius and Fahrenheit",
    "flattens a nested dictionary into dotted keys",
    "checks whether a string is a palindrome, ignoring punctuation",
    "groups a list of transactions by month",
    "implements a simple LRU cache class",
    "finds duplicate files in a directory by their SHA-256 hash",
    "paginates a list into pages of a given size",
    "formats a number of seconds as hours, minutes and seconds",
]

TOOLS: list[dict[str, Any]] = [
    {"name": "get_forecast", "description": "Get the weather forecast for a city for the next days.",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
         "required": ["city"]}},
    {"name": "send_email", "description": "Send an email.",
     "parameters": {"type": "object", "properties": {
         "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
         "required": ["to", "subject", "body"]}},
    {"name": "create_event", "description": "Create a calendar event.",
     "parameters": {"type": "object", "properties": {
         "title": {"type": "string"}, "date": {"type": "string", "description": "YYYY-MM-DD"},
         "start_time": {"type": "string", "description": "HH:MM"},
         "attendees": {"type": "array", "items": {"type": "string"}}}, "required": ["title", "date"]}},
    {"name": "search_products", "description": "Search the shop's catalogue.",
     "parameters": {"type": "object", "properties": {
         "query": {"type": "string"}, "max_price": {"type": "number"},
         "sort": {"type": "string", "enum": ["price", "rating", "newest"]}}, "required": ["query"]}},
    {"name": "convert_currency", "description": "Convert an amount between currencies.",
     "parameters": {"type": "object", "properties": {
         "amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
         "required": ["amount", "from", "to"]}},
    {"name": "read_file", "description": "Read a file from the workspace.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "run_sql", "description": "Run a read-only SQL query on the analytics database.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "book_table", "description": "Book a restaurant table.",
     "parameters": {"type": "object", "properties": {
         "restaurant": {"type": "string"}, "people": {"type": "integer"}, "time": {"type": "string"}},
         "required": ["restaurant", "people", "time"]}},
    {"name": "translate", "description": "Translate text into another language.",
     "parameters": {"type": "object", "properties": {
         "text": {"type": "string"}, "target_language": {"type": "string"}}, "required": ["text", "target_language"]}},
    {"name": "create_ticket", "description": "Open a support ticket.",
     "parameters": {"type": "object", "properties": {
         "title": {"type": "string"}, "priority": {"type": "string", "enum": ["low", "normal", "high"]},
         "description": {"type": "string"}}, "required": ["title", "priority"]}},
]
TOOL_REQUESTS = {
    "get_forecast": ["What will the weather be like in {city} for the next {n} days?",
                     "Is it going to rain in {city} tomorrow?"],
    "send_email": ["Email {name_l}@example.com that the {thing} order has shipped.",
                   "Send {name} a short note saying the meeting moved to {n} pm."],
    "create_event": ["Put a meeting with {name} on 2025-0{n}-1{n} at 10:30 called 'Budget review'.",
                     "Schedule 'Team lunch' on 2025-06-0{n} with {name} and {name2}."],
    "search_products": ["Find me a {thing} under {price} dollars, cheapest first.", "Show the best rated {thing}s."],
    "convert_currency": ["How much is {price} euros in Japanese yen?", "Convert {price} USD to GBP."],
    "read_file": ["Open src/{thing_u}.py and show me what's inside.", "Read the file notes/{name_l}.txt."],
    "run_sql": ["How many orders did we get from {city} last month?", "List the ten customers who spent the most."],
    "book_table": ["Book a table for {n} at Casa {name} at 19:30.",
                   "Reserve dinner for {n} people at The Olive tonight at 8."],
    "translate": ["Translate 'Where is the train station?' into {lang}.",
                  "How do you say 'thank you for your help' in {lang}?"],
    "create_ticket": ["My {thing} stopped working after the update, please open a high priority ticket.",
                      "Open a low priority ticket: the {thing} page has a typo."],
}
LANGS = ["French", "Spanish", "German", "Japanese", "Portuguese", "Italian", "Swahili", "Polish"]

EDITS = [
    "Repeat the following text exactly, word for word.",
    "Rewrite the following text, replacing every occurrence of '{w1}' with '{w2}'. Change nothing else.",
    "Fix any spelling or grammar mistakes in this text and return the full corrected text.",
    "Turn this text into a bulleted list of its main points, keeping the original wording where possible.",
    "Rewrite this text in the first person, keeping all the facts.",
    "Quote the first two sentences of this text exactly, then add one sentence of your own.",
    "Return this text with each sentence on its own line.",
]
SUMMARIES = [
    "Summarize this text in two sentences.", "Give a one-line summary of this text.",
    "What are the three key facts in this text?", "Write a short headline and a one-paragraph summary for this.",
    "Explain the main point of this text to a busy manager.",
]
CODE_EDITS = [
    "Add type hints and a docstring to this function. Return only the code.",
    "Rename the function in this code to `{fname}` and change nothing else.",
    "Add error handling for invalid input to this code. Return the full code.",
    "Write two pytest tests for this code.", "Explain what this code does, line by line.",
]
JSON_ASKS = [
    "Return a JSON object describing a {thing} for sale, with keys name, price, in_stock and tags.",
    "Give me a JSON array of three fictional users with id, name, email and city.",
    "Describe {city} as JSON with keys country, population_estimate, famous_for (a list) and best_month.",
    "Return a JSON object for a calendar event with {name}: title, date, start, end, location.",
    "Output a JSON config for a web server with host, port, tls (an object) and allowed_origins.",
]
EXTRACTS = [
    "Extract the people, places and numbers mentioned in this text as JSON with keys people, places, numbers.",
    "Return JSON with keys title, topic, sentiment and key_points (a list) for this text.",
]


@dataclass
class DistillPrompt:
    category: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)


def _fill(template: str, rng: random.Random) -> str:
    name, name2 = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    a, b = rng.choice(PAIRS)
    values = {
        "a": a, "b": b, "c": rng.choice(CONCEPTS), "d": rng.choice(ACTIVITIES), "t": rng.choice(TOPICS),
        "city": rng.choice(CITIES), "name": name, "name2": name2, "name_l": name.lower(), "thing": thing,
        "thing_u": thing.replace(" ", "_"), "n": rng.randint(2, 6), "price": rng.choice([40, 75, 120, 250, 900]),
        "lang": rng.choice(LANGS), "fname": rng.choice(["process_items", "run_job", "compute", "handle"]),
        "w1": "the", "w2": "a",
    }
    return template.format(**values)


def stage_one(rng: random.Random, count: int) -> list[DistillPrompt]:
    """Prompts that need nothing but themselves: answers, paragraphs, code, tool calls, JSON."""
    out: list[DistillPrompt] = []
    for i in range(count):
        kind = i % 5
        if kind == 0:
            out.append(DistillPrompt("chat", [{"role": "user", "content": _fill(rng.choice(QUESTIONS), rng)}]))
        elif kind == 1:
            topic = rng.choice(TOPICS)
            ask = rng.choice(["Write a short news article about {}.", "Write a paragraph about {}.",
                              "Write a short story about {}.", "Write an email to a colleague about {}."]).format(topic)
            out.append(DistillPrompt("chat", [{"role": "user", "content": ask}]))
        elif kind == 2:
            task = rng.choice(CODE_TASKS)
            out.append(DistillPrompt("code", [
                {"role": "system", "content": "You are a careful coding assistant."},
                {"role": "user", "content": f"Write a Python function that {task}."}]))
        elif kind == 3:
            tools = rng.sample(TOOLS, rng.randint(1, 4))
            request = _fill(rng.choice(TOOL_REQUESTS[tools[0]["name"]]), rng)
            out.append(DistillPrompt("tool", [{"role": "user", "content": request}], tools))
        else:
            out.append(DistillPrompt("json", [
                {"role": "system", "content": "You reply with JSON only."},
                {"role": "user", "content": _fill(rng.choice(JSON_ASKS), rng)}]))
    return out


def stage_two(rng: random.Random, texts: list[tuple[DistillPrompt, str]], count: int) -> list[DistillPrompt]:
    """Prompts built on the target's own stage-one outputs: copy, summarise, extract, edit, follow up."""
    prose = [t for p, t in texts if p.category == "chat" and len(t) > 300]
    code = [t for p, t in texts if p.category == "code" and "def " in t]
    calls = [(p, t) for p, t in texts if p.category == "tool" and "{" in t]
    out: list[DistillPrompt] = []
    for i in range(count):
        kind = i % 5
        if kind in (0, 1) and prose:
            ask = _fill(rng.choice(EDITS), rng)
            out.append(DistillPrompt("copy", [{"role": "user", "content": f"{ask}\n\n{rng.choice(prose)}"}]))
        elif kind == 2 and prose:
            ask = rng.choice(SUMMARIES + EXTRACTS)
            category = "json" if ask in EXTRACTS else "summary"
            out.append(DistillPrompt(category, [{"role": "user", "content": f"{ask}\n\n{rng.choice(prose)}"}]))
        elif kind == 3 and code:
            ask = _fill(rng.choice(CODE_EDITS), rng)
            out.append(DistillPrompt("code", [{"role": "user", "content": f"{ask}\n\n{rng.choice(code)}"}]))
        elif calls:
            prompt, call = rng.choice(calls)
            result = {"status": "ok", "data": {"city": rng.choice(CITIES), "value": rng.randint(3, 900),
                                               "items": rng.sample(THINGS, 2)}}
            out.append(DistillPrompt("tool", [
                *prompt.messages,
                {"role": "assistant", "content": call},
                {"role": "user", "content": f"<tool_response>\n{json.dumps(result)}\n</tool_response>\n"
                                            "Answer my question using this result."},
            ], prompt.tools))
    return out
