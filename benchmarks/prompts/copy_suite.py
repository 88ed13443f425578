"""Writes copy_suite.jsonl: twenty single-turn prompts whose answers mostly copy the prompt,
five categories of four: code-edit (a whole function or module asked back with one small
change), rewrite (a paragraph asked back with small edits), table (records asked back as a
Markdown table or CSV), extraction (lines or sections of a long input quoted verbatim) and
format-convert (the same values in another format). Drafters that copy from the prompt
(ngram, suffix) should do best on it; it is the copy-heavy end of what the bench measures.

Written for specgen (not derived from any evaluation set). Run from the repository root:
    python benchmarks/prompts/copy_suite.py
`specgen bench --suite benchmarks/prompts/copy_suite.jsonl` runs it.
"""

from __future__ import annotations

import json
from pathlib import Path


def block(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text}```"


def para(text: str) -> str:
    """One paragraph: the wrapped lines below joined with single spaces."""
    return " ".join(text.split())


CODE_ONLY = "Reply with the complete updated code and nothing else."

# code-edit ------------------------------------------------------------------------------

INVENTORY_PY = """from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    name: str
    qty: int
    price: float


def total_value(items):
    total = 0.0
    for item in items:
        total += item.qty * item.price
    return round(total, 2)


def low_stock(items, threshold=5):
    return [item for item in items if item.qty < threshold]


def restock(items, sku, qty):
    for item in items:
        if item.sku == sku:
            item.qty += qty
            return item
    raise KeyError(sku)


def describe(item):
    return f"{item.sku}: {item.name} x{item.qty} at {item.price:.2f}"
"""

PAGINATE_JS = """function paginate(items, pageSize) {
  if (pageSize <= 0) {
    throw new Error("pageSize must be positive");
  }
  const pages = [];
  let current = [];
  for (let i = 0; i <= items.length; i++) {
    current.push(items[i]);
    if (current.length === pageSize) {
      pages.push(current);
      current = [];
    }
  }
  if (current.length > 0) {
    pages.push(current);
  }
  return pages;
}

function pageCount(items, pageSize) {
  return paginate(items, pageSize).length;
}

function pageAt(items, pageSize, index) {
  const pages = paginate(items, pageSize);
  if (index < 0 || index >= pages.length) {
    return [];
  }
  return pages[index];
}

module.exports = { paginate, pageCount, pageAt };
"""

RETRY_GO = """package fetch

import (
	"fmt"
	"net/http"
	"time"
)

// Get fetches url, trying up to three times with a growing pause between tries.
func Get(client *http.Client, url string) (*http.Response, error) {
	var lastErr error
	pause := 200 * time.Millisecond
	for attempt := 1; attempt <= 3; attempt++ {
		resp, err := client.Get(url)
		if err == nil && resp.StatusCode < 500 {
			return resp, nil
		}
		if err != nil {
			lastErr = err
		} else {
			lastErr = fmt.Errorf("server error: %s", resp.Status)
			resp.Body.Close()
		}
		time.Sleep(pause)
		pause *= 2
	}
	return nil, fmt.Errorf("giving up on %s: %w", url, lastErr)
}
"""

REPORT_PY = """import csv
import sys


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summarize(rows, column):
    values = [float(row[column]) for row in rows if row[column]]
    if not values:
        return {"count": 0, "min": None, "max": None, "mean": None}
    return {
        "count": len(values),
        "min": min(values),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def format_summary(name, summary):
    if summary["count"] == 0:
        return f"{name}: no values"
    return (
        f"{name}: n={summary['count']} min={summary['min']:.2f} "
        f"max={summary['max']:.2f} mean={summary['mean']:.2f}"
    )


def main(argv):
    path, column = argv[1], argv[2]
    rows = read_rows(path)
    print(format_summary(column, summarize(rows, column)))


if __name__ == "__main__":
    main(sys.argv)
"""

CODE_EDIT = [
    f"Here is inventory.py:\n{block(INVENTORY_PY, 'python')}\nRename the field `qty` to "
    f"`quantity` everywhere (the dataclass field and every use of it). {CODE_ONLY}",
    f"Here is paginate.js:\n{block(PAGINATE_JS, 'javascript')}\nThe loop in `paginate` has an "
    f"off-by-one error: it reads one item past the end of the array. Fix it. {CODE_ONLY}",
    f"Here is fetch.go:\n{block(RETRY_GO, 'go')}\nAdd a parameter `attempts int` after `url` "
    f"and use it instead of the fixed 3 tries; update the comment to match. {CODE_ONLY}",
    f'Here is report.py:\n{block(REPORT_PY, "python")}\nAdd a parameter `delimiter=","` to '
    f"`read_rows` and pass it to `csv.DictReader`. {CODE_ONLY}",
]

# rewrite --------------------------------------------------------------------------------

GARDEN = para("""
The community garden on Mill Street opened in the spring of last year, and it has grown
quickly since then. There are now forty raised beds, each one looked after by a family or a
small group of neighbours. Water comes from two rain barrels and a tap that the city installed
in June. Volunteers meet every Saturday morning to weed the shared paths, turn the compost and
fix anything that has broken during the week. Tools are kept in a green shed near the gate, and
the key hangs on a hook inside the bakery across the road. The garden has no fixed rules about
what to grow, but most beds hold tomatoes, beans, lettuce and herbs. In the autumn the
gardeners hold a harvest lunch where everyone brings a dish made from their own vegetables.
Anyone who lives in the neighbourhood can join the waiting list for a bed by leaving their name
at the bakery.
""")

GARDEN_TYPOS = (
    GARDEN.replace("quickly", "quikly")
    .replace("forty", "fourty")
    .replace("installed", "instaled")
    .replace("Saturday", "Saturdy")
    .replace("vegetables", "vegtables")
)

RELEASE = para("""
Last week the platform team shipped version 3.2 of the billing service. The release moved
invoice generation out of the nightly batch job and into a queue, so customers now receive
invoices within a few minutes of a purchase instead of the next morning. The team spent most
of the sprint on the migration script, which copied eleven million old invoices into the new
table without taking the service offline. Two small bugs appeared on the first day: a currency
symbol was missing on Swiss invoices, and a retry loop sent some reminder emails twice. Both
were fixed by Wednesday. The support desk reported fewer questions about missing invoices than
in any week this year. Next, the team will add partial refunds, which finance has asked for
since the spring, and remove the old batch job once the queue has run for a full month without
problems.
""")

LIGHTHOUSE = para("""
Marta Olsen has kept the lighthouse on Gull Point for nineteen years. Every evening Marta climbs
the one hundred and twelve steps to the lamp room, checks the lens for salt and dust, and writes
the weather into a logbook that goes back to 1911. The light itself has been automatic since
the nineties, but the harbour board still pays Marta to watch it, because storms knock out the
power line about twice a winter. When that happens Marta starts the diesel generator in the
basement and stays up until the line is repaired. Visitors sometimes ask whether the job is
lonely. Marta says it is not: the ferry crew wave every morning, the post arrives on Tuesdays and
Fridays, and in summer the school from the mainland sends a class out to see the lens. Marta
plans to retire next year and has already started training a replacement.
""")

STATION = para("""
The weather station on the roof of the science building records temperature, humidity, wind
speed and rainfall every ten minutes. The readings are sent over the campus network to a small
server in the basement, which stores them in a database and draws the charts on the public
web page. Students in the second year use the data for their statistics project, and the
geography department compares it with the readings from the airport twenty kilometres away.
The station was installed in 2015 and has been repaired three times, twice after lightning and
once after a gull built a nest on the rain gauge. A new wind sensor will be fitted in March.
Until then the wind speed readings are marked as estimated on the web page, and students are
asked to leave them out of their projects.
""")

REWRITE = [
    f"Here is a paragraph with five spelling mistakes:\n\n{GARDEN_TYPOS}\n\nReproduce the "
    "paragraph with the spelling mistakes fixed. Change nothing else. Reply with the paragraph "
    "only.",
    f"Here is a paragraph:\n\n{RELEASE}\n\nRewrite the last sentence in the past tense, as if "
    'the work were done ("Next, the team added partial refunds ... and removed the old batch '
    'job ..."). Keep every other sentence exactly as it is. Reply with the whole paragraph '
    "only.",
    f"Here is a paragraph:\n\n{LIGHTHOUSE}\n\nReplace the name Marta with Ingrid everywhere "
    "(keep the surname Olsen). Change nothing else. Reply with the paragraph only.",
    f'Here is a paragraph:\n\n{STATION}\n\nReplace "every ten minutes" with "every five '
    'minutes" and "March" with "April". Change nothing else. Reply with the paragraph only.',
]

# table ----------------------------------------------------------------------------------

BOOKS = para("""
The library added ten books this month. "River of Glass" by Ana Pereira was published in 2019,
has 312 pages and is shelved in Fiction. "The Quiet Engine" by Tom Becker was published in 2021,
has 248 pages and is shelved in Science. "Salt and Stone" by Lena Ivanova was published in 2017,
has 410 pages and is shelved in History. "Small Hours" by Kofi Mensah was published in 2022,
has 196 pages and is shelved in Poetry. "Counting Birds" by Rita Gomes was published in 2020,
has 288 pages and is shelved in Nature. "A Map of Rain" by Jonas Weber was published in 2018,
has 354 pages and is shelved in Fiction. "Iron Bridges" by Paul Laurent was published in 2016,
has 502 pages and is shelved in History. "The Last Orchard" by Mei Tanaka was published in
2023, has 230 pages and is shelved in Fiction. "Light Years" by Sam Okafor was published in
2015, has 376 pages and is shelved in Science. "Field Notes" by Eva Lindqvist was published in
2021, has 164 pages and is shelved in Nature.
""")

SENSORS_JSON = """[
  {"id": "s-01", "room": "lab A", "temp_c": 21.4, "humidity": 38, "battery": 92},
  {"id": "s-02", "room": "lab A", "temp_c": 21.9, "humidity": 40, "battery": 88},
  {"id": "s-03", "room": "lab B", "temp_c": 19.7, "humidity": 45, "battery": 75},
  {"id": "s-04", "room": "lab B", "temp_c": 20.1, "humidity": 44, "battery": 61},
  {"id": "s-05", "room": "office", "temp_c": 22.8, "humidity": 35, "battery": 97},
  {"id": "s-06", "room": "office", "temp_c": 23.0, "humidity": 34, "battery": 54},
  {"id": "s-07", "room": "store", "temp_c": 16.2, "humidity": 52, "battery": 83},
  {"id": "s-08", "room": "store", "temp_c": 15.9, "humidity": 55, "battery": 79},
  {"id": "s-09", "room": "hall", "temp_c": 18.5, "humidity": 41, "battery": 66}
]
"""

ORDERS_JSON = """[
  {"order": 1041, "customer": "Hill & Co", "items": 3, "total": 58.40, "status": "shipped"},
  {"order": 1042, "customer": "Nordlicht", "items": 1, "total": 12.00, "status": "open"},
  {"order": 1043, "customer": "Casa Azul", "items": 7, "total": 203.15, "status": "shipped"},
  {"order": 1044, "customer": "Pine Labs", "items": 2, "total": 44.90, "status": "cancelled"},
  {"order": 1045, "customer": "Hill & Co", "items": 5, "total": 99.75, "status": "open"},
  {"order": 1046, "customer": "Oakridge", "items": 4, "total": 71.20, "status": "shipped"},
  {"order": 1047, "customer": "Sato Trading", "items": 6, "total": 150.00, "status": "open"},
  {"order": 1048, "customer": "Nordlicht", "items": 2, "total": 25.50, "status": "shipped"},
  {"order": 1049, "customer": "Bluefin", "items": 9, "total": 310.60, "status": "shipped"},
  {"order": 1050, "customer": "Casa Azul", "items": 1, "total": 8.99, "status": "open"},
  {"order": 1051, "customer": "Oakridge", "items": 3, "total": 47.30, "status": "cancelled"}
]
"""

STAFF = """- Alice Moreau, engineering, joined 2018, office Lyon, extension 2104
- Bruno Costa, sales, joined 2020, office Porto, extension 3310
- Chen Wei, engineering, joined 2016, office Lyon, extension 2117
- Dana Kowalski, support, joined 2021, office Krakow, extension 4402
- Erik Jansen, finance, joined 2015, office Utrecht, extension 1208
- Fatima Haddad, support, joined 2019, office Krakow, extension 4415
- Greta Schulz, sales, joined 2022, office Porto, extension 3321
- Hugo Martin, engineering, joined 2017, office Lyon, extension 2129
"""

TABLE = [
    f"{BOOKS}\n\nPut these books in a Markdown table with the columns Title, Author, Year, "
    "Pages and Section, one row per book in the order given, with the values exactly as written. "
    "Reply with the table only.",
    f"Sensor readings:\n{block(SENSORS_JSON, 'json')}\nConvert them to CSV with the header "
    "id,room,temp_c,humidity,battery and one line per sensor, same order, same values. Reply "
    "with the CSV only.",
    f"Orders:\n{block(ORDERS_JSON, 'json')}\nShow these orders as a Markdown table with the "
    "columns Order, Customer, Items, Total and Status, same order, same values. Reply with the "
    "table only.",
    f"Staff list:\n{block(STAFF)}\nTurn this list into CSV with the header "
    "name,department,joined,office,extension, one line per person, same order. Reply with the "
    "CSV only.",
]

# extraction -----------------------------------------------------------------------------

APP_LOG = """2024-05-14 08:00:01 INFO  boot: service starting, version 2.7.1
2024-05-14 08:00:02 INFO  config: loaded /etc/app/config.yaml
2024-05-14 08:00:02 INFO  db: connecting to db-primary:5432
2024-05-14 08:00:03 INFO  db: connected, pool size 10
2024-05-14 08:00:03 INFO  http: listening on :8080
2024-05-14 08:01:15 INFO  http: GET /health 200 2ms
2024-05-14 08:02:40 WARN  cache: redis latency 180ms above threshold 100ms
2024-05-14 08:03:02 INFO  http: POST /orders 201 45ms
2024-05-14 08:03:09 INFO  http: GET /orders/1041 200 12ms
2024-05-14 08:04:11 ERROR db: query timeout after 5000ms (orders_by_customer)
2024-05-14 08:04:11 INFO  http: GET /customers/88/orders 504 5003ms
2024-05-14 08:04:30 INFO  http: GET /health 200 1ms
2024-05-14 08:05:02 WARN  db: pool exhausted, 10 of 10 connections in use
2024-05-14 08:05:03 ERROR db: could not acquire connection within 2000ms
2024-05-14 08:05:03 INFO  http: POST /orders 503 2004ms
2024-05-14 08:05:20 INFO  scheduler: job cleanup_sessions started
2024-05-14 08:05:21 INFO  scheduler: job cleanup_sessions removed 312 rows
2024-05-14 08:06:00 INFO  http: GET /health 200 2ms
2024-05-14 08:06:45 WARN  auth: 5 failed logins for user ops-admin from 10.2.0.17
2024-05-14 08:07:12 INFO  http: GET /products 200 30ms
2024-05-14 08:07:58 INFO  http: PUT /products/17 200 41ms
2024-05-14 08:08:33 ERROR payments: provider returned 502 for charge ch_7781
2024-05-14 08:08:34 INFO  payments: retrying charge ch_7781 (attempt 2)
2024-05-14 08:08:36 INFO  payments: charge ch_7781 succeeded
2024-05-14 08:09:00 INFO  http: GET /health 200 1ms
2024-05-14 08:09:41 WARN  disk: /var/lib/app at 91% capacity
2024-05-14 08:10:05 INFO  http: GET /orders 200 58ms
2024-05-14 08:10:17 INFO  db: slow query 1200ms (report_daily_sales)
2024-05-14 08:11:02 INFO  http: DELETE /sessions/abc123 204 6ms
2024-05-14 08:11:30 ERROR mail: SMTP connection refused by mail.internal:25
2024-05-14 08:11:31 WARN  mail: 14 messages queued for retry
2024-05-14 08:12:00 INFO  http: GET /health 200 2ms
2024-05-14 08:12:44 INFO  http: POST /login 200 88ms
2024-05-14 08:13:10 INFO  scheduler: job send_digest started
2024-05-14 08:13:12 INFO  scheduler: job send_digest finished, 0 sent
2024-05-14 08:14:00 INFO  boot: config reload requested
"""

LEASE = """EQUIPMENT LEASE AGREEMENT

1. Parties. This agreement is made between Harbor Tools Ltd ("Lessor") and Brightside Builders
("Lessee").

2. Equipment. The Lessor leases to the Lessee one mini excavator, model HX-35, serial number
HX35-20931, together with two buckets and one hydraulic breaker.

3. Term. The lease begins on 1 July 2024 and ends on 31 December 2024, unless ended earlier
under section 9.

4. Rent. The Lessee shall pay 1,850 per month, due on the first day of each month. Payments
more than ten days late carry a fee of 5 percent of the amount due.

5. Deposit. The Lessee shall pay a deposit of 3,000 before delivery. The deposit is returned
within 30 days after the equipment is returned in good condition.

6. Use. The equipment may only be used on the Lessee's building sites in the county of Westmere
and only by operators holding a valid licence.

7. Maintenance. The Lessee shall carry out daily checks as set out in the operator manual. The
Lessor is responsible for scheduled servicing every 250 operating hours.

8. Insurance. The Lessee shall insure the equipment against loss, theft and damage for its full
replacement value and name the Lessor as loss payee.

9. Termination. Either party may end this agreement with 30 days written notice. The Lessor may
end it at once if rent is more than 30 days overdue or if the equipment is used outside the
permitted area.

10. Return. At the end of the term the Lessee shall return the equipment to the Lessor's yard,
clean and with a full fuel tank. Missing fuel is charged at cost plus 10 percent.

11. Liability. The Lessee is liable for any damage to the equipment beyond normal wear, and for
any injury or damage caused by its operation during the term.

12. Governing law. This agreement is governed by the laws of the county of Westmere.
"""

README = """# tidyfiles

tidyfiles sorts a messy folder into subfolders by file type and date.

## Installation

Requires Python 3.9 or newer.

    pip install tidyfiles

To install from a clone instead:

    git clone https://example.org/tidyfiles.git
    cd tidyfiles
    pip install -e .

## Usage

    tidyfiles ~/Downloads

By default files are moved into folders named after their type (images, documents, archives,
audio, video, other). Add `--by-date` to sort into year/month folders instead, and `--dry-run`
to print what would happen without moving anything.

## Configuration

tidyfiles reads `~/.config/tidyfiles.toml` if it exists. You can map extensions to folders:

    [folders]
    images = ["jpg", "png", "gif", "webp"]
    ebooks = ["epub", "mobi"]

## Known issues

- Files open in another program are skipped on Windows.
- Symbolic links are left where they are.

## License

MIT. See LICENSE.
"""

ACCESS_LOG = """10.0.0.4 - - [14/May/2024:09:00:01] "GET / HTTP/1.1" 200 5120
10.0.0.9 - - [14/May/2024:09:00:03] "GET /static/app.js HTTP/1.1" 200 48211
10.0.0.4 - - [14/May/2024:09:00:07] "GET /api/items HTTP/1.1" 200 1893
10.0.0.12 - - [14/May/2024:09:00:10] "POST /api/login HTTP/1.1" 401 87
10.0.0.12 - - [14/May/2024:09:00:14] "POST /api/login HTTP/1.1" 200 412
10.0.0.7 - - [14/May/2024:09:00:21] "GET /api/items/44 HTTP/1.1" 404 64
10.0.0.9 - - [14/May/2024:09:00:25] "GET /api/cart HTTP/1.1" 200 733
10.0.0.4 - - [14/May/2024:09:00:31] "POST /api/cart HTTP/1.1" 500 152
10.0.0.15 - - [14/May/2024:09:00:36] "GET / HTTP/1.1" 200 5120
10.0.0.15 - - [14/May/2024:09:00:37] "GET /static/app.css HTTP/1.1" 200 9932
10.0.0.7 - - [14/May/2024:09:00:42] "GET /api/items HTTP/1.1" 200 1893
10.0.0.9 - - [14/May/2024:09:00:48] "POST /api/checkout HTTP/1.1" 502 210
10.0.0.12 - - [14/May/2024:09:00:55] "GET /api/profile HTTP/1.1" 200 640
10.0.0.4 - - [14/May/2024:09:01:02] "POST /api/cart HTTP/1.1" 200 781
10.0.0.21 - - [14/May/2024:09:01:09] "GET /admin HTTP/1.1" 403 92
10.0.0.21 - - [14/May/2024:09:01:11] "GET /admin/login HTTP/1.1" 200 2210
10.0.0.15 - - [14/May/2024:09:01:18] "GET /api/items?page=2 HTTP/1.1" 200 1764
10.0.0.9 - - [14/May/2024:09:01:24] "POST /api/checkout HTTP/1.1" 200 355
10.0.0.7 - - [14/May/2024:09:01:30] "GET /api/items/45 HTTP/1.1" 200 402
10.0.0.12 - - [14/May/2024:09:01:37] "PUT /api/profile HTTP/1.1" 500 148
10.0.0.4 - - [14/May/2024:09:01:44] "GET /api/orders HTTP/1.1" 200 1120
10.0.0.15 - - [14/May/2024:09:01:50] "GET /favicon.ico HTTP/1.1" 404 0
10.0.0.21 - - [14/May/2024:09:01:57] "POST /admin/login HTTP/1.1" 401 87
10.0.0.9 - - [14/May/2024:09:02:03] "GET /api/orders/311 HTTP/1.1" 200 512
10.0.0.7 - - [14/May/2024:09:02:10] "GET /api/search?q=lamp HTTP/1.1" 503 120
10.0.0.4 - - [14/May/2024:09:02:16] "GET /api/items HTTP/1.1" 200 1893
10.0.0.12 - - [14/May/2024:09:02:22] "POST /api/logout HTTP/1.1" 204 0
10.0.0.15 - - [14/May/2024:09:02:29] "GET /api/items/12 HTTP/1.1" 200 398
10.0.0.21 - - [14/May/2024:09:02:35] "POST /admin/login HTTP/1.1" 200 415
10.0.0.9 - - [14/May/2024:09:02:41] "GET /api/search?q=desk HTTP/1.1" 200 2045
10.0.0.7 - - [14/May/2024:09:02:48] "GET /api/cart HTTP/1.1" 500 152
10.0.0.4 - - [14/May/2024:09:02:54] "GET / HTTP/1.1" 200 5120
"""

EXTRACTION = [
    f"Application log:\n{block(APP_LOG)}\nQuote every line whose level is ERROR or WARN, "
    "exactly as it appears, in the same order. Reply with those lines only.",
    f"{block(LEASE)}\nQuote, word for word, every numbered section of this agreement that "
    "mentions money (rent, deposit, fees or charges). Reply with those sections only.",
    f"Here is a README:\n{block(README, 'markdown')}\nQuote the Installation and Usage "
    "sections verbatim, headings included. Reply with those two sections only.",
    f"Web server access log:\n{block(ACCESS_LOG)}\nQuote every line whose status code is 500 "
    "or higher, exactly as it appears. Reply with those lines only.",
]

# format-convert -------------------------------------------------------------------------

SERVICE_JSON = """{
  "name": "image-resizer",
  "version": "1.4.2",
  "replicas": 3,
  "image": "registry.example.org/image-resizer:1.4.2",
  "port": 8081,
  "env": {
    "MAX_WIDTH": "2048",
    "MAX_HEIGHT": "2048",
    "QUALITY": "85",
    "CACHE_DIR": "/var/cache/resizer"
  },
  "resources": {
    "cpu": "500m",
    "memory": "512Mi"
  },
  "healthcheck": {
    "path": "/healthz",
    "interval_seconds": 15,
    "timeout_seconds": 3
  },
  "volumes": [
    {"name": "cache", "mount": "/var/cache/resizer", "size": "10Gi"},
    {"name": "config", "mount": "/etc/resizer", "read_only": true}
  ],
  "labels": ["media", "backend", "stateless"]
}
"""

SETTINGS_PY = """SETTINGS = {
    "site_name": "Harbor Notes",
    "base_url": "https://notes.example.org",
    "language": "en",
    "posts_per_page": 12,
    "show_drafts": False,
    "comments": None,
    "authors": ["Ana", "Tom", "Mei"],
    "social": {
        "mastodon": "@harbor@example.social",
        "rss": True,
    },
    "theme": {
        "name": "plain",
        "accent_color": "#2a6f97",
        "font_size": 17,
        "dark_mode": True,
    },
    "menu": [
        {"title": "Home", "url": "/"},
        {"title": "Archive", "url": "/archive/"},
        {"title": "About", "url": "/about/"},
    ],
}
"""

CHECKLIST = """Before the release:
- Freeze the main branch and announce it in the team channel
- Run the full test suite on the release candidate
- Update the version number in pyproject.toml and the changelog
- Build the wheel and the source archive
- Install the wheel in a fresh virtual environment and run the smoke tests
- Tag the release commit as v2.8.0 and push the tag
- Upload the wheel and the source archive to the package index
- Publish the release notes on the project website
- Unfreeze the main branch
- Open the milestone for the next release
"""

ENV_FILE = """APP_NAME=ledger
APP_ENV=production
APP_PORT=7000
LOG_LEVEL=warning
DB_HOST=db.internal
DB_PORT=5432
DB_NAME=ledger_prod
DB_USER=ledger
CACHE_URL=redis://cache.internal:6379/2
SESSION_TTL=3600
FEATURE_EXPORT=true
FEATURE_BETA_UI=false
"""

FORMAT_CONVERT = [
    f"Convert this JSON to YAML, keeping every key, value and the order:\n"
    f"{block(SERVICE_JSON, 'json')}\nReply with the YAML only.",
    f"Convert this Python dict to JSON (True/False/None become true/false/null), keeping every "
    f"key, value and the order:\n{block(SETTINGS_PY, 'python')}\nReply with the JSON only.",
    f"{block(CHECKLIST)}\nRewrite this checklist as a numbered list: replace each dash with "
    "its number (1., 2., 3., ...) and keep the heading and every item's wording exactly. Reply "
    "with the list only.",
    f"Convert this .env file to a single JSON object with the same keys in the same order "
    f"(every value a string, as written):\n{block(ENV_FILE)}\nReply with the JSON only.",
]

PROMPTS = [
    ("code-edit", CODE_EDIT),
    ("rewrite", REWRITE),
    ("table", TABLE),
    ("extraction", EXTRACTION),
    ("format-convert", FORMAT_CONVERT),
]


def main() -> None:
    out = Path(__file__).with_name("copy_suite.jsonl")
    count = 0
    with out.open("w", encoding="utf-8") as f:
        for category, prompts in PROMPTS:
            assert len(prompts) == 4, category
            for prompt in prompts:
                assert prompt.isascii(), category
                f.write(json.dumps({"category": category, "turns": [prompt]}) + "\n")
                count += 1
    print(f"wrote {out} ({count} prompts)")


if __name__ == "__main__":
    main()
