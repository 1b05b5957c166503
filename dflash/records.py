"""Reports as records: dataclasses written to JSON and read back (the eval, serving,
engine-speed and run summaries)."""
from __future__ import annotations

import dataclasses


def to_json(x):
    """A record as JSON data: its fields in order, recursively, leaving out the fields
    it names in `OMIT_NONE` while they are None (sections a report did not measure)."""
    if dataclasses.is_dataclass(x):
        omit = getattr(x, "OMIT_NONE", ())
        return {f.name: to_json(getattr(x, f.name)) for f in dataclasses.fields(x)
                if not (f.name in omit and getattr(x, f.name) is None)}
    if isinstance(x, dict):
        return {k: to_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [to_json(v) for v in x]
    return x


def declared(cls, d: dict) -> dict:
    """The keys of `d` that the record `cls` declares (a report written by another
    dflash may hold others; they are not read)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}
