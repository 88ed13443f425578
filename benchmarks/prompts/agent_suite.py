"""Writes agent_suite.jsonl: ten multi-turn conversations, 4-6 user turns each, shaped like
what agents and editors send a local model: every turn resends the file or tool output it
is about (an agent loop resends its context; an editor sends the whole file again), and
asks for it back with a change, a quote from it, or a tool call built from it.

Written for specgen (not derived from any evaluation set). Run from the repository root:
    python benchmarks/prompts/agent_suite.py
`specgen bench --suite benchmarks/prompts/agent_suite.jsonl --turns all` runs every turn
with the conversation so far (each method's own earlier answers in it).
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = """server:
  host: 0.0.0.0
  port: 8080
  workers: 4
database:
  url: postgres://app@db:5432/app
  pool_size: 10
  timeout_seconds: 5
cache:
  backend: redis
  url: redis://cache:6379/0
  ttl_seconds: 300
logging:
  level: info
  format: json
"""

UTILS = """import re
from datetime import datetime


def slugify(title):
    text = title.lower().strip()
    text = re.sub(r"[^a-z0-9]+", "-", text)
    return text.strip("-")


def parse_date(value):
    return datetime.strptime(value, "%Y-%m-%d")


def chunk(items, size):
    out = []
    for i in range(0, len(items), size):
        out.append(items[i:i + size])
    return out


def word_count(text):
    return len(text.split())
"""

PYTEST = """============================= test session starts ==============================
collected 6 items

tests/test_utils.py ..F.F.                                                 [100%]

=================================== FAILURES ===================================
________________________________ test_chunk_empty ______________________________
    def test_chunk_empty():
>       assert chunk([], 3) == [[]]
E       assert [] == [[]]
________________________________ test_word_count_none __________________________
    def test_word_count_none():
>       assert word_count(None) == 0
E       AttributeError: 'NoneType' object has no attribute 'split'
=========================== short test summary info ============================
FAILED tests/test_utils.py::test_chunk_empty - assert [] == [[]]
FAILED tests/test_utils.py::test_word_count_none - AttributeError
========================= 2 failed, 4 passed in 0.04s ==========================
"""

LS = """total 64
drwxr-xr-x  5 dev dev  4096 Mar  3 09:12 .
drwxr-xr-x 18 dev dev  4096 Mar  1 17:40 ..
-rw-r--r--  1 dev dev   812 Mar  3 09:10 README.md
-rw-r--r--  1 dev dev  2304 Mar  3 09:11 app.py
-rw-r--r--  1 dev dev   131 Feb 27 11:02 requirements.txt
drwxr-xr-x  2 dev dev  4096 Mar  2 15:20 static
-rw-r--r--  1 dev dev  5120 Mar  3 08:55 data.db
drwxr-xr-x  2 dev dev  4096 Mar  2 15:21 templates
-rw-r--r--  1 dev dev   377 Mar  1 18:05 Dockerfile
-rw-r--r--  1 dev dev    64 Feb 27 11:02 .env
"""

WEATHER = """{"city": "Lisbon", "units": "celsius", "days": [
  {"date": "2026-03-04", "high": 18, "low": 11, "rain_mm": 0.0, "wind_kmh": 14},
  {"date": "2026-03-05", "high": 17, "low": 12, "rain_mm": 3.2, "wind_kmh": 22},
  {"date": "2026-03-06", "high": 15, "low": 10, "rain_mm": 11.8, "wind_kmh": 31},
  {"date": "2026-03-07", "high": 16, "low": 9, "rain_mm": 1.1, "wind_kmh": 18},
  {"date": "2026-03-08", "high": 19, "low": 11, "rain_mm": 0.0, "wind_kmh": 9}
]}
"""

CSV = """id,name,team,commits,reviews
1,Ana,core,42,17
2,Ben,web,13,25
3,Chen,core,57,8
4,Dara,infra,21,30
5,Eli,web,34,12
6,Fay,infra,9,41
7,Gus,core,28,19
"""

LOG = """2026-03-03 10:01:12 INFO  api     started on :8080
2026-03-03 10:01:13 INFO  db      pool ready (10 connections)
2026-03-03 10:02:40 WARN  api     slow request GET /search 1840ms
2026-03-03 10:02:41 ERROR db      query timeout after 5000ms (SELECT * FROM items)
2026-03-03 10:02:41 ERROR api     500 GET /search request_id=7f3a
2026-03-03 10:03:05 INFO  cache   hit ratio 0.82
2026-03-03 10:04:17 ERROR db      connection reset by peer
2026-03-03 10:04:18 WARN  db      reconnecting (attempt 1)
2026-03-03 10:04:19 INFO  db      reconnected
2026-03-03 10:05:00 INFO  api     health ok
"""

DOC = """Release notes, version 2.4 (March 2026)

The importer now reads CSV files with a header row and skips blank lines. Files larger
than 2 GB are streamed instead of loaded into memory. The --dry-run flag prints the rows
that would be imported without writing them.

The exporter gained a JSON Lines format. Dates are written in ISO 8601 in every format.
The old --legacy-dates flag is removed.

Known issue: on Windows, paths longer than 260 characters fail unless long paths are
enabled in the system settings. A fix is planned for version 2.5.
"""

HTML = """<!doctype html>
<html>
<head>
  <title>Team page</title>
  <link rel="stylesheet" href="/static/site.css">
</head>
<body>
  <header>
    <h1>Our team</h1>
    <nav><a href="/">Home</a> | <a href="/about">About</a></nav>
  </header>
  <ul class="members">
    <li>Ana - core</li>
    <li>Ben - web</li>
    <li>Chen - core</li>
  </ul>
  <footer>Contact: team@example.com</footer>
</body>
</html>
"""

SCHEMA = """CREATE TABLE orders (
  id INTEGER PRIMARY KEY,
  customer_id INTEGER NOT NULL,
  total_cents INTEGER NOT NULL,
  status TEXT NOT NULL,
  created_at TEXT NOT NULL
);
CREATE TABLE customers (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  country TEXT NOT NULL
);
"""

ROWS = """customer | country | orders | total
---------+---------+--------+--------
Ana      | PT      |      4 |  182.50
Ben      | DE      |      2 |   40.00
Chen     | CN      |      7 |  391.20
Dara     | PT      |      1 |   12.99
"""

TOOLS = """Available tools (reply with one JSON object: {"tool": NAME, "arguments": {...}}):
- read_file(path)
- write_file(path, content)
- run(command)
- search(query)
"""


def block(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text}```"


EDITED = CONFIG.replace("8080", "9090").replace("level: info", "level: debug")

CONVERSATIONS = [
    (
        "agent-edit",
        [
            f"Here is config.yaml:\n{block(CONFIG, 'yaml')}\nChange the server port to 9090. "
            "Reply with the complete updated file and nothing else.",
            f"Here is config.yaml as it is now:\n{block(CONFIG.replace('8080', '9090'), 'yaml')}\n"
            "Also set the logging level to debug. Reply with the complete file.",
            "Tool output (yamllint config.yaml):\n```\nconfig.yaml\n  6:3  warning  too many "
            "spaces after colon\n```\nHere is the file again:\n"
            f"{block(EDITED, 'yaml')}"
            "\nIs the warning real? Then reply with the file unchanged if nothing needs fixing.",
            f"Here is config.yaml:\n{block(CONFIG, 'yaml')}\nAdd `max_body_mb: 16` under server, "
            "after workers. Reply with the complete file.",
            f"Here is config.yaml:\n{block(CONFIG, 'yaml')}\nReply with only the database section.",
        ],
    ),
    (
        "agent-code",
        [
            f"Here is utils.py:\n{block(UTILS, 'python')}\nAdd a docstring to slugify. Reply "
            "with the whole file.",
            f"Test run output:\n{block(PYTEST)}\nHere is utils.py again:\n{block(UTILS, 'python')}"
            "\nFix word_count so that None counts as 0. Reply with the whole file.",
            f"Test run output:\n{block(PYTEST)}\nHere is utils.py:\n{block(UTILS, 'python')}\n"
            "Explain in two sentences why test_chunk_empty fails.",
            f"Here is utils.py:\n{block(UTILS, 'python')}\nRename chunk to batched everywhere. "
            "Reply with the whole file.",
        ],
    ),
    (
        "agent-shell",
        [
            f"{TOOLS}\nTask: find the large files in the project.\nTool output (run ls -la):\n"
            f"{block(LS)}\nWhich files are larger than 1000 bytes? Reply as a JSON list of names.",
            f"{TOOLS}\nTool output (run ls -la):\n{block(LS)}\nCall the tool that reads "
            "README.md. Reply with the JSON tool call only.",
            f"{TOOLS}\nTool output (run ls -la):\n{block(LS)}\nWrite a one-line shell command "
            "that deletes data.db, then explain why it may be a bad idea.",
            f"{TOOLS}\nTool output (run ls -la):\n{block(LS)}\nList every directory, one per line.",
            f"{TOOLS}\nTool output (run ls -la):\n{block(LS)}\nReply with the same listing, sorted "
            "by size, largest first.",
        ],
    ),
    (
        "agent-json",
        [
            f"Tool output (weather_forecast):\n{block(WEATHER, 'json')}\nSummarize the week in "
            "three sentences.",
            f"Tool output (weather_forecast):\n{block(WEATHER, 'json')}\nReply with the same JSON, "
            'adding "umbrella": true to every day with more than 1 mm of rain.',
            f"Tool output (weather_forecast):\n{block(WEATHER, 'json')}\nMake a Markdown table "
            "with date, high and low.",
            f"Tool output (weather_forecast):\n{block(WEATHER, 'json')}\nWhich day is the windiest?"
            " Quote its line from the JSON.",
        ],
    ),
    (
        "agent-csv",
        [
            f"Here is team.csv:\n{block(CSV, 'csv')}\nAdd a column total = commits + reviews. "
            "Reply with the full CSV.",
            f"Here is team.csv:\n{block(CSV, 'csv')}\nReply with only the rows of the core team, "
            "header included.",
            f"Here is team.csv:\n{block(CSV, 'csv')}\nSort the rows by commits, highest first. "
            "Reply with the full CSV.",
            f"Here is team.csv:\n{block(CSV, 'csv')}\nWho has the most reviews? Answer in one "
            "sentence.",
            f"Here is team.csv:\n{block(CSV, 'csv')}\nConvert it to JSON Lines, one object per "
            "row.",
        ],
    ),
    (
        "agent-logs",
        [
            f"Server log:\n{block(LOG)}\nList every ERROR line exactly as it appears.",
            f"Server log:\n{block(LOG)}\nWhat happened between 10:04:17 and 10:04:19?",
            f"Server log:\n{block(LOG)}\nReply with the log lines of the db component only.",
            f"Server log:\n{block(LOG)}\nWrite a short incident report: cause, impact, fix.",
        ],
    ),
    (
        "agent-rag",
        [
            f"Document:\n{block(DOC)}\nUsing only the document, how are files over 2 GB handled? "
            "Quote the sentence.",
            f"Document:\n{block(DOC)}\nUsing only the document, what does --dry-run do? Quote it.",
            f"Document:\n{block(DOC)}\nUsing only the document, list every change to the exporter.",
            f"Document:\n{block(DOC)}\nRewrite the known issue paragraph for end users.",
            f"Document:\n{block(DOC)}\nReply with the document unchanged, but with version 2.4 "
            "written as 2.4.0 everywhere.",
        ],
    ),
    (
        "agent-html",
        [
            f"Here is team.html:\n{block(HTML, 'html')}\nAdd a member <li>Dara - infra</li> at "
            "the end of the list. Reply with the whole file.",
            f'Here is team.html:\n{block(HTML, "html")}\nChange the title to "Team directory". '
            "Reply with the whole file.",
            f"Here is team.html:\n{block(HTML, 'html')}\nAdd a link to /blog in the nav. Reply "
            "with the whole file.",
            f"Here is team.html:\n{block(HTML, 'html')}\nWhat does the stylesheet link point to?",
        ],
    ),
    (
        "agent-sql",
        [
            f"Schema:\n{block(SCHEMA, 'sql')}\nWrite a query for the total spent per customer, "
            "highest first.",
            f"Schema:\n{block(SCHEMA, 'sql')}\nQuery result:\n{block(ROWS)}\nWhich country spends "
            "the most in total? Show the numbers you added.",
            f"Schema:\n{block(SCHEMA, 'sql')}\nAdd an `email TEXT` column to customers. Reply with "
            "the full schema.",
            f"Schema:\n{block(SCHEMA, 'sql')}\nQuery result:\n{block(ROWS)}\nReply with the result "
            "table again, only the rows from PT.",
            f"Schema:\n{block(SCHEMA, 'sql')}\nWrite the query that lists orders with status "
            "'open' older than 30 days.",
        ],
    ),
    (
        "agent-plan",
        [
            f"{TOOLS}\nTask: bump the version in README.md from 1.3 to 1.4.\nYour last call: "
            '{"tool": "read_file", "arguments": {"path": "README.md"}}\nTool output:\n'
            "```\n# Shortener 1.3\nA tiny URL shortener.\nRun: python app.py (version 1.3)\n```\n"
            "Reply with the next tool call as JSON.",
            f"{TOOLS}\nTask: bump the version in README.md from 1.3 to 1.4.\nYour last call: "
            '{"tool": "write_file", "arguments": {"path": "README.md", "content": "# Shortener '
            '1.4\\nA tiny URL shortener.\\nRun: python app.py (version 1.4)\\n"}}\nTool output:\n'
            "```\nwrote 71 bytes\n```\nReply with the next tool call as JSON, to check the file.",
            f"{TOOLS}\nTask: bump the version in README.md from 1.3 to 1.4.\nTool output "
            "(read_file README.md):\n```\n# Shortener 1.4\nA tiny URL shortener.\nRun: python "
            "app.py (version 1.4)\n```\nIs the task done? Answer yes or no, then say why.",
            f"{TOOLS}\nTask: run the tests.\nReply with the tool call that runs pytest, as JSON.",
        ],
    ),
]


def main() -> None:
    out = Path(__file__).with_name("agent_suite.jsonl")
    with out.open("w", encoding="utf-8") as f:
        for category, turns in CONVERSATIONS:
            assert 4 <= len(turns) <= 6, category
            f.write(json.dumps({"category": category, "turns": turns}) + "\n")
    print(f"wrote {out} ({len(CONVERSATIONS)} conversations)")


if __name__ == "__main__":
    main()
