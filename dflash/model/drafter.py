"""The DFlash drafter: a few Qwen3-style layers that denoise a block of 16 tokens.

A block is [anchor token, MASK x 15] at positions a..a+15. Queries come from the block;
keys and values from [projected target context ; block] ("KV injection"): the context is
the target's hidden states at a few layers, concatenated, projected by `fc` and
RMS-normed once, and every layer reads it through its own k/v projections. A block sees
context strictly before its anchor and all of its own block (bidirectional), never
another block. Embedding and LM head are the target's (frozen, not stored here).
Parameter names match the public DFlash drafter checkpoints.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dflash.errors import ConfigError
from dflash.model.dspark import ConfidenceHead, MarkovHead, check_heads
from dflash.model.masks import (ChunkedMask, block_mask, chunked_attention, chunked_block_mask,
                                flex_block_mask)


@dataclass
class DrafterSpec:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list = field(default_factory=list)
    block_size: int = 16
    mask_token_id: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    attention_bias: bool = False  # bias on q/k/v/o projections (Qwen3 attention_bias)
    # per layer full_attention | sliding_attention ([]: all full); a sliding layer's query
    # at position q sees context q - (W - 1) .. q (the public configs' unit); causal:
    # block offset k sees k' <= k only, in every layer (the public `is_causal` flag)
    layer_types: list = field(default_factory=list)
    sliding_window: int | None = None
    causal: bool = False
    # DSpark (dflash/model/dspark.py): the Markov head's rank (0: plain DFlash), the
    # confidence head, W2's rows (None: the vocabulary; a draft vocabulary's size), and
    # the layout: anchor-first (slot k drafts anchor + k + 1) or slot 0 the anchor
    markov_rank: int = 0
    confidence_head: bool = False
    draft_rows: int | None = None
    sample_from_anchor: bool = False

    def __post_init__(self):
        check_layout(self.num_layers, self.layer_types, self.sliding_window)
        check_heads(self.markov_rank, self.confidence_head)
        # one spelling per layout: [] for all full, a window only where one is used
        if SLIDING not in (self.layer_types or []):
            self.layer_types, self.sliding_window = [], None
        self.layer_types = list(self.layer_types)

    def windows(self) -> list:
        """Each layer's window (None: full attention)."""
        kinds = self.layer_types or [FULL] * self.num_layers
        return [self.sliding_window if k == SLIDING else None for k in kinds]

    @classmethod
    def from_target(cls, target, cfg, default_mask: int | None = None) -> "DrafterSpec":
        tc = target.config
        mask = mask_token_id(cfg, target.vocab_size, default_mask)
        return cls(hidden_size=tc.hidden_size, num_layers=cfg.num_layers,
                   num_heads=tc.num_attention_heads, num_kv_heads=tc.num_key_value_heads,
                   head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
                   intermediate_size=tc.intermediate_size, vocab_size=target.vocab_size,
                   num_target_layers=tc.num_hidden_layers,
                   target_layer_ids=list(target.layer_ids), block_size=cfg.block_size,
                   mask_token_id=int(mask), rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
                   rope_theta=float(getattr(tc, "rope_theta", None)
                                    or (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 1e6)),
                   max_position_embeddings=getattr(tc, "max_position_embeddings", 40960),
                   layer_types=list(cfg.get("layer_types") or []),
                   sliding_window=cfg.get("sliding_window"), causal=bool(cfg.get("causal", False)),
                   markov_rank=int(cfg.get("markov_rank", 0) or 0),
                   confidence_head=bool(cfg.get("confidence_head", False)),
                   sample_from_anchor=bool(cfg.get("sample_from_anchor", False)))


FULL, SLIDING = "full_attention", "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)


def check_layout(num_layers: int, layer_types, window, prefix: str = "model.drafter.") -> None:
    """One line naming the key for a layout the drafter cannot run."""
    kinds = list(layer_types or [])
    if kinds and len(kinds) != num_layers:
        raise ConfigError(f"{prefix}layer_types has {len(kinds)} entries for {num_layers} "
                          f"layers ({prefix}num_layers): give one per layer")
    bad = [k for k in kinds if k not in LAYER_TYPES]
    if bad:
        raise ConfigError(f"{prefix}layer_types: unknown layer type {bad[0]!r} (one of "
                          f"{', '.join(LAYER_TYPES)})")
    if window is not None and int(window) <= 0:
        raise ConfigError(f"{prefix}sliding_window={window}: a window must be a positive "
                          "number of positions")
    if SLIDING in kinds and window is None:
        raise ConfigError(f"{prefix}layer_types has sliding_attention layers but "
                          f"{prefix}sliding_window is not set")


def mask_token_id(cfg, vocab_size: int, default: int | None = None) -> int:
    """The drafter's mask token: `model.drafter.mask_token_id`, else `default` (a row
    the data's tokenizer never emits, `dflash.data.mask_token`), else the last embedding
    row; it must index the embedding."""
    mask = (cfg.mask_token_id if cfg.mask_token_id is not None
            else default if default is not None else vocab_size - 1)
    if not 0 <= int(mask) < vocab_size:
        raise ConfigError(f"model.drafter.mask_token_id={mask} is outside the target's "
                          f"embedding of {vocab_size} rows")
    return int(mask)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (HF 'rotate_half' layout). x [B, heads, T, D], pos [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # [B, T, D/2]
    emb = torch.cat([ang, ang], dim=-1)[:, None]  # [B, 1, T, D]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.s = s
        bias = s.attention_bias
        self.q_proj = nn.Linear(s.hidden_size, s.num_heads * s.head_dim, bias=bias)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=bias)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=bias)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=bias)
        self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)

    def _heads(self, x, n):
        b, t, _ = x.shape
        return x.view(b, t, n, self.s.head_dim).transpose(1, 2)

    def forward(self, h, ctx, q_pos, kv_pos, mask):
        s = self.s
        kv_in = torch.cat([ctx, h], dim=1)
        q = rope(self.q_norm(self._heads(self.q_proj(h), s.num_heads)), q_pos, s.rope_theta)
        k = rope(self.k_norm(self._heads(self.k_proj(kv_in), s.num_kv_heads)), kv_pos, s.rope_theta)
        v = self._heads(self.v_proj(kv_in), s.num_kv_heads)
        # q and k pass through fp32 norms; under autocast v is already bf16: one dtype
        q, k = q.to(v.dtype), k.to(v.dtype)
        if isinstance(mask, ChunkedMask):
            out = chunked_attention(q, k, v, mask)
        elif isinstance(mask, torch.Tensor):
            rep = s.num_heads // s.num_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        else:  # a flex_attention BlockMask: only the visible tiles are computed
            out = flex_attention_fn(q.device)(q, k, v, block_mask=mask, enable_gqa=True)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.mlp = MLP(s)

    def forward(self, h, ctx, q_pos, kv_pos, mask):
        h = h + self.self_attn(self.input_layernorm(h), ctx, q_pos, kv_pos, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


_FLEX = {}


def flex_attention_fn(device: torch.device):
    """Compiled flex_attention on GPU (fused kernel); eager on CPU, where it is only
    used to check the mask against the dense SDPA path. Inside a compiled drafter
    (`model.compile`) the plain op is returned: dynamo captures it in the graph."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda" or torch.compiler.is_compiling():
        import warnings
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention
    if "cuda" not in _FLEX:
        # static shapes: the shape set is closed and warmed (dflash.warmup.shapes), and
        # dflash.warmup.run raises dynamo's recompile limit to its size
        _FLEX["cuda"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["cuda"]


MASKS = {"sdpa": block_mask, "flex": flex_block_mask, "chunked": chunked_block_mask}
ATTENTION_BACKENDS = ("auto", *MASKS)


class DFlashDrafter(nn.Module):
    def __init__(self, spec: DrafterSpec):
        super().__init__()
        self.spec = spec
        n_ctx = len(spec.target_layer_ids)
        self.fc = nn.Linear(n_ctx * spec.hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        # DSpark's heads, only where asked (rank 0 builds exactly DFlash's parameters)
        r = spec.markov_rank
        self.markov_head = (MarkovHead(spec.vocab_size, r, spec.draft_rows or spec.vocab_size)
                            if r else None)
        self.confidence_head = ConfidenceHead(spec.hidden_size, r) if spec.confidence_head else None
        self.draft_head = None  # an exported draft vocabulary's head, set where one loads
        # sdpa: one dense boolean mask; flex: BlockMask; chunked: SDPA per chunk of blocks
        # over the context they can see (eager only); auto: flex on CUDA, chunked on CPU,
        # sdpa on CPU under torch.compile (static shapes). A runtime choice, not a
        # checkpoint setting (dflash.model.masks).
        self.attention = "auto"

    def set_attention(self, backend: str) -> None:
        if backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"model.attention must be one of {ATTENTION_BACKENDS}, got {backend!r}")
        self.attention = backend

    def backend(self, device: torch.device) -> str:
        """The mask form this forward uses on `device`."""
        if self.attention != "auto":
            return self.attention
        if device.type == "cuda":
            return "flex"
        return "sdpa" if torch.compiler.is_compiling() else "chunked"

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(target_hidden))

    def forward(self, target_hidden, ctx_valid, anchors, anchor_valid, block_embeds,
                position_ids=None):
        """Final-normed hidden states of every block position: [B, A, bs, H].

        target_hidden [B, S, n*H]; ctx_valid [B, S] bool; anchors [B, A] positions;
        anchor_valid [B, A] bool; block_embeds [B, A, bs, H] (anchor + mask embeddings);
        position_ids [B, S] (packed rows: each token's position in its own document, so
        rope restarts per document and a block sees only its anchor's document; None:
        one document per row).
        """
        bs = self.spec.block_size
        b, a = anchors.shape
        s = target_hidden.shape[1]
        if not torch.is_autocast_enabled(target_hidden.device.type):
            # a bf16 target feeding fp32 master weights: compute in the drafter's dtype
            # (under autocast the matmuls pick their own precision)
            dtype = self.fc.weight.dtype
            target_hidden, block_embeds = target_hidden.to(dtype), block_embeds.to(dtype)
        ctx = self.project_context(target_hidden)
        h = block_embeds.reshape(b, a * bs, -1)
        offs = torch.arange(bs, device=anchors.device)
        if position_ids is None:  # (in decoding an anchor may sit just past the context)
            ctx_pos, anchor_pos = torch.arange(s, device=anchors.device).expand(b, s), anchors
        else:
            ctx_pos, anchor_pos = position_ids, torch.gather(position_ids, 1, anchors)
        q_pos = (anchor_pos[:, :, None] + offs).reshape(b, a * bs)
        kv_pos = torch.cat([ctx_pos, q_pos], dim=1)
        # where the anchor's document starts (documents are contiguous in a row)
        ctx_lo = None if position_ids is None else anchors - anchor_pos
        make = MASKS[self.backend(anchors.device)]
        windows = self.spec.windows()  # one mask per distinct layer kind
        masks = {w: make(anchors, anchor_valid, ctx_valid, bs, ctx_lo, w, self.spec.causal)
                 for w in dict.fromkeys(windows)}
        for layer, w in zip(self.layers, windows):
            h = layer(h, ctx, q_pos, kv_pos, masks[w])
        return self.norm(h).view(b, a, bs, -1)
