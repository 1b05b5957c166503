"""Data: the on-disk token format, JSONL preparation and synthetic data."""
from .build import Data, load_data
from .format import DatasetWriter, TokenDataset

__all__ = ["Data", "DatasetWriter", "TokenDataset", "load_data"]
