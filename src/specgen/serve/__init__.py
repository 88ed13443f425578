"""`specgen serve`: an OpenAI-compatible HTTP API over the public API (`Pipeline`).

server.py    binds the port, runs uvicorn, stops cleanly on a signal
app.py       routes: chat, completions, models, health, metrics (no torch here)
jobs.py      a request's way to the worker and back: read, tokenize, check, queue, collect
responses.py the Responses API, answered as chat
grammar.py   response_format and the generic tool format as constrained decoding
generic_tools.py  tools for templates without them (llama.cpp's generic format)
worker.py    the one thread that loads the model and answers jobs in order
openai_api.py  request fields in, response bodies out
stops.py     exact stop strings over streamed text
report.py    an answer's speculative statistics (the "specgen" extension object)
metrics.py   Prometheus text for /metrics
errors.py    OpenAI-shaped errors
"""
