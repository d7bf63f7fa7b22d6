#!/bin/sh
# Create or update a connector from its Kafka Connect JSON (idempotent: PUT /connectors/<name>/config),
# then wait until the connector and its task run. Env: CONNECT_URL, CONNECTOR_FILE.
set -eu
: "${CONNECT_URL:?CONNECT_URL is required}"
: "${CONNECTOR_FILE:?CONNECTOR_FILE is required}"

until curl -fsS "$CONNECT_URL/connector-plugins" > /dev/null; do
    echo "waiting for Kafka Connect at $CONNECT_URL"
    sleep 2
done

# {"name": N, "config": {...}} -> N and {...}, without jq (not in the curl image).
name=$(sed -n 's/^[[:space:]]*"name"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$CONNECTOR_FILE" | head -n 1)
config=$(tr -d '\n' < "$CONNECTOR_FILE" | sed 's/^.*"config"[[:space:]]*:[[:space:]]*\({.*}\)[[:space:]]*}[[:space:]]*$/\1/')
[ -n "$name" ] || { echo "no \"name\" in $CONNECTOR_FILE" >&2; exit 1; }

echo "registering connector $name from $CONNECTOR_FILE"
curl -fsS -X PUT -H "Content-Type: application/json" --data "$config" \
    "$CONNECT_URL/connectors/$name/config" > /dev/null

for _ in $(seq 1 60); do
    # 404 until the worker has assigned the connector
    status=$(curl -fs "$CONNECT_URL/connectors/$name/status" || true)
    running=$(printf '%s' "$status" | grep -o '"state":"RUNNING"' | wc -l)
    if printf '%s' "$status" | grep -q '"state":"FAILED"'; then
        echo "connector $name failed: $status" >&2
        exit 1
    fi
    # connector + its task
    if [ "$running" -ge 2 ]; then
        echo "connector $name is running"
        exit 0
    fi
    sleep 2
done
echo "connector $name not running after 120 s: $status" >&2
exit 1
