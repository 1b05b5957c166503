"""Data: the on-disk token format, JSONL preparation and synthetic data."""
from dflash.data.build import Data, load_data
from dflash.data.format import DatasetWriter, TokenDataset

__all__ = ["Data", "DatasetWriter", "TokenDataset", "load_data"]
