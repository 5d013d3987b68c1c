"""Probe an S3 location before anything starts: the endpoint answers, accepts the credentials, has the bucket.

Used by ``filesink run`` for the output and the log store, so that a wrong endpoint or key fails in seconds with
a message naming the location, the endpoint and what to check, never showing the secret key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from logstore.storage import LIMITS_HINT, is_unreachable, open_filesystem

from ..errors import StorageAccessError


def check_s3(url: str, storage_options: Mapping[str, Any], what: str) -> None:
    """Raise :class:`StorageAccessError` unless the bucket of ``url`` can be listed with ``storage_options``.

    ``what`` names the location in the message (``output``, ``log store``). The secret key never appears in
    a message; the access key id is shown shortened."""
    import botocore.exceptions

    options = dict(storage_options)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})  # fail fast: this is only a probe
    options["config_kwargs"] = config
    options["skip_instance_cache"] = True
    fs, root = open_filesystem(url, options)
    bucket = root.split("/", 1)[0]
    endpoint = (options.get("client_kwargs") or {}).get("endpoint_url") or "AWS S3"
    key = options.get("key") or os.environ.get("AWS_ACCESS_KEY_ID") or ""
    who = f"access key id {key[:4]}…" if key else "the default AWS credentials"
    secret = options.get("secret") or os.environ.get("AWS_SECRET_ACCESS_KEY") or ""
    try:
        fs.ls(bucket, refresh=True)
    except FileNotFoundError:
        raise StorageAccessError(
            f"the {what} {url}: bucket {bucket!r} does not exist at {endpoint}; create it first"
        ) from None
    except PermissionError as e:
        raise StorageAccessError(
            f"the {what} {url}: {endpoint} refused access with {who} ({_short(e, secret)}). Check "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS profile) and the bucket's policy."
        ) from None
    except botocore.exceptions.NoCredentialsError:
        raise StorageAccessError(
            f"the {what} {url}: no S3 credentials were found. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE."
        ) from None
    except Exception as e:
        if is_unreachable(e):
            raise StorageAccessError(
                f"the {what} {url}: cannot reach the S3 endpoint {endpoint} ({_short(e, secret)}). Check "
                "--s3-endpoint (or AWS_ENDPOINT_URL) and that the server is running and answering. "
                f"{LIMITS_HINT}: --storage-option config_kwargs.read_timeout=SECONDS and so on. Nothing was written."
            ) from None
        if not isinstance(e, OSError | botocore.exceptions.BotoCoreError):
            raise
        raise StorageAccessError(
            f"the {what} {url}: cannot reach the S3 endpoint {endpoint} ({_short(e, secret)}). Check --s3-endpoint "
            "(or AWS_ENDPOINT_URL) and that the server is running."
        ) from None


def _short(error: BaseException, secret: str) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text.replace(secret, "***") if secret else text
