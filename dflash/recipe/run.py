"""The recipe's stages in order (dflash/end_to_end.py is the app; docs/real-model.md).

    target      the model: SmolLM2-135M-Instruct from its pip package, converted once to
                an HF directory (or `target=DIR`, any local HF chat model)
    estimate    the recipe's apps on 16 prompts: regenerate and train priced on this
                machine before they run (`budget_minutes=N` scales prompts and paths
                down to fit, saying what it scaled; `estimate=false` skips it)
    prompts     a seeded prompt set (`dflash.recipe.prompt_gen`) and held-out prompts of
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
                llama-server, the held-out prompts decoded there; its tokens and
                acceptance against dflash's (dflash/recipe/llama_cpp.py)
    speed       with llama.cpp: llama-server's greedy decoding speed on the held-out
                prompts, no speculation against its n-gram modes and the trained (and an
                untrained) drafter, at 1 and 4 concurrent requests (dflash/recipe/engine_speed.py)

Every stage's app config is composed and checked before the first stage runs
(stage_config.py). Every stage writes under `workdir` and a marker with its command and
wall time; a rerun skips each stage whose marker matches its command (regenerate and
train continue a killed run from their own parts / checkpoints). `workdir/summary.json`
gathers what each stage measured (summary.py).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from dflash.errors import ConfigError
from dflash.recipe.stage_config import StageConfigs, train_digest
from dflash.recipe.stages import Stages, run_app, train_finished
from dflash.recipe.summary import RecipeSummary, summarize
from dflash.recipe.workdir import Workdir

STAGES = ("target", "estimate", "prompts", "regenerate", "prepare", "train", "eval",
          "heldout_replies", "paths", "llama_cpp", "speed")
BASELINES = "baselines=[untrained,lookup,ngram]"


def prompt_sets(n_train: int, n_heldout: int, n_paths: int = 0) -> dict:
    """Held-out prompts (seed 1) drawn first from the held-out subjects, then distinct
    training prompts (seed 0) from the others, none of them also a held-out prompt:
    {file name: rows}. Held-out first, so they span every kind however many training
    prompts exhaust a kind's templates; on subjects of their own, so acceptance on them
    is drafting for new prompts, not recall of a training reply to the same question
    asked with another count. `n_paths` more held-out prompts (seed 2, none also a
    decoded one) for the walk along greedy replies."""
    from dflash.recipe.prompt_gen import prompt_set
    heldout = prompt_set(n_heldout, 1, split="heldout")
    texts = {p["messages"][0]["content"] for p in heldout}
    train = prompt_set(n_train, 0, exclude=texts, split="train")
    sets = {"prompts.jsonl": train, "heldout.jsonl": heldout}
    if n_paths:
        sets["heldout_paths.jsonl"] = prompt_set(n_paths, 2, exclude=texts, split="heldout")
    return sets


def write_prompt_sets(work: Workdir, sets: dict) -> None:
    for name, rows in sets.items():
        (work / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def target_dir(cfg) -> Path:
    """The target's HF dir: `target=DIR`, else the packaged SmolLM2 converted once."""
    if cfg.target:
        path = Path(str(cfg.target))
        if not (path / "config.json").exists():
            raise ConfigError(f"target={path}: no config.json there (a local HF model dir)")
        return path
    from dflash.recipe.gguf import smollm2_dir
    return smollm2_dir(str(cfg.cache_dir))


def recipe_target(cfg) -> Path:
    """Where the target's HF dir is (or will be, once the target stage converted it)."""
    from dflash.recipe.gguf import smollm2_dir
    return Path(str(cfg.target)) if cfg.target else smollm2_dir(str(cfg.cache_dir), convert=False)


def run(cfg) -> RecipeSummary:
    work = Workdir(Path(str(cfg.workdir)))
    tgt = recipe_target(cfg)
    apps = StageConfigs.build(cfg, tgt, work)  # every stage's config checked: typos fail here
    st = Stages(work.root)
    st.run("target", ["convert", str(tgt)], lambda: target_dir(cfg))
    n_prompts, n_paths = estimate(cfg, st, work, apps)
    # the marker holds the prompts' digest, not only the counts: a changed generator
    # writes other prompts for the same command, and every later stage must follow
    sets = prompt_sets(n_prompts, int(cfg.heldout), n_paths)
    digest = hashlib.sha1(json.dumps(sets, sort_keys=True).encode()).hexdigest()[:12]
    st.run("prompts", ["prompt_gen", n_prompts, int(cfg.heldout), n_paths, digest],
           lambda: write_prompt_sets(work, sets))
    regenerate(st, "regenerate", work, work.prompts, work.replies, apps,
               int(cfg.max_new_tokens))
    prep = ["--jsonl", work.replies, "--tokenizer", tgt, "--out", work.data]
    st.run("prepare", list(map(str, prep)), lambda: run_app("dflash.data.prepare", prep))
    # a run dir per training config: a killed run resumes (resume=auto), a changed one
    # starts afresh beside it instead of being refused as a changed plan
    # (and per data set: new replies train afresh, never resume a run on the old ones)
    run_dir = work.train_run(train_digest(apps.train_cfg, st.upstream))
    train = [*apps.train, "resume=auto", "checkpoint.every_minutes=2", f"hydra.run.dir={run_dir}"]
    st.run("train", train, lambda: run_app("dflash.train", train),
           unfinished=lambda: train_finished(run_dir))
    ev = [f"drafter={run_dir / 'drafter'}", *apps.model, f"prompts={work.heldout}",
          "format=chat", f"max_new_tokens={int(cfg.eval_max_new_tokens)}", BASELINES,
          f"ngram_data={work.data}", f"out={work.eval}", f"hydra.run.dir={work / 'eval'}",
          *apps.eval]
    st.run("eval", ev, lambda: run_app("dflash.eval", ev))
    if n_paths:
        walk_paths(cfg, st, work, tgt, run_dir / "drafter", apps)
    else:
        work.paths.unlink(missing_ok=True)
    serve_check(cfg, st, work, tgt, run_dir / "drafter")
    serve_speed(cfg, st, work, tgt, run_dir)
    return summarize(work, run_dir, st.seconds)


def estimate(cfg, st: Stages, work: Workdir, apps: StageConfigs) -> tuple[int, int]:
    """The long stages priced on this machine before they run (dflash/recipe/estimate.py),
    and (prompts, paths) scaled to `budget_minutes` where they would not fit it."""
    from dflash.recipe.estimate import Estimate, probe
    if not cfg.estimate:
        return int(cfg.prompts), int(cfg.paths)
    train_keys = apps.train_keys
    n = int(cfg.estimate_prompts)
    sample = prompt_sets(n, 1)["prompts.jsonl"]
    st.run("estimate", ["probe", n, int(cfg.max_new_tokens), *apps.model, *apps.regenerate,
                        *train_keys],
           lambda: work.estimate.write_text(json.dumps(probe(
               work / "estimate", sample, run_app, apps.model, apps.regenerate, train_keys,
               int(cfg.max_new_tokens)))))
    est = Estimate(**json.loads(work.estimate.read_text()), prompts=int(cfg.prompts),
                   paths=int(cfg.paths), epochs=int(apps.train_cfg.epochs))
    print(f"[estimate] on this machine: {est.lines()}", flush=True)
    prompts, paths = est.scaled(cfg.budget_minutes)
    if (prompts, paths) != (est.prompts, est.paths):
        print(f"[estimate] scaled to budget_minutes={cfg.budget_minutes:g}: prompts "
              f"{est.prompts} -> {prompts}, paths {est.paths} -> {paths} "
              f"(~{est.with_counts(prompts, paths).seconds / 60:.0f} min)", flush=True)
    return prompts, paths


def regenerate(st: Stages, stage: str, work: Workdir, prompts: Path, out: Path,
               apps: StageConfigs, max_new_tokens: int) -> None:
    """The target's greedy replies to `prompts` (a stage; a killed run continues from
    its parts, a changed one starts afresh)."""
    regen = [f"inputs=[{prompts}]", f"out={out}", *apps.model,
             f"max_new_tokens={max_new_tokens}", f"hydra.run.dir={work / stage}",
             *apps.regenerate]
    parts = Path(f"{out}.parts")

    def stale_parts():  # replies of other prompts or settings: regenerate would refuse them
        if parts.exists():
            print(f"[{stage}] its inputs or settings changed: {parts} removed", flush=True)
            shutil.rmtree(parts)
    st.run(stage, regen, lambda: run_app("dflash.regenerate", regen), on_redo=stale_parts)


def walk_paths(cfg, st: Stages, work: Workdir, tgt: Path, drafter: Path,
               apps: StageConfigs) -> None:
    """The held-out comparison at scale: the target's greedy replies to `cfg.paths`
    more held-out prompts, then the drafter and the baselines along them, the target
    in the precision it wrote them in (the steps are those of serving it so)."""
    regenerate(st, "heldout_replies", work, work.heldout_paths, work.heldout_replies, apps,
               int(cfg.eval_max_new_tokens))
    prep = ["--jsonl", work.heldout_replies, "--tokenizer", tgt, "--out", work.heldout_data]
    dtype = apps.regenerate_cfg.model.target.dtype
    walk = [f"drafter={drafter}", *apps.model, f"model.target.dtype={dtype}",
            f"paths={work.heldout_data}", BASELINES, f"ngram_data={work.data}",
            f"out={work.paths}", f"hydra.run.dir={work / 'paths'}"]

    def action():
        run_app("dflash.data.prepare", prep)
        run_app("dflash.eval", walk)
    st.run("paths", [*map(str, prep), *walk], action)


def serve_check(cfg, st: Stages, work: Workdir, target: Path, drafter: Path) -> None:
    """Where llama.cpp is at hand: the drafter served there, and its draft-vocabulary
    export (drafter_draft_vocab/, trained with loss.draft_vocab) decoded by dflash and by
    llama.cpp over the kept rows: tokens and acceptance compared prompt by prompt."""
    from dflash.eval.report import EvalReport
    from dflash.recipe.llama_cpp import check, llama_cpp_tree
    tree = llama_cpp_tree(cfg.llama_cpp)
    head = drafter.parent / "drafter_draft_vocab"
    if tree is None:
        for f in (work.llama_cpp, work.llama_cpp_draft_head):
            f.unlink(missing_ok=True)
        print("[llama_cpp] no llama.cpp tree (llama_cpp=DIR or $LLAMA_CPP_DIR): not checked",
              flush=True)
        return

    def report(path: Path) -> EvalReport:
        return EvalReport.from_json(json.loads(path.read_text()))

    def serve():
        result = check(tree, target, drafter, report(work.eval), work / "gguf")
        work.llama_cpp.write_text(json.dumps(result.to_json(), indent=2))
        if head.exists():
            ev = [f"drafter={head}", "model=hf", f"model.target.path={target}",
                  f"prompts={work.heldout}", "format=chat",
                  f"max_new_tokens={int(cfg.eval_max_new_tokens)}",
                  f"out={work.eval_draft_head}", f"hydra.run.dir={work / 'eval_draft_head'}"]
            run_app("dflash.eval", ev)
            result = check(tree, target, head, report(work.eval_draft_head),
                           work / "gguf_draft_head")
            work.llama_cpp_draft_head.write_text(json.dumps(result.to_json(), indent=2))
    st.run("llama_cpp", ["llama-server", str(tree), str(drafter), str(head.exists())], serve)


def serve_speed(cfg, st: Stages, work: Workdir, target: Path, run_dir: Path) -> None:
    """Where llama.cpp is at hand: its greedy decoding speed on the held-out prompts with
    no speculation, its n-gram modes, the trained drafter (whole LM head and, trained
    with loss.draft_vocab, the draft head) and an untrained one (dflash/recipe/engine_speed.py)."""
    from dflash.recipe.llama_cpp import llama_cpp_tree
    tree = llama_cpp_tree(cfg.llama_cpp)
    if tree is None or not cfg.speed:
        work.speed.unlink(missing_ok=True)
        return
    drafters = [f"trained={run_dir / 'drafter'}"]
    if (run_dir / "drafter_draft_vocab").exists():
        drafters.append(f"trained_draft_head={run_dir / 'drafter_draft_vocab'}")
    drafters.append(f"untrained={work.untrained_drafter}")
    args = ["--llama-cpp", str(tree), "--target", str(target), "--prompts", str(work.eval),
            "--max-new-tokens", str(int(cfg.eval_max_new_tokens)), "--out", str(work.speed),
            "--work", str(work / "speed"), *[x for d in drafters for x in ("--drafter", d)]]

    def measure():
        from dflash.eval.baselines import untrained_like
        from dflash.model.checkpoint import load_drafter, save_drafter
        from dflash.recipe.engine_speed import main as engine_speed
        save_drafter(untrained_like(load_drafter(run_dir / "drafter")), work.untrained_drafter)
        engine_speed(args)
    st.run("speed", args, measure)
