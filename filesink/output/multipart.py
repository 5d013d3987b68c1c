"""One S3 object written as a multipart upload that only ``CompleteMultipartUpload`` makes visible.

The writer owns the protocol (rather than s3fs's buffered file) so that it can act between the steps: the
upload id is handed to ``on_create`` (which records it and checks the writer's term, see
:mod:`filesink.output.fencing`) before the first part is sent, and failpoints sit at every step. Requests go through
the s3fs filesystem's client, with its error translation (``FileNotFoundError`` for an upload that no longer
exists) and botocore's retry configuration.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

from logstore import requestcounts
from logstore.failpoints import failpoint
from logstore.storage import is_storage_error, s3_error_code, storage_error

log = logging.getLogger(__name__)

MIN_PART_SIZE = 5 * 2**20
"""S3's smallest part (all parts but the last)."""
DEFAULT_PART_SIZE = 16 * 2**20
MAX_PARTS = 10_000


KINDS = {
    "create_multipart_upload": "put",
    "upload_part": "put",
    "complete_multipart_upload": "put",
    "abort_multipart_upload": "delete",
    "head_object": "head",
    "list_parts": "list",
    "list_multipart_uploads": "list",
}
"""The kind (:mod:`logstore.requestcounts`) of each S3 request of an upload."""


def _s3(fs: Any, method: str, **kwargs: Any) -> Any:
    """One request through the s3fs filesystem's client, counted as the output's; an error other than
    ``FileNotFoundError`` (an answer the callers act on) counted as failed."""
    kind = KINDS.get(method, "put")
    requestcounts.count(requestcounts.OUTPUT, kind)
    try:
        answer = fs.call_s3(method, **kwargs)
    except FileNotFoundError:
        raise
    except Exception:
        requestcounts.count(requestcounts.OUTPUT, kind, "errors")
        raise
    requestcounts.count(requestcounts.OUTPUT, kind, "retries", requestcounts.retries_in(answer))
    return answer


class MultipartObject:
    """A write-only binary file: bytes are buffered into parts of ``part_size`` and uploaded as they fill.

    ``close()`` uploads the last part (the object is complete, not visible); ``complete()`` makes it visible;
    ``abort()`` ends the upload so that it can never become visible.
    """

    def __init__(
        self,
        fs: Any,
        path: str,
        *,
        part_size: int = DEFAULT_PART_SIZE,
        on_create: Callable[[str], None] | None = None,
        on_gone: Callable[[], Exception] | None = None,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum part size of {MIN_PART_SIZE} bytes")
        self.fs = fs
        self.path = path
        self.bucket, self.key, _ = fs.split_path(path)
        self.part_size = part_size
        self.on_create = on_create
        self.on_gone = on_gone
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self.size = 0
        self.closed = False
        self._buffer = bytearray()

    # -- file interface (what pyarrow's ParquetWriter uses) ---------------------------------------------

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        return None

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to {self.path}: the upload is closed")
        view = memoryview(data).cast("B")
        self._buffer += view
        self.size += len(view)
        while len(self._buffer) >= self.part_size:
            chunk = bytes(self._buffer[: self.part_size])
            del self._buffer[: self.part_size]
            self._upload_part(chunk)
        return len(view)

    def close(self) -> None:
        """Upload what is buffered as the last part. The object is complete but not visible."""
        if self.closed:
            return
        if not self.parts or self._buffer:
            self._upload_part(bytes(self._buffer))
        self._buffer = bytearray()
        self.closed = True

    # -- the upload --------------------------------------------------------------------------------------

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return _s3(self.fs, method, Bucket=self.bucket, Key=self.key, **kwargs)
        except FileNotFoundError as e:
            if self.on_gone is None or method == "create_multipart_upload":
                raise
            raise self.on_gone() from e  # the upload was aborted under us
        except OSError as e:
            if self.on_gone is None or method == "create_multipart_upload" or not self.upload_gone():
                raise
            raise self.on_gone() from e

    def upload_gone(self) -> bool:
        """Whether the upload no longer exists (``ListParts`` answers ``NoSuchUpload``). Asked after another error:
        some servers (moto's) answer a part or a Complete of an aborted upload with ``500 InternalError`` rather
        than ``NoSuchUpload``."""
        if self.upload_id is None:
            return False
        try:
            _s3(self.fs, "list_parts", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MaxParts=1)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False

    def _create(self) -> str:
        failpoint("filesink.upload.create.before", self.key)
        try:
            upload_id: str = self._call("create_multipart_upload")["UploadId"]
        except OSError as e:
            code, status = s3_error_code(e)
            if _unsupported(code, status):
                raise OSError(
                    f"cannot start the upload of s3://{self.bucket}/{self.key}: this S3 server does not support "
                    f"multipart uploads (CreateMultipartUpload answered {code or status}), which the sink writes "
                    "every S3 file with, so that no reader sees a partial file. Use an S3 server that supports them "
                    "(see the server matrix in docs/testing.md)."
                ) from e
            raise
        self.upload_id = upload_id
        failpoint("filesink.upload.create.after", self.key)
        if self.on_create is not None:
            self.on_create(upload_id)
        return upload_id

    def _upload_part(self, body: bytes) -> None:
        upload_id = self.upload_id or self._create()
        number = len(self.parts) + 1
        if number > MAX_PARTS:
            raise ValueError(f"{self.path}: more than {MAX_PARTS} parts; use a larger part size")
        failpoint("filesink.upload.part.before", self.key)
        response = self._call("upload_part", UploadId=upload_id, PartNumber=number, Body=body)
        self.parts.append({"PartNumber": number, "ETag": response["ETag"]})

    def complete(self) -> bool:
        """Make the object visible. True if this call completed the upload; False if the upload was gone but
        the object is there at this upload's size: completed already, by an earlier attempt of this request
        whose answer was lost (botocore retried it; some servers answer a repeated Complete ``NoSuchUpload``)
        or by a writer of the same file, whose bytes are the same. Otherwise, if the upload is gone (aborted):
        ``on_gone()``, or ``FileNotFoundError``."""
        assert self.closed and self.upload_id is not None, "complete() after close()"
        failpoint("filesink.upload.complete.before", self.key)
        try:
            _s3(
                self.fs,
                "complete_multipart_upload",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": self.parts},
            )
        except OSError as e:
            if not isinstance(e, FileNotFoundError) and not self.upload_gone():
                raise
            visible = self.visible_size()
            if visible != self.size:
                if self.on_gone is None:
                    raise
                raise self.on_gone() from e
            log.info("%s: upload %s was completed already (size %d as uploaded)", self.path, self.upload_id, visible)
            failpoint("filesink.upload.complete.after", self.key)
            return False
        failpoint("filesink.upload.complete.after", self.key)
        return True

    def visible_size(self) -> int | None:
        """The size of the object visible under the key (HEAD), or None if there is none."""
        try:
            head = _s3(self.fs, "head_object", Bucket=self.bucket, Key=self.key)
        except FileNotFoundError:
            return None
        return int(head["ContentLength"])

    def abort(self) -> None:
        """End the upload (never raises); a completed object stays."""
        self._buffer = bytearray()
        self.closed = True
        if self.upload_id is None:
            return
        try:
            abort_upload(self.fs, self.bucket, self.key, self.upload_id)
        except Exception as e:
            log.warning(
                "could not abort the upload of %s (recovery aborts it at the next start; a bucket lifecycle rule "
                "AbortIncompleteMultipartUpload removes such uploads too): %s",
                self.path,
                e,
            )


def _unsupported(code: str | None, status: int | None) -> bool:
    """Whether an S3 error says the server does not implement the request (not that this request failed)."""
    return code in ("NotImplemented", "MethodNotAllowed") or status in (405, 501)


def abort_upload(fs: Any, bucket: str, key: str, upload_id: str) -> bool:
    """Abort an upload; False if it no longer exists (already aborted or completed)."""
    try:
        _s3(fs, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise storage_error(f"cannot abort the multipart upload {upload_id} of s3://{bucket}/{key}", e) from e
    return True


def list_uploads(
    fs: Any, bucket: str, prefix: str, *, initiated_before: datetime.datetime | None = None
) -> list[tuple[str, str]]:
    """Every multipart upload in progress under ``prefix``, as (key, upload id); with ``initiated_before`` (aware),
    only those the server says were initiated before it."""
    found: list[tuple[str, str]] = []
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    where = f"s3://{bucket}/{prefix}"
    while True:
        try:
            page = _s3(fs, "list_multipart_uploads", **kwargs)
        except Exception as e:
            if not is_storage_error(e):
                raise
            code, status = s3_error_code(e)
            if code == "NoSuchUpload":
                # rclone's server answers NoSuchUpload when no upload is in progress (AWS answers an empty list).
                log.debug("%s: the server answered NoSuchUpload to ListMultipartUploads: none in progress", where)
                return found
            if code == "NoSuchBucket":
                raise OSError(
                    f"cannot list the multipart uploads under {where}: bucket {bucket!r} does not exist. Create it, "
                    "or check the output URL and the S3 endpoint."
                ) from e
            if _unsupported(code, status):
                raise OSError(
                    f"cannot list the multipart uploads under {where}: this S3 server does not support listing "
                    f"multipart uploads (ListMultipartUploads answered {code or status}), which the sink needs to "
                    "find and abort uploads that a killed writer left. Use an S3 server that supports it (see "
                    "the server matrix in docs/testing.md)."
                ) from e
            raise storage_error(f"cannot list the multipart uploads under {where}", e, writing=False) from e
        found += [
            (u["Key"], u["UploadId"])
            for u in page.get("Uploads") or []
            if initiated_before is None or (u.get("Initiated") is not None and u["Initiated"] < initiated_before)
        ]
        if not page.get("IsTruncated"):
            return found
        kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
        kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")
