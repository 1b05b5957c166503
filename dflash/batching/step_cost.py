"""A measured cost model of one training step, and the cost file that carries it.

Padding efficiency is a proxy: the drafter's work grows with rows x anchor slots and the
target's attention with the square of the length, not with padded tokens. So dflash
times the real step at a set of shapes (`python -m dflash.profile`) and fits

    seconds(rows R, padded length L, anchor slots A) =
        c_step + c_row R + c_tok R L + c_attn R L^2 + c_anchor R A + c_ctx R A L

(c_step: launch and optimizer overhead per step; c_row: per-row fixed work; c_tok: the
linear layers over every padded token; c_attn: the target's attention; c_anchor: the
drafter's blocks, MLP and loss per anchor slot; c_ctx: block-to-context attention)
by non-negative least squares on relative error, so a fast small shape counts as much
as a slow large one. Every coefficient is a cost, so none may be negative: the fit then
extrapolates monotonically, and a shape outside the profiled range is flagged.

A cost file is only valid for the hardware, dtype and model sizes it was measured on;
`load_cost_file(path, expect)` refuses one whose recorded fields differ, naming them.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dflash.atomic import write_text_atomic
from dflash.errors import DataError

log = logging.getLogger("dflash.step_cost")

TERMS = ("step", "row", "token", "attention", "anchor", "context")


def features(rows, seq_len, anchors) -> np.ndarray:
    """[n, 6] float64 design matrix for the cost terms above."""
    r = np.asarray(rows, dtype=np.float64).ravel()
    L = np.asarray(seq_len, dtype=np.float64).ravel()
    a = np.broadcast_to(np.asarray(anchors, dtype=np.float64), r.shape).ravel()
    return np.stack([np.ones_like(r), r, r * L, r * L * L, r * a, r * a * L], axis=1)


@dataclass
class CostModel:
    coef: np.ndarray  # float64 [6], seconds per unit of each term (a repeated shape)
    # the profiled range: max rows, max length, max anchors, max rows x length
    bounds: dict = field(default_factory=dict)
    # extra seconds of a step whose shape differs from the previous step's (same terms;
    # None: not profiled)
    switch: np.ndarray | None = None

    def seconds(self, rows, seq_len, anchors) -> np.ndarray:
        """Seconds of a step at each shape, repeating the previous step's shape."""
        return features(rows, seq_len, anchors) @ self.coef

    def switch_seconds(self, rows, seq_len, anchors) -> np.ndarray:
        """Extra seconds of a step at each shape when the previous step had another."""
        if self.switch is None:
            return np.zeros(np.asarray(rows).size)
        return features(rows, seq_len, anchors) @ self.switch

    def run_seconds(self, rows, seq_len, anchors) -> np.ndarray:
        """Seconds of each step of a run in order: a step whose shape differs from the
        previous one also pays the switch cost (the first step counts as a switch)."""
        r = np.asarray(rows, dtype=np.int64).ravel()
        L = np.asarray(seq_len, dtype=np.int64).ravel()
        a = np.broadcast_to(np.asarray(anchors, dtype=np.int64), r.shape).ravel()
        changed = np.ones(len(r), dtype=bool)
        changed[1:] = (r[1:] != r[:-1]) | (L[1:] != L[:-1]) | (a[1:] != a[:-1])
        return self.seconds(r, L, a) + changed * self.switch_seconds(r, L, a)

    def outside(self, rows, seq_len, anchors) -> np.ndarray:
        """bool per shape: beyond the profiled range in any dimension (extrapolated)."""
        r = np.asarray(rows, dtype=np.int64).ravel()
        L = np.asarray(seq_len, dtype=np.int64).ravel()
        a = np.broadcast_to(np.asarray(anchors, dtype=np.int64), r.shape).ravel()
        b = self.bounds
        if not b:
            return np.zeros(len(r), dtype=bool)
        # the box of the profiled dimensions (rows x length may exceed the largest
        # profiled product a little: warmup rounds lengths up past the token budget)
        return (r > b["rows"]) | (L > b["seq_len"]) | (a > b["anchors"])

    def pricer(self, source: str = "the cost file") -> "StepPricer":
        """Per-step predicted seconds along a run, one step at a time (the trainer's)."""
        return StepPricer(self, source)

    def as_dict(self) -> dict:
        return {"terms": list(TERMS), "coef": [float(c) for c in self.coef],
                "switch": None if self.switch is None else [float(c) for c in self.switch],
                "bounds": {k: int(v) for k, v in self.bounds.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        if list(d.get("terms", [])) != list(TERMS):
            raise DataError(f"cost model terms {d.get('terms')} are not dflash's {list(TERMS)}")
        sw = d.get("switch")
        return cls(np.asarray(d["coef"], dtype=np.float64), dict(d.get("bounds", {})),
                   None if sw is None else np.asarray(sw, dtype=np.float64))


class StepPricer:
    """The predicted seconds of each step as a run takes them: a step whose shape differs
    from the previous step's pays the profiled switch time too. One warning per shape
    outside the profiled range (its time extrapolated)."""

    def __init__(self, model: CostModel, source: str):
        self.model, self.source = model, source
        self.cache: dict = {}  # shape -> (seconds repeating it, seconds switching to it)
        self.last = None

    def __call__(self, shape) -> float:
        if shape not in self.cache:
            dims = (shape.batch_size, shape.seq_len, shape.anchors)
            same = float(self.model.seconds(*dims)[0])
            self.cache[shape] = (same, same + float(self.model.switch_seconds(*dims)[0]))
            if self.model.outside(*dims)[0]:
                log.warning("shape %s is outside the profiled range of %s: its step time "
                            "is extrapolated", shape.as_list(), self.source)
        seconds = self.cache[shape][0 if shape == self.last else 1]
        self.last = shape
        return seconds


def fit_cost_model(rows, seq_len, anchors, seconds) -> CostModel:
    """Non-negative least squares on relative error (each row divided by its time)."""
    from scipy.optimize import nnls
    X = features(rows, seq_len, anchors)
    y = np.asarray(seconds, dtype=np.float64).ravel()
    if len(y) < len(TERMS):
        raise DataError(f"a cost fit needs at least {len(TERMS)} measured shapes, got {len(y)}")
    if (y <= 0).any():
        raise DataError("a measured step time is not positive")
    w = 1.0 / y
    scale = np.maximum(np.abs(X * w[:, None]).max(axis=0), 1e-300)  # conditioning only
    coef, _ = nnls((X * w[:, None]) / scale, np.ones_like(y))
    r = np.asarray(rows, dtype=np.int64).ravel()
    L = np.asarray(seq_len, dtype=np.int64).ravel()
    a = np.broadcast_to(np.asarray(anchors, dtype=np.int64), r.shape).ravel()
    bounds = {"rows": int(r.max()), "seq_len": int(L.max()), "anchors": int(a.max()),
              "tokens": int((r * L).max())}
    return CostModel(coef / scale, bounds)


def relative_errors(model: CostModel, rows, seq_len, anchors, seconds) -> np.ndarray:
    y = np.asarray(seconds, dtype=np.float64).ravel()
    return model.seconds(rows, seq_len, anchors) / y - 1.0


def _fit_switch(points: list[dict]) -> np.ndarray | None:
    """The switch cost: non-negative least squares (absolute) of switch_seconds minus
    seconds over the points that carry both."""
    from scipy.optimize import nnls
    pts = [p for p in points if "switch_seconds" in p]
    if len(pts) < len(TERMS):
        return None
    X = features([p["rows"] for p in pts], [p["seq_len"] for p in pts], [p["anchors"] for p in pts])
    y = np.asarray([p["switch_seconds"] - p["seconds"] for p in pts], dtype=np.float64)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-300)
    coef, _ = nnls(X / scale, y)
    return coef / scale


def repeat_spread(points: list[dict]) -> float | None:
    """How well the machine repeats itself: the median over shapes of a shape's
    (slowest - fastest) repeat over its median. No prediction can be closer than the
    machine repeats, so a profile reports it (None: no point was repeated)."""
    r = [p["spread"] / p["seconds"] for p in points if p.get("spread") is not None and p["seconds"] > 0]
    return float(np.median(r)) if r else None


def fit_with_holdout(points: list[dict], holdout_every: int = 4) -> tuple[CostModel, dict]:
    """Fit on all but every `holdout_every`-th point (by time order of size), report the
    error on those, then refit on all points (the model the file keeps), with the
    switch cost when the points carry it."""
    pts = sorted(points, key=lambda p: p["seconds"])
    cols = lambda ps: [np.asarray([p[k] for p in ps]) for k in ("rows", "seq_len", "anchors", "seconds")]  # noqa: E731
    held = [p for i, p in enumerate(pts) if holdout_every and i % holdout_every == holdout_every // 2]
    train = [p for p in pts if p not in held]
    report = {"num_points": len(pts), "num_heldout": len(held)}
    if held and len(train) >= len(TERMS):
        part = fit_cost_model(*cols(train))
        err = relative_errors(part, *cols(held))
        report.update({"heldout_mean_abs_error": float(np.mean(np.abs(err))),
                       "heldout_max_abs_error": float(np.max(np.abs(err)))})
    full = fit_cost_model(*cols(pts))
    full.switch = _fit_switch(pts)
    err = relative_errors(full, *cols(pts))
    report["fit_mean_abs_error"] = float(np.mean(np.abs(err)))
    if full.switch is not None:
        sw = [p for p in pts if "switch_seconds" in p]
        report["mean_switch_seconds"] = float(np.mean([p["switch_seconds"] - p["seconds"] for p in sw]))
    return full, report


# ---- the cost file ---------------------------------------------------------------------
# what must agree between the run that measured a cost file and the run that uses it
MODEL_FIELDS = ("target_dtype", "target_hidden_size", "target_num_layers", "vocab_size",
                "drafter_num_layers", "block_size", "compile", "step_kind", "target_tp")
MATCH_FIELDS = ("device", "device_count", "autocast") + MODEL_FIELDS
# a field a cost file may lack: it was written before the field existed, so measured
# at this value (no tensor parallelism)
FIELD_DEFAULTS = {"target_tp": 1}


def write_cost_file(path, identity: dict, model: CostModel, points: list, fit: dict) -> Path:
    doc = {"identity": identity, "model": model.as_dict(), "fit": fit, "points": points}
    return write_text_atomic(path, json.dumps(doc, indent=2))


def load_cost_file(path, expect: dict | None = None) -> tuple[CostModel, dict]:
    """The model and the file; with `expect`, refuse a file measured elsewhere."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"cost file {path} not found (write one with python -m dflash.profile)")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"cost file {path} is corrupt: {exc}") from None
    for key in ("identity", "model"):
        if not isinstance(doc, dict) or not isinstance(doc.get(key), dict):
            raise DataError(f"cost file {path} is corrupt: no {key!r} object in it "
                            "(write one with python -m dflash.profile)")
    try:
        model = CostModel.from_dict(doc["model"])
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise DataError(f"cost file {path}: {exc}") from None
        raise DataError(f"cost file {path} is corrupt: its model has no usable {exc}") from None
    identity = doc["identity"]
    for k in MATCH_FIELDS if expect else ():
        there = identity.get(k, FIELD_DEFAULTS.get(k))
        if k in expect and there != expect[k]:
            raise DataError(f"cost file {path}: {k} is {there!r} there but "
                            f"{expect[k]!r} in this run; profile this setup "
                            "(python -m dflash.profile) before predicting with it")
    return model, doc


def predict_steps(model: CostModel, rows, seq_len, anchors) -> dict:
    """Per-step predicted seconds of a run (in step order: shape switches count), their
    sum, and how many steps were extrapolated."""
    sec = model.run_seconds(rows, seq_len, anchors)
    out = model.outside(rows, seq_len, anchors)
    return {"seconds": sec, "total_seconds": float(sec.sum()),
            "extrapolated_steps": int(out.sum())}
