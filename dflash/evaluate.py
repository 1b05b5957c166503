"""`python -m dflash.eval drafter=DIR prompts=F [model=...]`: acceptance length of any
drafter checkpoint against its target, by real speculative decoding.

The app lives here, at the apps' layer beside train/plan/regenerate (it registers the
Hydra schemas); `python -m dflash.eval`, the command users know, forwards to it from
the eval library package without importing upward (dflash/eval/__main__.py)."""
from __future__ import annotations

import hydra

from dflash import config
from dflash.errors import hydra_dirs_checked, user_errors_exit
from dflash.comparison.stats import bootstrap_acceptance
from dflash.eval.baselines import build_baseline, check_baseline, paired_difference
from dflash.decode import evaluate, speculative_decode
from dflash.eval.prompts import check_pair, load_prompts
from dflash.eval.report import Baseline, EvalReport, PathsReport, Score


def main_app(cfg) -> dict:
    """The eval app in this process: its report as the JSON it writes to `out=`."""
    return eval_report(cfg).to_json()


def eval_report(cfg) -> EvalReport:
    """Decode `prompts=` (with baselines), walk `paths=`, time `speed=true`; write `out=`."""
    import json

    from dflash.options import choice
    from dflash.errors import DataError
    from dflash.model.checkpoint import load_drafter
    from dflash.model.target import Target
    from dflash.topology import resolve_device

    if not cfg.drafter or not (cfg.prompts or cfg.paths):
        raise DataError("dflash.eval needs drafter=DIR and prompts=FILE (JSONL or data set dir) "
                        "to decode, or paths=DIR (held-out greedy replies) to walk")
    from dflash.step import resolve_target_dtype
    prompts = check_inputs(cfg)  # before the target loads (minutes on a large one)
    target, dev = _load_target(cfg) if int(cfg.topology.target_tp) > 1 else (None, None)
    if target is None:
        dev = resolve_device(choice(cfg.device))
        resolve_target_dtype(cfg.model.target, dev)
        target = Target.from_config(cfg.model.target).to(dev)
    drafter = load_drafter(cfg.drafter, device=dev)
    target.layer_ids = list(drafter.spec.target_layer_ids)  # the checkpoint decides
    report = decoded(cfg, target, drafter, prompts) if cfg.prompts else EvalReport(str(cfg.drafter))
    if cfg.paths:
        report.paths = walked(cfg, target, drafter)
    if cfg.speed:
        report.speed = timed(cfg, target, drafter, prompts)
    if cfg.out and _main_rank():
        from pathlib import Path
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(report.to_json(), indent=2))
    return report


def check_settings(cfg) -> None:
    """Values that cannot work, and an out= that cannot be written."""
    from dflash.errors import check_file_path, require
    n = int(cfg.num_prompts)
    require(n == -1 or n >= 1, "num_prompts", n, ">= 1, or -1 for every prompt")
    require(int(cfg.max_new_tokens) >= 1, "max_new_tokens", cfg.max_new_tokens, ">= 1")
    require(int(cfg.batch_size) >= 1, "batch_size", cfg.batch_size, ">= 1")
    require(float(cfg.temperature) >= 0, "temperature", cfg.temperature, "0 (greedy) or more")
    require(0 <= float(cfg.confidence_stop) < 1, "confidence_stop", cfg.confidence_stop, "in [0, 1)")
    check_file_path("out", cfg.out)


def check_inputs(cfg) -> list | None:
    """The settings, the drafter's files, the prompts and the paths= data set: a bad one
    is refused in one line before the target is loaded. Returns the prompts (read once)."""
    from dflash.data.format import TokenDataset
    from dflash.model.checkpoint import drafter_config
    check_settings(cfg)
    drafter_config(cfg.drafter)
    prompts = read_prompts(cfg)
    if cfg.paths:
        TokenDataset.open(str(cfg.paths))
    for name in cfg.baselines:
        check_baseline(str(name), cfg.ngram_data)
    return prompts


def read_prompts(cfg) -> list | None:
    """`prompts=` as token ids (benchmark formats rendered with the tokenizer alone: no
    model is loaded for it); None without prompts=."""
    from dflash.options import choice
    if not cfg.prompts:
        return None
    tok = None
    if choice(cfg.format) != "prompt_ids":
        from dflash.data.prepare import load_tokenizer
        tok_dir = cfg.tokenizer or cfg.model.target.path
        tok = load_tokenizer(tok_dir) if tok_dir else None
    return load_prompts(cfg.prompts, int(cfg.num_prompts), choice(cfg.format), tok)


def _load_target(cfg):
    """(target, device) of a target larger than one GPU: sharded over a TP group of
    `topology.target_tp` ranks (torchrun), every rank decoding the same prompts in step
    (the sharded forward is a collective); rank 0 writes the report."""
    import os
    from dflash.model.tp_target import TensorParallelTarget
    from dflash.step import resolve_target_dtype
    from dflash.topology import build_topology
    cfg.topology.dp_size = int(os.environ.get("WORLD_SIZE", 1))
    topo = build_topology(cfg.topology)
    resolve_target_dtype(cfg.model.target, topo.target_device)
    return TensorParallelTarget.load(cfg.model.target, topo.tp_mesh), topo.drafter_device


def _main_rank() -> bool:
    from dflash.topology import launch_rank
    return launch_rank() == 0


def decoded(cfg, target, drafter, prompts: list) -> EvalReport:
    """Real speculative decoding of `prompts`: the drafter, then each baseline."""
    from dflash.options import choice

    check_pair(drafter, target, prompts, f"drafter {cfg.drafter}")
    baselines = [build_baseline(str(b), drafter, target, cfg.ngram_data) for b in cfg.baselines]
    decode = dict(temperature=float(cfg.temperature), batch_size=int(cfg.batch_size),
                  seed=int(cfg.seed), eos_token_id=getattr(target.config, "eos_token_id", None))
    res = evaluate(target, drafter, prompts, int(cfg.max_new_tokens), progress="eval",
                   confidence_stop=float(cfg.confidence_stop), **decode)
    report = EvalReport(
        str(cfg.drafter), str(cfg.prompts), choice(cfg.format), float(cfg.temperature),
        float(cfg.confidence_stop), int(cfg.max_new_tokens), **res.as_dict(),
        prompt_ids=[list(map(int, p)) for p in prompts],
        tokens=[list(map(int, t)) for t in res.tokens],
        per_prompt_last_step_accepted=[r[-1] - 1 if r else 0 for r in res.accept_lengths])
    report.interval = bootstrap_acceptance(res.per_prompt, report.per_prompt_steps)
    if drafter.confidence_head is not None:  # DSpark: its confidence against what happened
        from dflash.eval.calibration import confidence_calibration
        report.calibration = confidence_calibration(
            target, drafter, [list(map(int, p)) + list(map(int, t)) for p, t in zip(prompts, res.tokens)],
            [len(p) for p in prompts], batch_size=int(cfg.batch_size))
    report.baselines = {}
    for name, proposer in zip(cfg.baselines, baselines):
        b = Score.from_json(speculative_decode(target, proposer, prompts, int(cfg.max_new_tokens),
                                               progress=f"eval {name}", **decode).as_dict())
        b.interval = bootstrap_acceptance(b.per_prompt, b.per_prompt_steps)
        report.baselines[str(name)] = Baseline(**vars(b),
                                               drafter_minus_this=paired_difference(report, b))
    return report


def timed(cfg, target, drafter, prompts: list | None) -> dict:
    """`speed=true`: batch-1 greedy tokens/s plainly and with the drafter on this machine."""
    from dflash.errors import ConfigError
    from dflash.eval.speed import measure_speed
    if float(cfg.temperature) != 0.0 or not prompts:
        raise ConfigError("speed=true times greedy decoding of prompts=: it needs "
                          f"temperature=0 and prompts= (got temperature={cfg.temperature})")
    return measure_speed(target, drafter, prompts, int(cfg.max_new_tokens),
                         getattr(target.config, "eos_token_id", None))


def walked(cfg, target, drafter) -> PathsReport:
    """Greedy acceptance along the held-out replies of `paths` (dflash.eval.paths): the
    drafter, then each baseline, with paired intervals."""
    from dflash.data.format import TokenDataset
    from dflash.errors import ConfigError
    from dflash.eval.paths import compare_on_paths

    if float(cfg.temperature) != 0.0:
        raise ConfigError("paths= walks greedy replies: it measures temperature=0 only "
                          f"(got temperature={cfg.temperature})")
    ds = TokenDataset.open(str(cfg.paths))
    baselines = {str(b): build_baseline(str(b), drafter, target, cfg.ngram_data)
                 for b in cfg.baselines}
    out = compare_on_paths(target, drafter, baselines, ds,
                           progress=lambda name: print(f"paths: {name}", flush=True))
    out.data = str(cfg.paths)
    return out


def format_eval(report: EvalReport) -> str:
    lines = []
    if report.decoded:
        hist = report.histogram
        total = max(1, sum(hist))
        lines += [f"acceptance length {report.acceptance_length:.3f} over "
                  f"{report.verify_steps} verify steps, {len(report.per_prompt)} prompts",
                  "per prompt: " + " ".join(f"{x:.2f}" for x in report.per_prompt),
                  "accepted tokens per step:"]
        for k, c in enumerate(hist, 1):
            if c:
                lines.append(f"  {k:>2}  {c:>6}  {'#' * max(1, round(40 * c / total))}")
        lines += comparison_table(report)
    if report.calibration:
        from dflash.eval.calibration import format_calibration
        lines.append(format_calibration(report.calibration))
    if report.paths is not None:
        p = report.paths
        lines += [f"along {p.replies} held-out greedy replies ({p.verify_steps} verify "
                  f"steps of the drafter): acceptance length {p.acceptance_length:.3f}",
                  *comparison_table(p)]
    if report.speed is not None:
        from dflash.eval.speed import format_speed
        lines.append(format_speed(report.speed))
    return "\n".join(lines)


def comparison_table(report) -> list:
    """The drafter and each baseline: acceptance, interval, the paired difference."""
    if not report.baselines:
        return []
    lines = [f"{'':>12} {'acceptance':>10}  {'95% CI':>13}  drafter minus it (95% CI)"]
    rows = [("drafter", report, None)] + [(n, b, b.drafter_minus_this)
                                          for n, b in report.baselines.items()]
    for name, r, d in rows:
        ci = r.interval or {"lo": float("nan"), "hi": float("nan")}
        diff = "" if d is None else (f"{d.difference:+.3f} ({d.lo:+.3f} to "
                                     f"{d.hi:+.3f}){'  better' if d.better else ''}")
        lines.append(f"{name:>12} {r.acceptance_length:10.3f}  {ci['lo']:.2f} to "
                     f"{ci['hi']:.2f}  {diff}")
    return lines


config.register()


@hydra_dirs_checked
@hydra.main(config_path="conf", config_name="eval", version_base="1.3")
@user_errors_exit
def main(cfg) -> None:
    report = eval_report(cfg)
    if _main_rank():
        print(format_eval(report))


if __name__ == "__main__":
    main()
