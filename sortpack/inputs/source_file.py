"""The record of one opened input file: its format, byte size and units of rows."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SourceFile:
    """One input file: its format, byte size and units (row groups / batches / whole file)."""

    path: str
    format: str
    bytes: int
    # rows per unit, or None where the format does not say without parsing (jsonl, csv)
    unit_rows: list[int] | None = field(default=None)
    # bytes per unit (all columns) where the metadata says: uncompressed page bytes for
    # Parquet (dictionary-encoded values decode to more), batch bytes for Arrow files
    unit_bytes: list[int] | None = field(default=None)
    # rows estimated from the file's head where the format does not say (jsonl, csv): exact
    # for a file shorter than the head; weighs ranks' shares and sizes progress totals in rows
    est_rows: int | None = field(default=None)

    @property
    def num_units(self) -> int:
        """Return the number of units this file splits into."""
        return len(self.unit_rows) if self.unit_rows is not None else 1

    def fingerprint(self, rows: int) -> dict:
        """Return the manifest's record of this file."""
        return {"path": self.path, "format": self.format, "rows": int(rows), "bytes": self.bytes}
