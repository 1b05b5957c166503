"""`python -m dflash.end_to_end` (`make train-real`): a drafter for a real chat model, start
to finish, each stage one of dflash's own apps.

    target      the model: SmolLM2-135M-Instruct from its pip package, converted once to
                an HF directory (or `target=DIR`, any local HF chat model)
    estimate    the recipe's apps on 16 prompts: regenerate and train priced on this
                machine before they run (`budget_minutes=N` scales prompts and paths
                down to fit, saying what it scaled; `estimate=false` skips it)
    prompts     a seeded prompt set (`dflash.data.prompt_gen`) and held-out prompts of
                the same kinds on subjects no training prompt mentions
    regenerate  the target answers the training prompts (on-policy replies, token ids kept)
    prepare     the replies -> dflash token data with the model's own chat template
    train       a drafter sized for the model (`model=hf`, its sizes printed)
    eval        acceptance on the held-out prompts by real speculative decoding: the
                trained drafter against an untrained one, prompt lookup and an n-gram
                table of the training data, each with a paired 95% interval
    heldout_replies  the target's greedy replies to many more held-out prompts
    paths       the same comparison along those replies (`dflash.eval paths=`): the
                verify steps greedy decoding takes there, known from each reply, at one
                target forward per reply: intervals narrow enough to tell ~0.05 apart
    llama_cpp   where a built llama.cpp tree is given (`llama_cpp=DIR` or $LLAMA_CPP_DIR):
                target and drafter converted by llama.cpp's own converter, served by
                llama-server (draft-dflash), the held-out prompts decoded there; its tokens
                and acceptance against dflash's (dflash/eval/llama_cpp.py)
    speed       with llama.cpp: llama-server's greedy decoding speed on the held-out
                prompts, no speculation against its n-gram modes and the trained (and an
                untrained) drafter, at 1 and 4 concurrent requests (dflash/eval/engine_speed.py)

Every stage writes under `workdir` and a marker with its command and wall time; a rerun
skips each stage whose marker matches its command (regenerate and train continue a
killed run from their own parts / checkpoints). `workdir/summary.json` gathers what
each stage measured.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from dflash import config
from dflash.errors import ConfigError, UserError, user_errors_exit

config.register()

STAGES = ("target", "estimate", "prompts", "regenerate", "prepare", "train", "eval",
          "heldout_replies", "paths", "llama_cpp", "speed")


class StageStopped(UserError):
    """A stage's app returned without finishing its work (a stop signal checkpointed it,
    or ended it): no marker is written, so the same command goes on from there."""


class StageFailed(UserError):
    """A stage's app failed: what it printed says why."""


def train_finished(run_dir: Path) -> str | None:
    """None once the train app finished its run in `run_dir`, else why not."""
    summary = Path(run_dir) / "summary.json"
    if not summary.exists():
        return "it wrote no summary.json"
    stopped = json.loads(summary.read_text()).get("preempted")
    return f"{stopped} stopped it (checkpointed)" if stopped else None


class Stages:
    """Runs stages in order, skipping those done with the same command after the same
    earlier stages: a stage that is redone (new prompts, say) redoes every stage after
    it, whose inputs it rewrote."""

    def __init__(self, work: Path):
        self.work = work
        self.marks = work / "stages"
        self.marks.mkdir(parents=True, exist_ok=True)
        self.seconds: dict = {}
        self.upstream = ""  # a digest of the earlier stages' runs

    def _chain(self, stamp: str) -> None:
        self.upstream = hashlib.sha1(f"{self.upstream}/{stamp}".encode()).hexdigest()[:12]

    def run(self, name: str, command: list, action, on_redo=None, unfinished=None) -> None:
        """`on_redo()`: called before a stage that ran before is redone (to clear
        what its earlier run left that the new one must not continue from);
        `unfinished()`: after the action, None when the stage's work is complete, else
        why not (the stage then has no marker and the same command resumes it)."""
        mark = self.marks / f"{name}.json"
        old = json.loads(mark.read_text()) if mark.exists() else None
        if old and old.get("command") == command and old.get("upstream") == self.upstream:
            self.seconds[name] = old["seconds"]
            print(f"[{name}] done before ({self.seconds[name]:.0f} s): skipped", flush=True)
            self._chain(old["stamp"])
            return
        if old and on_redo is not None:
            on_redo()
        print(f"[{name}] {' '.join(map(str, command))}", flush=True)
        t0 = time.perf_counter()
        action()
        why = unfinished() if unfinished is not None else None
        if why:
            raise StageStopped(f"stage {name} did not finish: {why}; rerun the same command "
                               "to go on from there")
        self.seconds[name] = time.perf_counter() - t0
        stamp = str(time.time_ns())
        mark.write_text(json.dumps({"command": command, "upstream": self.upstream,
                                    "seconds": self.seconds[name], "stamp": stamp}))
        self._chain(stamp)
        print(f"[{name}] {self.seconds[name]:.0f} s", flush=True)


def app(module: str, args: list) -> None:
    """One of dflash's apps in its own process (its output streams through)."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    rc = subprocess.run(cmd).returncode
    if rc < 0:  # a signal ended it: its parts / checkpoints are what the rerun goes on from
        import signal
        raise StageStopped(f"stage {module} was stopped by {signal.Signals(-rc).name}; rerun "
                           "the same command to go on (finished stages are skipped)")
    if rc != 0:
        raise StageFailed(f"stage {module} ended with status {rc}; fix what it printed and "
                          "rerun: finished stages are skipped")


def prompt_sets(n_train: int, n_heldout: int, n_paths: int = 0) -> dict:
    """Held-out prompts (seed 1) drawn first from the held-out subjects, then distinct
    training prompts (seed 0) from the others, none of them also a held-out prompt:
    {file name: rows}. Held-out first, so they span every kind however many training
    prompts exhaust a kind's templates; on subjects of their own, so acceptance on them
    is drafting for new prompts, not recall of a training reply to the same question
    asked with another count. `n_paths` more held-out prompts (seed 2, none also a
    decoded one) for the walk along greedy replies."""
    from dflash.data.prompt_gen import prompt_set
    heldout = prompt_set(n_heldout, 1, split="heldout")
    texts = {p["messages"][0]["content"] for p in heldout}
    train = prompt_set(n_train, 0, exclude=texts, split="train")
    sets = {"prompts.jsonl": train, "heldout.jsonl": heldout}
    if n_paths:
        sets["heldout_paths.jsonl"] = prompt_set(n_paths, 2, exclude=texts, split="heldout")
    return sets


def write_prompt_sets(work: Path, sets: dict) -> None:
    for name, rows in sets.items():
        (work / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def overrides(keys, prefix: str = "") -> list:
    """A nested dict of an app's keys -> its command-line overrides (a.b.c=value). A
    group's `_group_` key chooses that config group of the app (`loss: {_group_: dpace,
    draft_vocab: 4096}` -> loss=dpace loss.draft_vocab=4096)."""
    from omegaconf import OmegaConf
    out = []
    for k, v in (OmegaConf.to_container(keys, resolve=True) if OmegaConf.is_config(keys)
                 else keys).items():
        if isinstance(v, dict):
            if "_group_" in v:
                out.append(f"{prefix}{k}={v['_group_']}")
            out += overrides(_group_keys(v), f"{prefix}{k}.")
        else:
            text = json.dumps(v) if isinstance(v, (bool, list)) or v is None else str(v)
            out.append(f"{prefix}{k}={text}")
    return out


def with_group_choices(keys, recipe) -> list:
    """An app's overrides where a group choice replaced the recipe's keys for that group
    (`train.loss=ce` where the recipe nests `loss: {_group_: dpace, draft_vocab: 4096}`):
    the choice selects the app's config group, and the recipe's other keys for it
    still apply on top (loss=ce loss.draft_vocab=4096)."""
    from omegaconf import OmegaConf
    keys = OmegaConf.to_container(keys, resolve=True) if OmegaConf.is_config(keys) else keys
    out = overrides(keys)
    for k, v in keys.items():
        if isinstance(v, str) and isinstance(recipe.get(k), dict):
            out += overrides(_group_keys(recipe[k]), f"{k}.")
    return out


def _group_keys(keys: dict) -> dict:
    """A group's keys without its `_group_` choice."""
    return {k: v for k, v in keys.items() if k != "_group_"}


@functools.cache
def _recipe() -> dict:
    from omegaconf import OmegaConf
    raw = OmegaConf.load(Path(__file__).parent / "conf" / "end_to_end.yaml")
    return OmegaConf.to_container(raw, resolve=False)


def recipe_keys(app: str) -> dict:
    """The recipe file's own keys for `app` (before any command-line override; the file
    is read once)."""
    return dict(_recipe().get(app) or {})


def train_digest(keys: list, data: str = "") -> str:
    """A digest of the training config `keys` compose to, defaults included: a dflash
    whose defaults changed (a group preset, a schema default) trains afresh on a rerun
    rather than skipping to the drafter the old defaults trained."""
    from omegaconf import OmegaConf
    cfg = compose_train(keys)
    return hashlib.sha1((OmegaConf.to_yaml(cfg) + data).encode()).hexdigest()[:8]


def compose_train(keys):
    """The train app's config for `keys`, inside this app or outside it."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra
    if GlobalHydra.instance().is_initialized():  # inside this app: its conf dir is dflash's
        return hydra_compose("train", list(keys))
    return config.compose("train", keys)


def target_dir(cfg, work: Path) -> Path:
    if cfg.target:
        path = Path(str(cfg.target))
        if not (path / "config.json").exists():
            raise ConfigError(f"target={path}: no config.json there (a local HF model dir)")
        return path
    from dflash.model.gguf import smollm2_dir
    return smollm2_dir(str(cfg.cache_dir))


def run(cfg: DictConfig) -> dict:
    work = Path(str(cfg.workdir))
    st = Stages(work)
    from dflash.model.gguf import smollm2_dir
    tgt = Path(str(cfg.target)) if cfg.target else smollm2_dir(str(cfg.cache_dir), convert=False)
    st.run("target", ["convert", str(tgt)], lambda: target_dir(cfg, work))
    model = ["model=hf", f"model.target.path={tgt}"]
    regen_keys = with_group_choices(cfg.regenerate, recipe_keys("regenerate"))
    n_prompts, n_paths = estimate(cfg, st, work, model, regen_keys)
    # the marker holds the prompts' digest, not only the counts: a changed generator
    # writes other prompts for the same command, and every later stage must follow
    sets = prompt_sets(n_prompts, int(cfg.heldout), n_paths)
    digest = hashlib.sha1(json.dumps(sets, sort_keys=True).encode()).hexdigest()[:12]
    st.run("prompts", ["prompt_gen", n_prompts, int(cfg.heldout), n_paths, digest],
           lambda: write_prompt_sets(work, sets))
    regenerate(st, "regenerate", work, "prompts.jsonl", "replies.jsonl", model,
               int(cfg.max_new_tokens), regen_keys)
    prep = ["--jsonl", work / "replies.jsonl", "--tokenizer", tgt, "--out", work / "data"]
    st.run("prepare", list(map(str, prep)), lambda: app("dflash.data.prepare", prep))
    keys = [*model, "data=tokenized", f"data.path={work / 'data'}", "eval.enabled=false",
            *with_group_choices(cfg.train, recipe_keys("train"))]
    # a run dir per training config: a killed run resumes (resume=auto), a changed one
    # starts afresh beside it instead of being refused as a changed plan
    # (and per data set: new replies train afresh, never resume a run on the old ones)
    run_dir = work / f"train-{train_digest(keys, st.upstream)}"
    train = [*keys, "resume=auto", "checkpoint.every_minutes=2", f"hydra.run.dir={run_dir}"]
    st.run("train", train, lambda: app("dflash.train", train),
           unfinished=lambda: train_finished(run_dir))
    ev = [f"drafter={run_dir / 'drafter'}", *model, f"prompts={work / 'heldout.jsonl'}",
          "format=chat", f"max_new_tokens={int(cfg.eval_max_new_tokens)}",
          "baselines=[untrained,lookup,ngram]", f"ngram_data={work / 'data'}",
          f"out={work / 'eval.json'}", f"hydra.run.dir={work / 'eval'}",
          *with_group_choices(cfg.eval, recipe_keys("eval"))]
    st.run("eval", ev, lambda: app("dflash.eval", ev))
    if n_paths:
        walk_paths(cfg, st, work, tgt, run_dir / "drafter", model, regen_keys)
    else:
        (work / "paths.json").unlink(missing_ok=True)
    serve_check(cfg, st, work, tgt, run_dir / "drafter")
    serve_speed(cfg, st, work, tgt, run_dir)
    return summarize(work, run_dir, st.seconds)


def estimate(cfg, st: Stages, work: Path, model: list, regen_keys: list) -> tuple[int, int]:
    """The long stages priced on this machine before they run (dflash/recipe_estimate.py),
    and (prompts, paths) scaled to `budget_minutes` where they would not fit it."""
    from dflash.recipe_estimate import Estimate, probe
    if not cfg.estimate:
        return int(cfg.prompts), int(cfg.paths)
    train_keys = with_group_choices(cfg.train, recipe_keys("train"))
    n = int(cfg.estimate_prompts)
    sample = prompt_sets(n, 1)["prompts.jsonl"]
    out = work / "estimate.json"
    st.run("estimate", ["probe", n, int(cfg.max_new_tokens), *model, *regen_keys, *train_keys],
           lambda: out.write_text(json.dumps(probe(
               work / "estimate", sample, app, model, regen_keys, train_keys,
               int(cfg.max_new_tokens)))))
    epochs = int(compose_train([*model, *train_keys]).epochs)
    est = Estimate(**json.loads(out.read_text()), prompts=int(cfg.prompts),
                   paths=int(cfg.paths), epochs=epochs)
    print(f"[estimate] on this machine: {est.lines()}", flush=True)
    prompts, paths = est.scaled(cfg.budget_minutes)
    if (prompts, paths) != (est.prompts, est.paths):
        print(f"[estimate] scaled to budget_minutes={cfg.budget_minutes:g}: prompts "
              f"{est.prompts} -> {prompts}, paths {est.paths} -> {paths} "
              f"(~{est.with_counts(prompts, paths).seconds / 60:.0f} min)", flush=True)
    return prompts, paths


def regenerate(st: Stages, stage: str, work: Path, prompts: str, out: str, model: list,
               max_new_tokens: int, keys: list) -> None:
    """The target's greedy replies to `prompts` (a stage; a killed run continues from
    its parts, a changed one starts afresh)."""
    regen = [f"inputs=[{work / prompts}]", f"out={work / out}", *model,
             f"max_new_tokens={max_new_tokens}", f"hydra.run.dir={work / stage}", *keys]
    parts = work / f"{out}.parts"

    def stale_parts():  # replies of other prompts or settings: regenerate would refuse them
        if parts.exists():
            print(f"[{stage}] its inputs or settings changed: {parts} removed", flush=True)
            shutil.rmtree(parts)
    st.run(stage, regen, lambda: app("dflash.regenerate", regen), on_redo=stale_parts)


def walk_paths(cfg, st: Stages, work: Path, tgt: Path, drafter: Path, model: list,
               regen_keys: list) -> None:
    """The held-out comparison at scale: the target's greedy replies to `cfg.paths`
    more held-out prompts, then the drafter and the baselines along them, the target
    in the precision it wrote them in (the steps are those of serving it so)."""
    regenerate(st, "heldout_replies", work, "heldout_paths.jsonl", "heldout_replies.jsonl",
               model, int(cfg.eval_max_new_tokens), regen_keys)
    data = work / "heldout_data"
    prep = ["--jsonl", work / "heldout_replies.jsonl", "--tokenizer", tgt, "--out", data]
    dtype = next((k.split("=", 1)[1] for k in regen_keys
                  if k.startswith("model.target.dtype=")), "float32")
    walk = [f"drafter={drafter}", *model, f"model.target.dtype={dtype}", f"paths={data}",
            "baselines=[untrained,lookup,ngram]", f"ngram_data={work / 'data'}",
            f"out={work / 'paths.json'}", f"hydra.run.dir={work / 'paths'}"]

    def action():
        app("dflash.data.prepare", prep)
        app("dflash.eval", walk)
    st.run("paths", [*map(str, prep), *walk], action)


def serve_check(cfg, st: Stages, work: Path, target: Path, drafter: Path) -> None:
    """Where llama.cpp is at hand: the drafter served there, and its draft-vocabulary
    export (drafter_draft_vocab/, trained with loss.draft_vocab) decoded by dflash and by
    llama.cpp over the kept rows: tokens and acceptance compared prompt by prompt."""
    from dflash.eval.llama_cpp import check, llama_cpp_tree
    tree = llama_cpp_tree(cfg.llama_cpp)
    head = drafter.parent / "drafter_draft_vocab"
    if tree is None:
        for f in ("llama_cpp.json", "llama_cpp_draft_head.json"):
            (work / f).unlink(missing_ok=True)
        print("[llama_cpp] no llama.cpp tree (llama_cpp=DIR or $LLAMA_CPP_DIR): not checked",
              flush=True)
        return

    def serve():
        result = check(tree, target, drafter, json.loads((work / "eval.json").read_text()),
                       work / "gguf")
        (work / "llama_cpp.json").write_text(json.dumps(result, indent=2))
        if head.exists():
            ev = [f"drafter={head}", "model=hf", f"model.target.path={target}",
                  f"prompts={work / 'heldout.jsonl'}", "format=chat",
                  f"max_new_tokens={int(cfg.eval_max_new_tokens)}",
                  f"out={work / 'eval_draft_head.json'}", f"hydra.run.dir={work / 'eval_draft_head'}"]
            app("dflash.eval", ev)
            result = check(tree, target, head,
                           json.loads((work / "eval_draft_head.json").read_text()),
                           work / "gguf_draft_head")
            (work / "llama_cpp_draft_head.json").write_text(json.dumps(result, indent=2))
    st.run("llama_cpp", ["llama-server", str(tree), str(drafter), str(head.exists())], serve)


def serve_speed(cfg, st: Stages, work: Path, target: Path, run_dir: Path) -> None:
    """Where llama.cpp is at hand: its greedy decoding speed on the held-out prompts with
    no speculation, its n-gram modes, the trained drafter (whole LM head and, trained
    with loss.draft_vocab, the draft head) and an untrained one (dflash/eval/engine_speed.py)."""
    from dflash.eval.llama_cpp import llama_cpp_tree
    tree = llama_cpp_tree(cfg.llama_cpp)
    if tree is None or not cfg.speed:
        (work / "speed.json").unlink(missing_ok=True)
        return
    drafters = [f"trained={run_dir / 'drafter'}"]
    if (run_dir / "drafter_draft_vocab").exists():
        drafters.append(f"trained_draft_head={run_dir / 'drafter_draft_vocab'}")
    drafters.append(f"untrained={work / 'untrained_drafter'}")
    args = ["--llama-cpp", str(tree), "--target", str(target), "--prompts", str(work / "eval.json"),
            "--max-new-tokens", str(int(cfg.eval_max_new_tokens)), "--out", str(work / "speed.json"),
            "--work", str(work / "speed"), *[x for d in drafters for x in ("--drafter", d)]]

    def measure():
        from dflash.eval.baselines import untrained_like
        from dflash.eval.engine_speed import main as engine_speed
        from dflash.model.checkpoint import load_drafter, save_drafter
        save_drafter(untrained_like(load_drafter(run_dir / "drafter")), work / "untrained_drafter")
        engine_speed(args)
    st.run("speed", args, measure)


def summarize(work: Path, run_dir: Path, seconds: dict) -> dict:
    regen = json.loads((work / "replies.jsonl.report.json").read_text())
    train = json.loads((run_dir / "summary.json").read_text())
    ev = json.loads((work / "eval.json").read_text())
    # the first loss's yardstick: uniform over what the training softmax spans
    vocab = int((train["model"].get("draft_vocab") or {}).get("size") or train["model"]["vocab_size"])
    out = {"stage_seconds": seconds, "total_seconds": sum(seconds.values()),
           "regenerate": {k: regen[k] for k in ("conversations_written", "generated_tokens",
                                                 "generated_tokens_this_run",
                                                 "tokens_per_second", "truncated", "decoding")},
           "train": {"steps": train["steps"], "tokens_per_second": train["tokens_per_second"],
                     "initial_loss": train["initial_loss"], "final_loss": train["final_loss"],
                     "uniform_loss": math.log(vocab), "stage_ms": train["stage_ms"],
                     "model": train["model"]},
           "eval": {"drafter": ev["acceptance_length"], "interval": ev["interval"],
                    **{name: {"acceptance_length": b["acceptance_length"],
                              "drafter_minus_this": b["drafter_minus_this"]}
                       for name, b in ev["baselines"].items()}}}
    if (work / "paths.json").exists():  # the walk along many more held-out replies
        p = json.loads((work / "paths.json").read_text())["paths"]
        out["paths"] = {"replies": p["replies"], "drafter": p["acceptance_length"],
                        "interval": p["interval"],
                        **{name: {"acceptance_length": b["acceptance_length"],
                                  "drafter_minus_this": b["drafter_minus_this"]}
                           for name, b in p["baselines"].items()}}
    if (work / "llama_cpp_draft_head.json").exists():
        out["llama_cpp_draft_head"] = {
            k: v for k, v in json.loads((work / "llama_cpp_draft_head.json").read_text()).items()
            if k != "per_prompt"}
    if (work / "speed.json").exists():
        out["speed"] = json.loads((work / "speed.json").read_text())
    if (work / "llama_cpp.json").exists():
        out["llama_cpp"] = {k: v for k, v in json.loads((work / "llama_cpp.json").read_text()).items()
                            if k != "per_prompt"}
    (work / "summary.json").write_text(json.dumps(out, indent=2))
    return out


def format_summary(s: dict) -> str:
    t, r, e = s["train"], s["regenerate"], s["eval"]
    lines = ["stage seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in s["stage_seconds"].items())
             + f" (total {s['total_seconds'] / 60:.1f} min)",
             f"regenerate: {r['conversations_written']} replies, {r['generated_tokens']:,} "
             + (f"tokens at {r['tokens_per_second']:.1f} tok/s ({r['decoding']}), "
                if r["generated_tokens_this_run"] else "tokens (every batch resumed from its part), ")
             + f"{r['truncated']} cut at max_new_tokens",
             f"train: {t['steps']} steps, {t['tokens_per_second']:.0f} real tok/s, loss "
             f"{t['initial_loss']:.2f} -> {t['final_loss']:.2f} (uniform over the softmax's ids = "
             f"{t['uniform_loss']:.2f})",
             f"eval (held-out prompts, decoded): drafter acceptance {e['drafter']:.3f}",
             *_versus(e)]
    if "paths" in s:
        p = s["paths"]
        lines += [f"paths ({p['replies']} more held-out prompts, along the target's greedy "
                  f"replies): drafter acceptance {p['drafter']:.3f}", *_versus(p)]
    if "llama_cpp" in s:
        from dflash.eval.llama_cpp import format_check
        lines.append(format_check(s["llama_cpp"]))
    if "llama_cpp_draft_head" in s:
        from dflash.eval.llama_cpp import format_check
        lines.append("draft head: " + format_check(s["llama_cpp_draft_head"]))
    if "speed" in s:
        from dflash.eval.engine_speed import format_table
        lines += ["llama-server speed, greedy, on the held-out prompts:",
                  *[format_table(r) for r in s["speed"]["runs"]]]
    return "\n".join(lines)


def _versus(figures: dict) -> list:
    """The drafter against each baseline, one line each."""
    lines = []
    for name in ("untrained", "lookup", "ngram"):
        if name in figures:
            d = figures[name]["drafter_minus_this"]
            lines.append(f"  vs {name:<9} {figures[name]['acceptance_length']:.3f}: drafter "
                         f"{d['difference']:+.3f} (95% CI {d['lo']:+.3f} to {d['hi']:+.3f})"
                         f"{'' if d['better'] else '  not measurably better'}")
    return lines


@hydra.main(config_path="conf", config_name="end_to_end", version_base="1.3")
@user_errors_exit
def main(cfg: DictConfig) -> None:
    print(format_summary(run(cfg)))


if __name__ == "__main__":
    main()
