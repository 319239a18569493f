"""The public ``sortpack.dataset`` import: ``SourceDataset`` from sortpack.reader.dataset."""
from .reader.dataset import SourceDataset

__all__ = ["SourceDataset"]
