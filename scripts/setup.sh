# Sourced by demo.sh and test.sh: checks the machine and prepares the virtual environment.
# Usage: . scripts/setup.sh EXTRAS   (EXTRAS is "", "[demo]" or "[test]")
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FILESINK_VENV:-$repo/.venv}"

python_bin="${PYTHON:-python3}"
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: Python 3.11 or newer is needed as '$python_bin' (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi

java_bin="java"
[ -n "${JAVA_HOME:-}" ] && java_bin="$JAVA_HOME/bin/java"
if ! java_version="$("$java_bin" -version 2>&1 | head -n 1)"; then
    echo "error: Java 17 or newer is needed by Spark, and '$java_bin' was not found." >&2
    echo "       Install a JDK 17 (e.g. 'apt-get install openjdk-17-jdk-headless') or set JAVA_HOME." >&2
    exit 1
fi
java_major="$(echo "$java_version" | sed -E 's/.*version "([0-9]+).*/\1/')"
if ! [ "$java_major" -ge 17 ] 2>/dev/null; then
    echo "error: Spark needs Java 17 or newer; '$java_bin' is: $java_version" >&2
    exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "==> creating virtual environment $venv"
    "$python_bin" -m venv "$venv"
fi
if [ "${1:-}" = "[test]" ] && ! command -v fusermount3 >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1; then
    # Debian's fuse3 mounts the case-insensitive file system of one partition test; without it, that test skips.
    echo "==> installing fuse3 for the case-insensitive file system test"
    { timeout 300 apt-get install -y -qq fuse3 || { timeout 300 apt-get update -qq && timeout 300 apt-get install -y -qq fuse3; }; } \
        >/dev/null 2>&1 || echo "    could not install fuse3: the case-insensitive file system test will be skipped"
fi

if [ "${1:-}" = "[test]" ] && ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # Debian's PostgreSQL serves the Iceberg catalog tests (started by the tests on loopback); without it, they skip.
    echo "==> installing PostgreSQL for the Iceberg catalog tests"
    { timeout 300 apt-get install -y -qq postgresql || { timeout 300 apt-get update -qq && timeout 300 apt-get install -y -qq postgresql; }; } \
        >/dev/null 2>&1 || echo "    could not install PostgreSQL: the Iceberg tests on a PostgreSQL catalog will be skipped"
fi

echo "==> installing the project${1:-} into $venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --editable "$repo${1:-}"
export PATH="$venv/bin:$PATH"
cd "$repo"
if [ "${1:-}" != "[kafka]" ]; then
    spark_version="$("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
    if [ "$spark_version" != "4.1.1" ]; then
        echo "    (pyspark $spark_version here has no Kafka source on Maven Central: for 'filesink run --format kafka'," \
            "bash scripts/kafka.sh sets up .venv-kafka with pyspark 4.1.1, docs/kafka.md)"
    fi
fi
