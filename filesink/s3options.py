"""The S3 options every ``filesink`` command takes (``run`` and ``recover status|plan|apply`` alike), turned into
the storage options of the sink's S3 clients (s3fs's, see :func:`logstore.storage.s3_client_options`).

- ``--s3-endpoint URL`` and ``--region NAME``: ``client_kwargs`` ``endpoint_url`` and ``region_name``;
- ``--storage-options JSON``: an object of storage options;
- ``--storage-option KEY=VALUE`` (repeatable): one option; a dotted key sets a nested one
  (``config_kwargs.read_timeout=30``), a value that reads as JSON is taken as such (``30``, ``true``,
  ``{"mode": "standard"}``), anything else as a string.

Later ones win: the endpoint and region, then the JSON object, then each ``--storage-option`` in order. Credentials
come from the standard AWS variables (or the AWS profile), never from flags: ``key``, ``secret`` and ``token`` are
refused there. ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` set in the command's
environment are passed on explicitly, so that executors on other machines use the same ones.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
