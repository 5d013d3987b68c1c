#!/usr/bin/env bash
# Sets up an environment for `filesink run --format kafka`: .venv-kafka, with pyspark 4.1.1 (the newest Spark whose
# Kafka source is on Maven Central; the environment of the README's commands has a newer Spark, which has none yet)
# and this project with its `kafka` extra (Delta, Iceberg, metrics). Then it fetches Spark's Kafka source and Kafka's
# broker into the user's cache (~/.cache/filesink; once per machine), so that the first run starts at once, and says
# how to try it with a local broker. See docs/kafka.md.
# Usage: bash scripts/kafka.sh   (FILESINK_KAFKA_VENV=/dir puts the environment elsewhere than .venv-kafka)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FILESINK_VENV="${FILESINK_KAFKA_VENV:-$repo/.venv-kafka}"
. "$repo/scripts/setup.sh" "[kafka]"

echo "==> fetching Spark's Kafka source and Kafka's broker (once)"
"$FILESINK_VENV/bin/python" - <<'PY'
import pyspark

from filesink.cli.kafka_source import KAFKA_SPARK, spark_conf
from filesink.demo.kafka_broker import kafka_jars

assert pyspark.__version__ == KAFKA_SPARK, f"pyspark {pyspark.__version__} in this environment, not {KAFKA_SPARK}"
jars = spark_conf({}, pyspark.__version__, say=print)["spark.jars"].split(",")
print(f"    Spark {pyspark.__version__}'s Kafka source: {len(jars)} jars")
print(f"    Kafka's broker: {len(kafka_jars(say=print))} jars")
PY

rel="${FILESINK_VENV#"$PWD"/}"
cat <<TXT
==> ready: $rel (pyspark $("$FILESINK_VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')). Try it:
    $rel/bin/filesink kafka-broker     # a broker on 127.0.0.1:9092 writing generated events into 'events'
  and, in another terminal (Ctrl-C stops it; run it again to go on):
    $rel/bin/filesink run --format kafka --kafka-bootstrap 127.0.0.1:9092 --topics events --kafka-value json \\
      --schema 'user_id bigint, event string, amount double, seq bigint' --key user_id \\
      --output ./kafka-out --state-dir ./kafka-state --trigger 5s
TXT
