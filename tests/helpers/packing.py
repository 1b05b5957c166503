"""The packing rule of DESIGN.md, one sample at a time: the reference for the planner."""
import numpy as np


def reference_pack(lengths, budget, cap):
    offsets, count, cur = [0], 0, 0
    for i, n in enumerate(lengths):
        if count < cap and (count + 1) * max(cur, n) <= budget:
            count, cur = count + 1, max(cur, n)
        else:
            offsets.append(i)
            count, cur = 1, n
    offsets.append(len(lengths))
    return np.asarray(offsets, dtype=np.int64)
