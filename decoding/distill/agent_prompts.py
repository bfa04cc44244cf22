"""Agent-shaped prompts for distillation, in the forms agent frameworks send (written by the project).

`prompts.py` asks in the engine's own chat format: tools rendered by draftgate, prose to copy. Agents send
other shapes too, and a head trained only on the first memorises it (v2 accepted 30% of first drafts on
the bench's prompts against 40% held out). This module writes, from seeded lists:
- tools listed in the system prompt in several phrasings, with per-argument descriptions, and requests
  carrying concrete values (ids, dates, addresses) to copy into the call;
- structured documents to edit and return whole: JSON records, CSV tables, env/INI/YAML configs,
  standard-library code; the edit is a rename, a value change, an added field or a format change;
- documentation and reports to summarise or extract from (standard-library docs, generated reports);
- chat with assorted system prompts.
None of these prompts is in the bench workload.
"""

from __future__ import annotations

import json
import random
from typing import Any

from decoding.distill.prompts import ACTIVITIES, CITIES, CONCEPTS, NAMES, THINGS, TOPICS, DistillPrompt
from decoding.distill.texts import code_chunks, doc_chunks

TOOL_PREAMBLES = (
    "You can use these tools:\n\n{tools}\n\nWhen a tool is needed, reply with only a JSON object "
    '{{"name": <tool name>, "arguments": {{...}}}} and nothing else.',
    "Available functions (JSON schema):\n{tools}\n\nTo call a function, output exactly one JSON object with "
    'the keys "name" and "arguments". Use the values the user gave.',
    "## Functions\n\n<functions>\n{tools}\n</functions>\n\nCall a function by answering with "
    '{{"name": "...", "arguments": {{...}}}} only.',
    "You are an assistant that acts through tools. Tools:\n{tools}\nAnswer with a single JSON tool call.",
)
AGENT_TOOLS: list[tuple[dict[str, Any], list[str]]] = [
    ({"name": "lookup_order", "description": "Look up an order in the shop's database.",
      "parameters": {"type": "object", "properties": {
          "order_id": {"type": "string", "description": "Order number, e.g. 'SO-12345'"},
          "include_items": {"type": "boolean", "description": "Whether to return the line items"}},
          "required": ["order_id"]}},
     ["Where is my order {order}? Please include the items.", "Check the status of order {order}."]),
    ({"name": "set_reminder", "description": "Create a reminder for the user.",
      "parameters": {"type": "object", "properties": {
          "text": {"type": "string", "description": "What to remind about"},
          "when": {"type": "string", "description": "ISO 8601 date and time"}}, "required": ["text", "when"]}},
     ["Remind me to call {name} on {date} at {time}.",
      "Set a reminder for {date} {time}: renew the {thing} warranty."]),
    ({"name": "get_stock_price", "description": "Get the latest price of a stock.",
      "parameters": {"type": "object", "properties": {
          "ticker": {"type": "string", "description": "Ticker symbol, e.g. 'AAPL'"},
          "exchange": {"type": "string", "description": "Exchange code", "enum": ["NASDAQ", "NYSE", "LSE"]}},
          "required": ["ticker"]}},
     ["What is {ticker} trading at on the {exchange} right now?", "Get me the price of {ticker}."]),
    ({"name": "list_files", "description": "List the files in a directory.",
      "parameters": {"type": "object", "properties": {
          "path": {"type": "string", "description": "Directory path"},
          "pattern": {"type": "string", "description": "Glob pattern to filter names, e.g. '*.py'"}},
          "required": ["path"]}},
     ["Which {ext} files are in {dir}?", "Show me everything under {dir}."]),
    ({"name": "geocode", "description": "Turn an address into latitude and longitude.",
      "parameters": {"type": "object", "properties": {
          "address": {"type": "string", "description": "Full street address"}}, "required": ["address"]}},
     ["What are the coordinates of {number} {street}, {city}?", "Geocode this address: {number} {street}, {city}."]),
    ({"name": "git_commit", "description": "Commit the staged changes in the repository.",
      "parameters": {"type": "object", "properties": {
          "message": {"type": "string", "description": "Commit message"},
          "amend": {"type": "boolean", "description": "Amend the previous commit instead"}},
          "required": ["message"]}},
     ["Commit what I staged with the message \"{commit}\".", "Amend the last commit, message: \"{commit}\"."]),
    ({"name": "query_metrics", "description": "Query a time series from the monitoring system.",
      "parameters": {"type": "object", "properties": {
          "metric": {"type": "string", "description": "Metric name"},
          "service": {"type": "string", "description": "Service name"},
          "minutes": {"type": "integer", "description": "How far back to look, in minutes"}},
          "required": ["metric", "service"]}},
     ["Show {metric} for the {service} service over the last {n}0 minutes.",
      "How has {metric} of {service} looked lately?"]),
    ({"name": "transfer_money", "description": "Transfer money between the user's accounts.",
      "parameters": {"type": "object", "properties": {
          "from_account": {"type": "string", "description": "Source account id"},
          "to_account": {"type": "string", "description": "Destination account id"},
          "amount": {"type": "number", "description": "Amount in the account currency"}},
          "required": ["from_account", "to_account", "amount"]}},
     ["Move {price}.50 from account {acct} to {acct2}.", "Transfer {price} from {acct} into savings {acct2}."]),
]
STREETS = ["Rua Augusta", "Baker Street", "Karl Johans gate", "Calle Mayor", "Main Street", "Rue de Rivoli"]
TICKERS = ["NVDA", "MSFT", "SAP", "ASML", "TSLA", "KO"]
METRICS = ["p99 latency", "error rate", "cpu usage", "queue depth", "requests per second"]
SERVICES = ["checkout", "search", "auth", "billing", "notifications"]
COMMITS = ["Fix off-by-one in pagination", "Add retry to the uploader", "Bump version to 2.4.1", "Remove dead code"]

SYSTEMS = ("", "You are a helpful assistant.", "You are a concise assistant.", "You are a friendly tutor.",
           "You are an expert software engineer.", "You answer briefly and clearly.")
CHAT_ASKS = (
    "What's a good way to learn {c}?", "Can you explain {c} with an everyday example?", "Give me a checklist for {d}.",
    "Write a short poem about {t}.", "Brainstorm six names for a shop that sells {thing}s.",
    "I have ten minutes. What can I do about {d}?", "Tell me three surprising facts about {t}.",
    "How would you describe {c} to someone who has never heard of it?", "Plan a day trip to {city} for me.",
)
COPY_ASKS = {
    "json": ["Add a field \"{key}\": {value} to this JSON and return the whole object, indented:",
             "Change \"{field}\" to {value} in this record and return all of it:",
             "Return this JSON with the keys in the same order but \"{field}\" removed:"],
    "csv": ["Change every \"{status}\" in the status column to \"{status2}\" and return the full CSV:",
            "Add a column `currency` with the value EUR to this CSV. Return all rows:",
            "Convert this CSV into a markdown table, keeping every row:"],
    "config": ["Set {key_u} to {value_s} in this file and return it unchanged otherwise:",
               "Add the line {key_u}={value_s} at the end of this config and return the whole file:",
               "Comment out {field_u} in this file and give me the full file back:"],
    "code": ["Rename `{name}` to `{name2}` in this code and change nothing else:",
             "Add a one-line docstring to this function and return the full code:",
             "Return this code exactly as it is, but with the type hints removed:"],
}
SUMMARY_ASKS = ("Summarize this in three sentences.", "Give me the key points as a bullet list.",
                "TL;DR, one or two lines please.", "What are the most important details here?",
                "Extract the facts a developer needs from this, as a short list.")


def _values(rng: random.Random) -> dict[str, Any]:
    name, name2 = rng.sample(NAMES, 2)
    return {
        "name": name, "name2": name2, "city": rng.choice(CITIES), "thing": rng.choice(THINGS),
        "order": f"SO-{rng.randint(10000, 99999)}", "date": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "time": f"{rng.randint(7, 20)}:{rng.choice(['00', '15', '30', '45'])}", "ticker": rng.choice(TICKERS),
        "exchange": rng.choice(["NASDAQ", "NYSE", "LSE"]), "ext": rng.choice(["*.py", "*.md", "*.json", "*.log"]),
        "dir": rng.choice(["/var/log", "~/projects/api", "./src", "/etc/nginx"]), "number": rng.randint(1, 240),
        "street": rng.choice(STREETS), "commit": rng.choice(COMMITS), "metric": rng.choice(METRICS),
        "service": rng.choice(SERVICES), "n": rng.randint(2, 9), "price": rng.choice([45, 120, 380, 1500]),
        "acct": f"ACC-{rng.randint(1000, 9999)}", "acct2": f"ACC-{rng.randint(1000, 9999)}",
        "c": rng.choice(CONCEPTS), "d": rng.choice(ACTIVITIES), "t": rng.choice(TOPICS),
    }


def tool_prompt(rng: random.Random) -> DistillPrompt:
    chosen = rng.sample(AGENT_TOOLS, rng.randint(1, 3))
    listing = "\n".join(json.dumps(tool) for tool, _ in chosen)
    system = rng.choice(TOOL_PREAMBLES).format(tools=listing)
    request = rng.choice(chosen[0][1]).format(**_values(rng))
    return DistillPrompt("tool", [{"role": "system", "content": system}, {"role": "user", "content": request}])


def _record(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(NAMES)
    return {"id": rng.randint(1000, 99999), "name": name, "email": f"{name.lower()}@example.com",
            "city": rng.choice(CITIES), "active": rng.random() < 0.5, "score": round(rng.uniform(0, 100), 1),
            "tags": rng.sample(["admin", "beta", "vip", "new", "staff"], 2),
            "address": {"street": rng.choice(STREETS), "number": rng.randint(1, 200)}}


def _csv(rng: random.Random) -> str:
    rows = ["order_id,customer,city,amount,status"]
    for _ in range(rng.randint(4, 9)):
        rows.append(f"B-{rng.randint(100, 999)},{rng.choice(NAMES)} {rng.choice(['Ltd', 'GmbH', 'Co'])},"
                    f"{rng.choice(CITIES)},{rng.uniform(5, 900):.2f},{rng.choice(['paid', 'open', 'refunded'])}")
    return "\n".join(rows)


def _config(rng: random.Random) -> str:
    keys = ["APP_NAME=orders", f"PORT={rng.choice([8000, 8080, 3000])}", "LOG_LEVEL=info",
            f"DATABASE_URL=postgres://app@db:5432/{rng.choice(['orders', 'main'])}", "CACHE_TTL=300",
            f"REGION={rng.choice(['eu-west-1', 'us-east-2'])}", "FEATURE_FLAGS=search,export"]
    return "\n".join(rng.sample(keys, rng.randint(4, len(keys))))


def copy_prompt(rng: random.Random, code: list[tuple[str, str, str]]) -> DistillPrompt:
    kind = rng.choice(list(COPY_ASKS))
    if kind == "json":
        text = json.dumps(_record(rng), indent=rng.choice([None, 2]))
    elif kind == "csv":
        text = _csv(rng)
    elif kind == "config":
        text = _config(rng)
    else:
        _, _, text = rng.choice(code)
        text = f"```python\n{text}\n```"
    fields = {"key": rng.choice(["verified", "plan", "region"]), "value": rng.choice(["true", '"pro"', "42"]),
              "field": rng.choice(["city", "score", "active"]), "status": "open", "status2": "pending",
              "key_u": rng.choice(["LOG_LEVEL", "CACHE_TTL", "SENTRY_DSN"]), "value_s": rng.choice(["debug", "600"]),
              "field_u": rng.choice(["PORT", "REGION"]), "name": "result", "name2": "output"}
    ask = rng.choice(COPY_ASKS[kind]).format(**fields)
    messages = [{"role": "user", "content": f"{ask}\n\n{text}"}]
    if rng.random() < 0.4:
        messages.insert(0, {"role": "system", "content": "Return only the edited content, without commentary."})
    return DistillPrompt("copy", messages)


def summary_prompt(rng: random.Random, docs: list[tuple[str, str]]) -> DistillPrompt:
    _, chunk = rng.choice(docs)
    return DistillPrompt("summary", [{"role": "user", "content": f"{rng.choice(SUMMARY_ASKS)}\n\n{chunk}"}])


def chat_prompt(rng: random.Random) -> DistillPrompt:
    ask = rng.choice(CHAT_ASKS).format(**_values(rng))
    system = rng.choice(SYSTEMS)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": ask}]
    return DistillPrompt("chat", messages)


def agent_prompts(rng: random.Random, count: int) -> list[DistillPrompt]:
    """`count` prompts, a quarter each of tool, copy, summary and chat."""
    docs = doc_chunks(1200)
    code = code_chunks(30)
    makers = (lambda: tool_prompt(rng), lambda: copy_prompt(rng, code), lambda: summary_prompt(rng, docs),
              lambda: chat_prompt(rng))
    return [makers[i % len(makers)]() for i in range(count)]
