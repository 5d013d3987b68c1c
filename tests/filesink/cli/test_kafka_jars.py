"""Maven artifacts fetched with Ivy (:mod:`filesink.mavenjars`, which ``filesink run --format kafka`` fetches Spark's
Kafka source with): a real Ivy (pyspark's jar) in a real JVM, against a Maven repository served over HTTP on
loopback from a temporary directory, so that what is published, what is missing and what is out of reach are the
test's to choose. The failures are quoted as what they are, and a broken local Maven repository is not read.
"""

from __future__ import annotations

import functools
import http.server
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3servers import free_port

from filesink import mavenjars
from filesink.cli import kafka_source
from filesink.errors import JarFetchError, KafkaSourceError

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>{group}</groupId><artifactId>{name}</artifactId><version>{version}</version>
<dependencies>{dependencies}</dependencies></project>
"""


def _publish(repo: Path, coordinate: str, *depends_on: str, jar: bool = True) -> None:
    group, name, version = coordinate.split(":")
    where = repo / group.replace(".", "/") / name / version
    where.mkdir(parents=True, exist_ok=True)
    dependencies = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{n}</artifactId><version>{v}</version></dependency>"
        for g, n, v in (d.split(":") for d in depends_on)
    )
    (where / f"{name}-{version}.pom").write_text(
        POM.format(group=group, name=name, version=version, dependencies=dependencies)
    )
    if jar:
        (where / f"{name}-{version}.jar").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A Maven repository directory served over HTTP: ``(directory, url)``."""
    directory = tmp_path / "repo"
    directory.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield directory, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _only(tmp_path: Path, url: str) -> mavenjars.Repositories:
    """Ivy settings naming ``url`` alone (``spark.jars.ivySettings``): nothing is asked of Maven Central."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    settings = tmp_path / "ivysettings.xml"
    settings.write_text(
        f"""<ivysettings><settings defaultResolver="only"/>
<caches defaultCacheDir="{tmp_path / "ivy-cache"}" useOrigin="false"/>
<resolvers><ibiblio name="only" m2compatible="true" root="{url}"/></resolvers></ivysettings>"""
    )
    return mavenjars.Repositories(ivy_settings=settings)


def test_fetched_with_dependencies_once_and_without_what_is_excluded(tmp_path: Path, repo: tuple[Path, str]) -> None:
    directory, url = repo
    _publish(directory, "t.g:a:1", "t.g:b:2", "t.g:c:3")
    _publish(directory, "t.g:b:2")
    _publish(directory, "t.g:c:3")
    said: list[str] = []
    jars = mavenjars.fetch(["t.g:a:1"], repositories=_only(tmp_path, url), what="A", say=said.append, root=tmp_path)
    assert sorted(j.name for j in jars) == ["a-1.jar", "b-2.jar", "c-3.jar"]
    assert all(j.is_file() for j in jars)
    assert len(said) == 1 and said[0].startswith("fetching A (t.g:a:1)")
    # the second fetch reads the cache: it says nothing, and needs no repository
    for sub in directory.iterdir():
        sub.rename(tmp_path / f"gone-{sub.name}")
    started = time.monotonic()
    again = mavenjars.fetch(["t.g:a:1"], repositories=_only(tmp_path, url), what="A", say=said.append, root=tmp_path)
    assert again == jars and len(said) == 1
    assert time.monotonic() - started < 1.0  # no JVM started
    # excluded artifact names are left out, with what they bring
    for sub in tmp_path.glob("gone-*"):
        sub.rename(directory / sub.name.removeprefix("gone-"))
    fewer = mavenjars.fetch(["t.g:a:1"], exclude=("b", "a"), repositories=_only(tmp_path, url), what="A", root=tmp_path)
    assert sorted(j.name for j in fewer) == ["a-1.jar", "c-3.jar"]  # the artifact asked for is never excluded


def test_a_dependency_whose_jar_is_missing_is_quoted(tmp_path: Path, repo: tuple[Path, str]) -> None:
    """What the user met: the artifact is there, one dependency's pom is there without its jar."""
    directory, url = repo
    _publish(directory, "t.g:a:1", "t.g:b:2")
    _publish(directory, "t.g:b:2", jar=False)
    with pytest.raises(JarFetchError) as caught:
        mavenjars.fetch(["t.g:a:1"], repositories=_only(tmp_path, url), what="A", root=tmp_path)
    text = str(caught.value)
    assert caught.value.unpublished == ()
    assert "t.g:a:1 was found, but not all of its dependencies could be had" in text, text
    assert "download failed: t.g#b;2!b.jar" in text, text
    assert not list((tmp_path / "jars").glob("a-1-*/ready.json"))  # nothing half-fetched is taken as ready


def test_an_unpublished_artifact_and_an_unreachable_repository(tmp_path: Path, repo: tuple[Path, str]) -> None:
    _, url = repo
    with pytest.raises(JarFetchError) as caught:
        mavenjars.fetch(["t.g:zzz:9"], repositories=_only(tmp_path, url), what="Z", root=tmp_path)
    assert caught.value.unpublished == ("t.g:zzz:9",)
    assert "has no t.g:zzz:9: Z is not published for that version" in str(caught.value), caught.value
    closed = f"http://127.0.0.1:{free_port()}/"
    with pytest.raises(JarFetchError) as caught:
        mavenjars.fetch(["t.g:a:1"], repositories=_only(tmp_path / "x", closed), what="A", root=tmp_path / "x")
    text = str(caught.value)
    assert caught.value.unpublished == ()
    assert "a repository could not be reached" in text and "spark.jars.repositories" in text, text


def test_a_broken_local_maven_repository_is_not_read(
    tmp_path: Path, repo: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pom without its jar in ``~/.m2`` (what stopped Spark's own resolver for the user) does not matter: the
    fetch reads the repositories it is given (here one named with ``spark.jars.repositories``) and Maven Central
    only. The JVM's home is pointed at a directory holding such a pom."""
    directory, url = repo
    _publish(directory, "t.g:a:1", "t.g:b:2")
    _publish(directory, "t.g:b:2")
    home = tmp_path / "home"
    _publish(home / ".m2" / "repository", "t.g:b:2", jar=False)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", f"-Duser.home={home}")
    repositories = mavenjars.Repositories.of_spark_conf({"spark.jars.repositories": url})
    assert repositories.extra == (url,)
    jars = mavenjars.fetch(["t.g:a:1"], repositories=repositories, what="A", root=tmp_path / "cache")
    assert sorted(j.name for j in jars) == ["a-1.jar", "b-2.jar"]
    assert (jars[1].read_bytes()) == (directory / "t" / "g" / "b" / "2" / "b-2.jar").read_bytes()


def test_a_spark_without_a_published_kafka_source_is_told_which_has_one(tmp_path: Path, repo: tuple[Path, str]) -> None:
    """The run's error for a Spark whose Kafka source is not published names the pyspark that has one and how to
    install it; given jars or packages are taken as they are."""
    _, url = repo
    conf = {"spark.jars.ivySettings": str(_only(tmp_path, url).ivy_settings)}
    with pytest.raises(KafkaSourceError) as caught:
        kafka_source.spark_conf(conf, "9.9.9")
    text = str(caught.value)
    assert "Spark 9.9.9 has no Kafka source" in text, text
    assert f"run with pyspark {kafka_source.KAFKA_SPARK}" in text and "[kafka]" in text, text
    assert "scripts/kafka.sh" in text and "Nothing was written" in text, text
    assert kafka_source.spark_conf({"spark.jars": "x.jar"}, "9.9.9") == {"spark.jars": "x.jar"}


def test_the_kafka_spark_is_the_one_the_extra_and_the_tests_pin() -> None:
    """The Spark the run names for Kafka is the ``kafka`` extra's pyspark and the tests' second environment's."""
    from engines_env import PYSPARK

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["kafka"]
    assert f"pyspark[sql]=={kafka_source.KAFKA_SPARK}" in extra
    assert PYSPARK == kafka_source.KAFKA_SPARK
    assert (ROOT / "scripts" / "kafka.sh").is_file()


def test_shipped_names(tmp_path: Path) -> None:
    for name in ("slf4j-api-2.0.17.jar", "spark-sql_2.13-4.1.1.jar", "zstd-jni-1.5.6-10.jar", "ivy-2.5.3.jar"):
        (tmp_path / name).write_bytes(b"")
    assert mavenjars.shipped_names(tmp_path) == ("ivy", "slf4j-api", "spark-sql_2.13", "zstd-jni")
