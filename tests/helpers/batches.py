"""A planned batch collated straight onto a device (the pipeline does this with
reusable buffers; tests and benchmarks want the plain version)."""
from __future__ import annotations

import numpy as np
import torch

from dflash.step import DeviceBatch


def collate(dataset, batch, device, shape=None) -> DeviceBatch:
    """Right-padded tensors for a planned batch, at its run shape when given: the length
    padded up, and whole padding rows (nothing valid, nothing supervised) added."""
    seq = batch.seq_len if shape is None else shape.seq_len
    rows = batch.num_rows if shape is None else shape.batch_size
    arrays = dataset.collate_batch(batch, rows, seq)
    if rows > len(arrays[0]):  # (packed batches come at their full row count)
        pad = ((0, rows - len(arrays[0])), (0, 0))
        arrays = [np.pad(a, pad) for a in arrays]
    ids, mask, valid, *pos = [torch.from_numpy(a).to(device, non_blocking=True) for a in arrays]
    return DeviceBatch(batch, ids, mask, valid, shape, pos[0] if pos else None)
