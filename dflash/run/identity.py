"""Who a training run is: the settings that decide what its checkpoints hold.

A checkpoint's `meta.json` records the identity of the run that wrote it, section by
section (flattened `key: value` pairs). `resume=auto` in a dir that holds another run
refuses in one line naming what differs, before anything is built:

    target   model.target: which model, its dtype and taps
    drafter  model.drafter + attention/compile knobs that change the weights' shapes
    loss     the objective and its settings
    optim    optimizer and schedule
    plan     data, batching, buckets, seed, epochs, dp_size (resume.PLAN_KEYS)
    data     a digest of the data set's files (a tokenized dir rewritten in place)

`checkpoint.force_resume=true` allows what is safe to change (loss, optim, plan, data: the
weights still load); a changed target or drafter never resumes, forced or not.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import OmegaConf

from dflash.errors import DataError

# keys that never change what a checkpoint holds (where things live, how fast)
_IGNORED = {
    "target": ("cache_mb", "build_device", "attn_implementation"),
    "drafter": ("init",),  # a warm start: a resume loads its own weights over it
    "data": ("cache_dir", "target_fit_batch"),
}
UNSAFE = ("target", "drafter")  # a change here cannot be resumed, even forced


def _flat(node, prefix: str) -> dict:
    if OmegaConf.is_config(node):
        node = OmegaConf.to_container(node, resolve=True)
    if not isinstance(node, dict):
        return {prefix: node}
    out = {}
    for k, v in node.items():
        out.update(_flat(v, f"{prefix}.{k}"))
    return out


def data_digest(cfg) -> str | None:
    """A digest of a tokenized data set's index files (meta.json, offsets.npy: cheap at
    any size, and any rewrite of the data changes them); None for generated data, which
    its config already names."""
    path = cfg.data.get("path")
    if not path or str(cfg.data.source) != "tokenized":
        return None
    h = hashlib.sha256()
    for name in ("meta.json", "offsets.npy"):
        f = Path(path) / name
        if f.exists():
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def identity(cfg) -> dict:
    """The run's identity: section -> {key: value} (JSON-safe)."""
    from dflash.resume import plan_hash
    m = cfg.model
    drop = lambda sec, d: {k: v for k, v in d.items()  # noqa: E731
                           if k.rsplit(".", 1)[-1] not in _IGNORED.get(sec, ())}
    return {
        "target": drop("target", _flat(m.target, "model.target")),
        "drafter": drop("drafter", _flat(m.drafter, "model.drafter")),
        "loss": _flat(cfg.loss, "loss"),
        "optim": _flat(cfg.optim, "optim"),
        "plan": {"plan_hash": plan_hash(cfg)},
        "data": {"data.digest": data_digest(cfg)},
    }


def differences(stored: dict, now: dict) -> list[tuple[str, str]]:
    """(section, "key old -> new") for every key that differs; keys only one side has
    (a setting added or retired between dflash versions) are not compared."""
    out = []
    for section, then in stored.items():
        cur = now.get(section, {})
        for key in sorted(set(then) & set(cur)):
            a, b = then[key], cur[key]
            if json.dumps(a, default=str) != json.dumps(b, default=str):
                what = ("the plan settings changed (data, batching, buckets, seed, epochs, "
                        f"dp_size: plan hash {a} -> {b})" if key == "plan_hash" else f"{key} {a} -> {b}")
                out.append((section, what))
    return out


def check(stored: dict | None, now: dict, where: str, force: bool) -> None:
    """Refuse (DataError, one line) to continue `where` as this run when it is another."""
    if not stored:
        return
    diff = differences(stored, now)
    if not diff:
        return
    unsafe = [d for s, d in diff if s in UNSAFE]
    shown = "; ".join(d for _, d in diff[:4]) + (f"; +{len(diff) - 4} more" if len(diff) > 4 else "")
    if unsafe:
        raise DataError(f"{where} holds another run (its drafter cannot load into this one): "
                        f"{shown}. Use another hydra.run.dir, or restore those settings")
    if not force:
        raise DataError(f"{where} holds another run: {shown}. Use another hydra.run.dir, "
                        "restore those settings, or pass checkpoint.force_resume=true to "
                        "continue its weights under the new ones")


def check_run_dir(cfg, out_dir: Path) -> None:
    """Before anything is built: with `resume=auto`, the newest checkpoint in `out_dir`
    (its meta.json only) or a finished run there must be this run."""
    if str(cfg.get("resume", "never")) != "auto":
        return
    out_dir, now = Path(out_dir), identity(cfg)
    force = bool(cfg.checkpoint.force_resume)
    for meta_file in sorted((out_dir / "checkpoints").glob("step-*/meta.json"), reverse=True):
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a partial checkpoint: resume skips it too
        check(meta.get("identity"), now, f"{out_dir} (checkpoint {meta_file.parent.name})", force)
        return
    stored = out_dir / "identity.json"
    if stored.exists():  # a finished run (checkpoints pruned, or none written)
        check(json.loads(stored.read_text()), now, str(out_dir), force)


def write(out_dir: Path, cfg) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "identity.json").write_text(json.dumps(identity(cfg), indent=1, default=str))


def checkpointer(cfg, out_dir: Path, topo, train_step):
    """The run's Checkpointer: every checkpoint carries this run's identity, and a resume
    refuses another run's checkpoint before its weights load. Rank 0 records the identity
    in the run dir, for a later resume=auto there."""
    from dflash.resume import Checkpointer, plan_hash
    ident, force = identity(cfg), bool(cfg.checkpoint.force_resume)
    if topo.is_main:
        write(out_dir, cfg)
    return Checkpointer(out_dir, cfg.checkpoint, cfg.resume, plan_hash(cfg), topo,
                        drafter=train_step.drafter, optimizer=train_step.optimizer,
                        scheduler=train_step.scheduler, generator=train_step.generator,
                        identity=ident, verify=lambda meta, path: check(
                            meta.get("identity"), ident, str(path), force))
