"""`specgen serve`: an OpenAI-compatible HTTP API over the public API (`Pipeline`).

server.py    binds the port, runs uvicorn, stops cleanly on a signal
app.py       routes: parse, queue a job, stream its events back (no torch here)
worker.py    the one thread that loads the model and answers jobs in order
openai_api.py  request fields in, response bodies out
stops.py     exact stop strings over streamed text
report.py    an answer's speculative statistics (the "specgen" extension object)
metrics.py   Prometheus text for /metrics
errors.py    OpenAI-shaped errors
"""
