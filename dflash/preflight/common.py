"""What every app's preflight shares: the command's config composed as the app composes
it, where its processes and devices go, and what the target's own files say (config,
tokenizer, taps, mask token)."""
from __future__ import annotations

from dataclasses import dataclass, field

from dflash.errors import ConfigError, TopologyError
from dflash.options import choice
from dflash.preflight.command import Command
from dflash.preflight.report import Report
from dflash.preflight.target_files import read_config, read_tokenizer
from dflash.preflight.world import World

APP_CONFIG = {"dflash.train": "train", "dflash.regenerate": "regenerate", "dflash.eval": "eval",
              "dflash.plan": "plan", "dflash.profile": "profile", "dflash.buckets": "bucket_fit",
              "dflash.end_to_end": "end_to_end"}


@dataclass
class Session:
    """Commands checked in order, as a guide runs them: a prepare's output is the next
    train's data (its length limit is known before the data exists); memory estimates
    are reused for the same model and shape."""
    produced: dict = field(default_factory=dict)  # path -> what writes it ({} for a preset)
    estimates: dict = field(default_factory=dict)


# Hydra's own command-line flags that take a value (the value is not an override)
HYDRA_VALUE_FLAGS = {"--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd",
                     "--package", "-p", "--cfg", "-c", "--info", "-i", "--experimental-rerun"}


def check_overrides(cmd: Command) -> None:
    """A word the app's Hydra would refuse (`lr 3e-4`, a lone `production`): refused here
    too, not dropped."""
    for i, a in enumerate(cmd.args):
        flag = a.startswith("-")
        value_of_flag = i > 0 and cmd.args[i - 1] in HYDRA_VALUE_FLAGS
        if not flag and not value_of_flag and "=" not in a and not a.startswith("~"):
            raise ConfigError(f"{cmd.module}: {a!r} is not a Hydra override (key=value, "
                              "group=option, +key=value or ~key)")


def compose(cmd: Command, hydra: bool = False):
    from dflash.config import compose as dflash_compose, register
    from hydra import compose as hydra_compose, initialize_config_dir
    from dflash.config import CONF_DIR
    check_overrides(cmd)
    overrides = _first_of_sweeps(cmd.overrides) if cmd.multirun else cmd.overrides
    if not hydra:
        return dflash_compose(APP_CONFIG[cmd.module], overrides)
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(APP_CONFIG[cmd.module], overrides, return_hydra_config=True)


def _first_of_sweeps(overrides: list) -> list:
    """A --multirun's first job: `k=a,b` -> `k=a` (each job is checked alike)."""
    return [o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0]
            if "," in o.split("=", 1)[1] and "[" not in o else o for o in overrides]


# ---- topology ---------------------------------------------------------------------
@dataclass
class Placement:
    gpu: bool
    world_size: int
    tp: int
    shared: bool  # target and drafter on one device


def placement(topo_cfg, cmd: Command, world: World) -> Placement:
    from dflash.topology import check_dp_size, check_target_tp, pair_devices
    n = cmd.world_size
    dev = choice(topo_cfg.device)
    if dev == "cuda" and not world.has_gpu:
        raise TopologyError("topology.device=cuda but the world has no GPU (use topology=cpu)")
    gpu = dev == "cuda" or (dev == "auto" and world.has_gpu)
    if "dp_size" in topo_cfg:
        check_dp_size(topo_cfg, n)
    tp = check_target_tp(topo_cfg, n)
    shared = True
    if gpu:
        gpus = world.gpus_per_node
        if tp == 1 and (n > 1 or topo_cfg.get("target_devices")):
            pairs = [pair_devices(topo_cfg, r, cmd.nproc_per_node, gpus)
                     for r in range(cmd.nproc_per_node)]
            shared = pairs[0][0] == pairs[0][1]
        elif cmd.nproc_per_node > gpus:
            raise TopologyError(f"{cmd.nproc_per_node} processes a node, {gpus} GPUs a node")
    return Placement(gpu, n, tp, shared)


def not_on_cpu(place: Placement, world: World, target_path, app: str) -> None:
    """A real target on the CPU of a GPU machine is a silent 100x: refused."""
    if world.has_gpu and not place.gpu and target_path:
        raise TopologyError(f"{app} would run the target ({target_path}) on CPU although the "
                            f"world has GPUs (topology.device=cpu): add topology=single_gpu, "
                            "or topology=pairs under torchrun")


# ---- the target ---------------------------------------------------------------------
def target_facts(tcfg, tp: int, rep: Report):
    """(HF config, text config, tapped layers, tokenizer) of model.target."""
    from dflash.model.target import checked_layer_ids, tiny_qwen3_config
    path = tcfg.get("path")
    hc = tiny_qwen3_config(tcfg) if not path else read_config(path)
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    taps = checked_layer_ids(list(tcfg.layer_ids) if tcfg.get("layer_ids") else None,
                             int(text.num_hidden_layers))
    if tp > 1:
        from dflash.model.tp_target import check_tp
        check_tp(path, tp)
    tok = read_tokenizer(path) if path else None
    rep.add("target", f"{type(text).__name__.replace('Config', '')} {path or '(in memory)'}: "
            f"{text.num_hidden_layers} layers x {text.hidden_size}, vocab "
            f"{vocab_of(hc)}, {tcfg.dtype}" + (f", TP {tp}" if tp > 1 else ""))
    rep.add("taps", taps)
    return hc, text, taps, tok


def vocab_of(hc) -> int:
    text = hc.get_text_config() if hasattr(hc, "get_text_config") else hc
    return int(getattr(hc, "vocab_size", None) or text.vocab_size)


def checked_mask(drafter_cfg, vocab: int, tok) -> int:
    """The mask id the real start picks, refused where it is a token text renders."""
    from dflash.data.mask_token import default_mask_token, rendered_tokens
    from dflash.model.drafter import mask_token_id
    mask = mask_token_id(drafter_cfg, vocab, default_mask_token(vocab, tok))
    if tok is not None and drafter_cfg.mask_token_id is not None:
        added = getattr(tok, "added_tokens_decoder", {})
        if mask in rendered_tokens(tok):
            what = f" ({added[mask].content!r})" if mask in added else ""
            raise ConfigError(f"model.drafter.mask_token_id={mask}{what} is a token the chat "
                              "template renders; leave it null (an unused special token of "
                              "this tokenizer is chosen)")
        if mask < len(tok) and mask not in added:
            raise ConfigError(f"model.drafter.mask_token_id={mask} is a word this tokenizer "
                              "emits; leave it null (an unused special token is chosen)")
    return mask


def dtype_on_gpu(tcfg, place: Placement, app: str) -> None:
    if place.gpu and str(tcfg.dtype) in ("auto", "native"):
        tcfg.dtype = "bfloat16"  # what the app resolves it to on CUDA
    if place.gpu and str(tcfg.dtype) == "float32" and tcfg.path:
        raise ConfigError(f"{app} would run the target in float32 on GPU (model.target.dtype): "
                          "set model.target.dtype=bfloat16 (the training recipe's precision)")


def devices_text(place: Placement, cmd: Command, world: World) -> str:
    if not place.gpu:
        return f"{place.world_size} process(es) on CPU"
    kind = ("one GPU each (target shard + drafter)" if place.tp > 1 else
            "target and drafter share a GPU" if place.shared else "a target GPU and a drafter GPU")
    groups = f", {place.world_size // place.tp} TP groups of {place.tp}" if place.tp > 1 else ""
    return (f"{cmd.nnodes} node(s) x {cmd.nproc_per_node} processes = {place.world_size} "
            f"ranks, {kind}{groups}")
