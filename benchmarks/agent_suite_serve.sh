#!/usr/bin/env bash
# The agent-like suite through `specgen serve`: one server holding AR and the methods, the
# bench racing them on every turn of the ten conversations (each turn asked with the
# conversation so far), greedy, every answer compared with the server's AR, text for text.
#
#   bash benchmarks/agent_suite_serve.sh [METHODS] [MAX_NEW_TOKENS] > benchmarks/results/X.txt
#
# The server's methods share one loaded target and one worker; each method's suffix store
# (earlier answers) is its own, so no method drafts from another's answers.
set -euo pipefail
METHODS=${1:-ar,suffix,stacked}
TOKENS=${2:-256}
PORT=${PORT:-8766}
specgen serve --methods "$METHODS" --port "$PORT" --quiet &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 1
done
ENDPOINTS=()
for m in ${METHODS//,/ }; do
  ENDPOINTS+=(--endpoint "http://127.0.0.1:$PORT/v1" --endpoint-method "$m" --endpoint-name "$m@serve")
done
specgen bench --methods none --suite benchmarks/prompts/agent_suite.jsonl --turns all \
  --max-new-tokens "$TOKENS" "${ENDPOINTS[@]}" --json
