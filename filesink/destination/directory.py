"""The directory destination: plain Parquet files under the output, each visible once its writer publishes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .base import Destination, TableFormat

if TYPE_CHECKING:
    import pyarrow as pa

    from ..committer.ledger import PlannedFile
    from ..tasks.writer import WrittenObject


class DirectoryDestination(Destination):
    format = TableFormat.DIRECTORY
    transaction = (
        "in each file-writing task: an object is visible once published (a local temp file renamed into place, an "
        "S3 multipart upload completed)"
    )

    def held(self, files: Sequence[PlannedFile]) -> set[str] | None:
        return None  # recovery lists each file's objects (filesink.output.visibility)

    def make_visible(
        self, files: Sequence[PlannedFile], written: Mapping[str, Sequence[WrittenObject]], schema: pa.Schema
    ) -> None:
        """Nothing to do: the writers published every object."""
