"""The S3 options every ``filesink`` command takes (``run`` and ``recover status|plan|apply`` alike), turned into
the storage options of the sink's S3 clients (s3fs's, see :func:`logstore.storage.s3_client_options`).

- ``--s3-endpoint URL`` and ``--region NAME``: ``client_kwargs`` ``endpoint_url`` and ``region_name``;
- ``--storage-options JSON``: an object of storage options;
- ``--storage-option KEY=VALUE`` (repeatable): one option; a dotted key sets a nested one
  (``config_kwargs.read_timeout=30``), a value that reads as JSON is taken as such (``30``, ``true``,
  ``{"mode": "standard"}``), anything else as a string.

An endpoint is an ``http://`` or ``https://`` URL: one without a scheme (``127.0.0.1:9000``), or that the S3 client
would refuse, is refused with a message saying what to give (:func:`endpoint_problem`): at parse time for
``--s3-endpoint``, when the options are built for a storage option's, and for ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` by the probe of an S3 location, before anything is opened (:class:`S3EndpointError`, exit 2).

Later ones win: the endpoint and region, then the JSON object, then each ``--storage-option`` in order. Credentials
come from the standard AWS variables (or the AWS profile), never from flags: ``key``, ``secret`` and ``token`` are
refused there. ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` set in the command's
environment are passed on explicitly, so that executors on other machines use the same ones.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import S3EndpointError

SECRET_OPTIONS = frozenset({"key", "secret", "token", "username", "password"})
"""Storage options that hold credentials: never taken from the command line."""


def parse_option(text: str) -> tuple[list[str], Any]:
    """``KEY=VALUE`` as (the key's dotted path, the value); argparse's type for ``--storage-option``."""
    key, sep, raw = text.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not all(path):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE, e.g. config_kwargs.read_timeout=30 or config_kwargs.retries.max_attempts=5"
        )
    _refuse_secret(path[0])
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return path, value


def parse_options(text: str) -> dict[str, Any]:
    """A JSON object of storage options; argparse's type for ``--storage-options``."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON ({e}); give an object, e.g. '{{\"use_ssl\": false}}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object of storage options")
    for key in value:
        _refuse_secret(key)
    return value


def _refuse_secret(key: str) -> None:
    if key in SECRET_OPTIONS:
        raise argparse.ArgumentTypeError(
            f"storage option {key!r} holds a credential, which is never taken from the command line: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or AWS_PROFILE"
        )


ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""The variables the S3 client takes its endpoint from when none is given: the first one set wins."""


def endpoint_problem(url: str) -> str | None:
    """What is wrong with ``url`` as an S3 endpoint, said after the URL (``has no scheme: use http://...``), or
    None: an endpoint is ``http://`` or ``https://`` and a host the S3 client (botocore) takes."""
    text = url.strip()
    if "://" not in text:
        return f"has no scheme: use http://{text} or https://{text}"
    scheme, rest = text.split("://", 1)
    if scheme.lower() in ("s3", "s3a"):
        return (
            f"is a location, not an endpoint: the endpoint is the S3 server's URL, e.g. http://127.0.0.1:8333 or "
            f"https://s3.example.com, and {scheme}://bucket/prefix goes in --output or --log-store"
        )
    if scheme.lower() not in ("http", "https"):
        return f"has the scheme {scheme}://, and an S3 endpoint is http:// or https://: use http://{rest} or https://{rest}"
    parts = urllib.parse.urlsplit(text)
    if not parts.hostname:
        return f"has no host: give {scheme}://HOST:PORT, e.g. {scheme}://127.0.0.1:9000"
    try:
        _ = parts.port  # a ValueError for a port that is not a number
    except ValueError:
        return f"has a port that is not a number from 0 to 65535: give {scheme}://{parts.hostname}:PORT"
    if not _host_name(parts.hostname):
        return (
            f"has the host name {parts.hostname!r}, which the S3 client refuses (a host name holds letters, digits, "
            "'-' and '.' only): give its IP address, or a name without other characters"
        )
    return None


_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)", re.IGNORECASE)


def _host_name(host: str) -> bool:
    """Whether ``host`` is an IP address or a DNS name (labels of letters, digits and inner dashes), as the S3 client
    requires of an endpoint's host."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return len(host) <= 255 and all(_LABEL.fullmatch(label) for label in host.removesuffix(".").split("."))


class _Endpoint(argparse.Action):
    """``--s3-endpoint URL``: refused at parse time, naming the option as given, unless a usable endpoint."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        problem = endpoint_problem(str(values))
        if problem:
            parser.error(f"{option_string or '--s3-endpoint'} {values} {problem}")
        setattr(namespace, self.dest, values)


def check_endpoint(
    options: Mapping[str, Any], environ: Mapping[str, str] | None = None, given: str = "--s3-endpoint"
) -> None:
    """Raise :class:`S3EndpointError` unless the endpoint of the storage ``options`` (``given`` names where it came
    from) is usable (:func:`endpoint_problem`); with none there, and an ``environ``, the one the S3 client would take
    from its variables (:data:`ENDPOINT_VARIABLES`)."""
    endpoint = settings_of(options).get("endpoint_url")
    named = f"{given} {endpoint}"
    if not endpoint:
        variable = configured_endpoint_variable(environ or {})
        if variable is None:
            return
        endpoint = (environ or {})[variable]
        named = f"{variable}={endpoint}"
    problem = endpoint_problem(endpoint)
    if problem:
        fix = " (set it so, or unset it and give --s3-endpoint)" if named.startswith("AWS_") else ""
        raise S3EndpointError(f"{named} {problem}{fix}. Nothing was written.")


def configured_endpoint_variable(environ: Mapping[str, str]) -> str | None:
    """The variable the S3 client takes its endpoint from when none is given (:data:`ENDPOINT_VARIABLES`), or None."""
    if str(environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "")).lower() == "true":
        return None
    return next((v for v in ENDPOINT_VARIABLES if environ.get(v)), None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the S3 options to a command's parser."""
    group = parser.add_argument_group(
        "S3", "for s3:// outputs and log stores; credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "or the AWS profile, never from flags"
    )  # fmt: skip
    group.add_argument(
        "--s3-endpoint",
        "--endpoint-url",
        dest="s3_endpoint",
        action=_Endpoint,
        metavar="URL",
        help="S3 endpoint URL (MinIO, SeaweedFS, rclone serve s3, ...); default: AWS S3 or AWS_ENDPOINT_URL",
    )
    group.add_argument("--region", metavar="NAME", help="S3 region name")
    group.add_argument(
        "--storage-options",
        dest="storage_options_json",
        type=parse_options,
        metavar="JSON",
        help='s3fs storage options as a JSON object, e.g. \'{"config_kwargs": {"read_timeout": 30}}\'',
    )
    group.add_argument(
        "--storage-option",
        dest="storage_option",
        action="append",
        default=[],
        type=parse_option,
        metavar="KEY=VALUE",
        help="one s3fs storage option, a dotted KEY for nested ones, a JSON VALUE where it parses, e.g. "
        "config_kwargs.read_timeout=30 (repeatable; see docs/cli.md)",
    )


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The storage options the S3 flags of ``args`` give (see the module docstring)."""
    return build(
        endpoint=getattr(args, "s3_endpoint", None),
        region=getattr(args, "region", None),
        json_options=getattr(args, "storage_options_json", None),
        options=getattr(args, "storage_option", None) or [],
        environ=environ,
    )


def build(
    *,
    endpoint: str | None = None,
    region: str | None = None,
    json_options: Mapping[str, Any] | None = None,
    options: list[tuple[list[str], Any]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    result: dict[str, Any] = {}
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        result.update(key=key, secret=secret)
        if env.get("AWS_SESSION_TOKEN"):
            result["token"] = env["AWS_SESSION_TOKEN"]
    client: dict[str, Any] = {}
    if endpoint:
        client["endpoint_url"] = endpoint
    if region:
        client["region_name"] = region
    if client:
        result["client_kwargs"] = client
    if json_options:
        _merge(result, json_options)
    for path, value in options or []:
        _merge(result, _nested(path, value))
    if endpoint and settings_of(result).get("endpoint_url") == endpoint:
        given = "--s3-endpoint"
    else:
        given = "the storage option " + ("endpoint_url" if result.get("endpoint_url") else "client_kwargs.endpoint_url")
    check_endpoint(result, given=given)  # the variables' endpoint is checked where S3 is used (filesink.output.probe)
    return result


def _nested(path: list[str], value: Any) -> dict[str, Any]:
    for key in reversed(path):
        value = {key: value}
    return dict(value)


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Merge ``new`` into ``into``: objects key by key, anything else replaced."""
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


# -- the S3 settings a state directory remembers -------------------------------------------------------------

SETTINGS_FILE = "s3-settings.json"
"""In a state directory: the S3 endpoint and region the sink last ran with (never a credential), so that
``filesink recover --state-dir DIR`` reaches the same server without ``--s3-endpoint`` and ``--region``."""
REMEMBERED = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region_name": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
"""The ``client_kwargs`` a state directory remembers, and the variables that, when set, win over them."""


def settings_of(options: Mapping[str, Any]) -> dict[str, str]:
    """The endpoint and region in storage ``options`` (``client_kwargs``, or s3fs's top-level ``endpoint_url``)."""
    client = options.get("client_kwargs") or {}
    found = {name: client.get(name) or (options.get(name) if name == "endpoint_url" else None) for name in REMEMBERED}
    return {name: str(value) for name, value in found.items() if value}


def remember(state_dir: Path, options: Mapping[str, Any]) -> None:
    """Record in ``state_dir`` the endpoint and region of ``options`` (or that there are none)."""
    from logstore.storage import write_durable

    path = state_dir / SETTINGS_FILE
    settings = settings_of(options)
    if not settings:
        path.unlink(missing_ok=True)
        return
    if remembered_settings(state_dir) != settings:
        write_durable(path, [json.dumps(settings, indent=2, sort_keys=True).encode() + b"\n"])


def remembered_settings(state_dir: Path) -> dict[str, str]:
    """The settings :func:`remember` recorded in ``state_dir`` ({} if none or unreadable)."""
    try:
        found = json.loads((state_dir / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {name: str(found[name]) for name in REMEMBERED if isinstance(found.get(name), str) and found[name]}


def with_remembered(
    options: dict[str, Any], state_dir: Path | None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``options`` with the endpoint and region ``state_dir`` remembers filled in where neither the options nor
    the AWS variables give one."""
    if state_dir is None:
        return options
    env = os.environ if environ is None else environ
    given = settings_of(options)
    fill = {
        name: value
        for name, value in remembered_settings(state_dir).items()
        if name not in given and not any(env.get(variable) for variable in REMEMBERED[name])
    }
    if not fill:
        return options
    result = dict(options)
    result["client_kwargs"] = {**(options.get("client_kwargs") or {}), **fill}
    return result
