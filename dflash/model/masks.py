"""Who may attend to whom in the drafter, in the three forms its attention backends take.

A query at (block j, offset k) sees context position p when ctx_lo_j <= p < a_j and p is
valid, and every position of block j; nothing else (ctx_lo_j: the start of the anchor's
document in a packed row, else 0). A sliding layer of window W also needs
p >= a_j + k - (W - 1) (the query sits at position a_j + k); a causal layer sees only
block offsets k' <= k; inside a block a window W < block size also bounds |k - k'|
(k - k' alone when causal), as the public reference drafter's mask does. `block_mask` writes that as one dense boolean
[B, A*bs, S + A*bs] (the reference; static shapes, so it compiles); `flex_block_mask`
as a flex_attention BlockMask built from tile counts (GPU: only visible tiles run);
`chunked_block_mask` as SDPA calls over chunks of blocks, each over just the context
window its blocks can see plus their own blocks (CPU eager: the cost follows the
documents and the anchors' positions, not rows x (A*bs)^2).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash.errors import ConfigError


def in_block(block_size: int, window: int | None = None, causal: bool = False,
             device=None) -> torch.Tensor:
    """[bs, bs] bool: which offsets k' of its own block a query at offset k sees."""
    k = torch.arange(block_size, device=device)
    d = k[:, None] - k[None, :]  # k - k'
    ok = d >= 0 if causal else torch.ones(block_size, block_size, dtype=torch.bool, device=device)
    if window is not None:
        ok = ok & (d < window) & (causal | (-d < window))
    return ok


def _own_blocks(n: int, own: torch.Tensor) -> torch.Tensor:
    """[n*bs, n*bs]: `own` on the diagonal blocks (a block sees only itself)."""
    bs = own.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=own.device)
    return (eye[:, None, :, None] & own[None, :, None, :]).reshape(n * bs, n * bs)


def _per_offset(ctx_ok: torch.Tensor, keys: torch.Tensor, anchors: torch.Tensor,
                block_size: int, window: int | None) -> torch.Tensor:
    """[B, A, K] context visibility -> [B, A*bs, K] rows, one per block offset; a window
    drops keys before a_j + k - (W - 1). keys [K] or [B, K] positions."""
    b, a, n = ctx_ok.shape
    if window is None:
        return ctx_ok.repeat_interleave(block_size, dim=1)
    k = torch.arange(block_size, device=anchors.device)
    keys = keys.view(-1, 1, 1, n) if keys.dim() == 2 else keys.view(1, 1, 1, n)
    near = keys >= anchors[:, :, None, None] + k[None, None, :, None] - (window - 1)
    return (ctx_ok[:, :, None, :] & near).reshape(b, a * block_size, n)


def block_mask(anchors: torch.Tensor, anchor_valid: torch.Tensor, ctx_valid: torch.Tensor,
               block_size: int, ctx_lo: torch.Tensor | None = None, window: int | None = None,
               causal: bool = False) -> torch.Tensor:
    """Boolean [B, A*bs, S + A*bs]: query (block j, pos k) may see context position p with
    ctx_lo_j <= p < a_j (and valid, and within `window`) and the positions of block j
    (k' <= k when `causal`); nothing else. ctx_lo is the start of the anchor's document
    in a packed row (None: 0). A padding block (invalid anchor) sees only itself, which
    keeps its softmax defined; its loss weight is 0."""
    b, a = anchors.shape
    s = ctx_valid.shape[1]
    p = torch.arange(s, device=anchors.device)
    ctx_ok = (p[None, None, :] < anchors[:, :, None]) & ctx_valid[:, None, :]
    if ctx_lo is not None:
        ctx_ok = ctx_ok & (p[None, None, :] >= ctx_lo[:, :, None])
    ctx_ok = ctx_ok & anchor_valid[:, :, None]  # [B, A, S]
    ctx_part = _per_offset(ctx_ok, p, anchors, block_size, window)  # [B, A*bs, S]
    own = in_block(block_size, window, causal, anchors.device)
    blk_part = _own_blocks(a, own).expand(b, a * block_size, a * block_size)
    return torch.cat([ctx_part, blk_part], dim=2)


def _tile_counts(anchors, anchor_valid, ctx_valid, block_size, tile, ctx_lo=None,
                 window=None, offset: int = 0, own_visible: bool = True):
    """Visible keys per (query block, key tile) for the query at block offset `offset`:
    [B, A, KV tiles], and each tile's width. `own_visible`: whether that query sees its
    whole block (counted as 0 otherwise, which keeps the tile from being full)."""
    b, a = anchors.shape
    s = ctx_valid.shape[1]
    kv_len = s + a * block_size
    n_kv = -(-kv_len // tile)
    dev = anchors.device
    lo = torch.arange(n_kv, device=dev) * tile
    hi = torch.clamp(lo + tile, max=kv_len)
    # context keys: valid positions p < anchor, counted from a prefix sum of ctx_valid
    prefix = torch.zeros(b, s + 1, dtype=torch.int64, device=dev)
    prefix[:, 1:] = ctx_valid.long().cumsum(1)
    cut = anchors.clamp(max=s)[:, :, None]  # [B, A, 1]
    start = torch.zeros_like(anchors) if ctx_lo is None else ctx_lo
    if window is not None:  # the query at a + offset reads from a + offset - (W - 1)
        start = torch.maximum(start, anchors + offset - (window - 1))
    start = start.clamp(min=0, max=s)[:, :, None]
    at = lambda x: torch.gather(prefix, 1, x.flatten(1)).view(b, a, n_kv)  # noqa: E731
    edge = lambda x: x.clamp(max=s)[None, None].expand(b, a, n_kv)  # noqa: E731
    # visible context keys of a tile: valid positions in [tile lo, tile hi) and in
    # [document start (or window start), anchor)
    ctx = (at(torch.minimum(cut, edge(hi))) - at(torch.maximum(start, edge(lo)))).clamp(min=0)
    ctx = ctx * anchor_valid[:, :, None]
    # own-block keys: [s + j*bs, s + (j+1)*bs) overlapped with each tile
    first = s + torch.arange(a, device=dev)[:, None] * block_size
    own = (torch.minimum(first + block_size, hi[None]) - torch.maximum(first, lo[None])).clamp(min=0)
    return ctx + own[None] * int(own_visible), hi - lo


FLEX_TILE = 128  # flex_attention's default block (tile) size


def check_flex_block_size(block_size: int, tile: int = FLEX_TILE) -> None:
    """A block must not straddle a flex tile: checked at start (a run on GPU would
    otherwise fail at its first step, after the target loaded)."""
    if tile % int(block_size):
        divisors = [d for d in (2, 4, 8, 16, 32, 64, 128) if tile % d == 0]
        raise ConfigError(f"model.drafter.block_size={block_size} does not divide flex "
                          f"attention's tile of {tile} (on GPU): use one of {divisors}, or "
                          "model.attention=sdpa")


def flex_block_mask(anchors, anchor_valid, ctx_valid, block_size, ctx_lo=None, window=None,
                    causal: bool = False, tile: int = FLEX_TILE):
    """The same visibility as `block_mask`, as a flex_attention BlockMask built from tile
    counts: nothing of size [Q, KV] is ever made (an uncompiled `create_block_mask`
    evaluates the dense mask: +1 GB at 512 anchors x 3K context), and tiles whose every
    entry is visible are marked full so the kernel skips the mask there. Under a window
    a tile is listed when the block's first query (the widest window) sees a key in it,
    and full only when its last query (the narrowest) sees every key."""
    from torch.nn.attention.flex_attention import BlockMask

    check_flex_block_size(block_size, tile)
    b, a = anchors.shape
    s = ctx_valid.shape[1]
    q_len, kv_len = a * block_size, s + a * block_size
    per_tile = tile // block_size
    n_q = -(-a // per_tile)
    args = (anchors, anchor_valid, ctx_valid, block_size, tile, ctx_lo, window)
    wide, width = _tile_counts(*args)
    own = in_block(block_size, window, causal, anchors.device)
    narrow = wide if window is None and not causal else _tile_counts(
        *args, offset=block_size - 1, own_visible=bool(own.all()))[0]
    lo_of = torch.zeros_like(anchors) if ctx_lo is None else ctx_lo
    pad = n_q * per_tile - a  # blocks past the last query row: they make a tile partial
    tiles = lambda c: torch.nn.functional.pad(c, (0, 0, 0, pad), value=-1).view(  # noqa: E731
        b, n_q, per_tile, -1)
    full = (tiles(narrow) == width).all(2)  # [B, Qt, KVt]
    part = (tiles(wide) > 0).any(2) & ~full

    def lists(m):  # tile indices, listed ones first (ascending), and their count
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return m.sum(-1, dtype=torch.int32)[:, None], idx[:, None]

    def mask_mod(bi, _h, q_idx, kv_idx):
        blk = (q_idx // block_size).clamp(max=a - 1)
        k = q_idx % block_size
        is_ctx = kv_idx < s
        ctx_ok = (is_ctx & (kv_idx < anchors[bi, blk]) & (kv_idx >= lo_of[bi, blk])
                  & anchor_valid[bi, blk] & ctx_valid[bi, kv_idx.clamp(max=s - 1)])
        same_blk = ~is_ctx & ((kv_idx - s) // block_size == blk)
        if window is not None:
            ctx_ok = ctx_ok & (kv_idx >= anchors[bi, blk] + k - (window - 1))
        if causal or window is not None:
            same_blk = same_blk & own[k, (kv_idx - s).clamp(min=0) % block_size]
        return ctx_ok | same_blk

    (kv_num, kv_idx), (full_num, full_idx) = lists(part), lists(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=tile,
                                    mask_mod=mask_mod, seq_lengths=(q_len, kv_len))


@dataclass
class Chunk:
    """Blocks [j0, j1) of every row: `keys` [B, W] the context positions they read (one
    window per row, the same width W across rows), `mask` [B, (j1-j0)*bs, W + (j1-j0)*bs]
    over [window ; own blocks]."""
    j0: int
    j1: int
    keys: torch.Tensor
    mask: torch.Tensor


@dataclass
class ChunkedMask:
    context_len: int
    block_size: int
    chunks: list


def chunked_block_mask(anchors, anchor_valid, ctx_valid, block_size, ctx_lo=None,
                       window=None, causal: bool = False,
                       blocks_per_chunk: int = 16) -> ChunkedMask:
    """The visibility of `block_mask`, cut into chunks of blocks. Anchors are sorted, so
    a chunk's blocks read one narrow window [earliest document (or sliding window)
    start, latest anchor) of the context; only that window and the chunk's own blocks
    become keys. The window widths are data-dependent (one host sync a forward), so this
    runs eager only."""
    b, a = anchors.shape
    s = ctx_valid.shape[1]
    dev = anchors.device
    n = -(-a // blocks_per_chunk)
    pad = n * blocks_per_chunk - a
    lo = torch.zeros_like(anchors) if ctx_lo is None else ctx_lo
    # where a block's first query starts reading (its last reads less under a window)
    first = lo if window is None else torch.maximum(lo, anchors - (window - 1))
    # invalid anchors, and anchors with nothing before them to read, widen no window
    reads = anchor_valid & (anchors.clamp(max=s) > first)
    start = F.pad(torch.where(reads, first, s), (0, pad), value=s)
    end = F.pad(torch.where(reads, anchors.clamp(max=s), 0), (0, pad), value=0)
    start = start.view(b, n, blocks_per_chunk).amin(-1)
    end = end.view(b, n, blocks_per_chunk).amax(-1)
    width = (end - start).clamp(min=0).amax(0)  # [n]: one width per chunk, across rows
    start = torch.minimum(start, s - width[None]).clamp(min=0)  # keep every window inside
    widths = width.tolist()
    own = in_block(block_size, window, causal, dev)
    chunks = []
    for c, w in enumerate(widths):
        j0, j1 = c * blocks_per_chunk, min(a, (c + 1) * blocks_per_chunk)
        keys = start[:, c:c + 1] + torch.arange(w, device=dev)  # [B, W]
        an, lo_c = anchors[:, j0:j1, None], lo[:, j0:j1, None]
        ok = ((keys[:, None] < an) & (keys[:, None] >= lo_c)
              & torch.gather(ctx_valid, 1, keys)[:, None] & anchor_valid[:, j0:j1, None])
        nb = j1 - j0
        ctx_rows = _per_offset(ok, keys, anchors[:, j0:j1], block_size, window)
        own_rows = _own_blocks(nb, own).expand(b, nb * block_size, nb * block_size)
        chunks.append(Chunk(j0, j1, keys, torch.cat([ctx_rows, own_rows], 2)))
    return ChunkedMask(s, block_size, chunks)


def chunked_attention(q, k, v, m: ChunkedMask) -> torch.Tensor:
    """SDPA per chunk. q [B, H, A*bs, D]; k, v [B, Hkv, S + A*bs, D] over [context ; blocks]."""
    s, bs = m.context_len, m.block_size
    b, hkv, _, d = k.shape
    k_ctx, v_ctx = k[:, :, :s], v[:, :, :s]
    outs = []
    for c in m.chunks:
        idx = c.keys[:, None, :, None].expand(b, hkv, c.keys.shape[1], d)
        own = slice(s + c.j0 * bs, s + c.j1 * bs)
        kc = torch.cat([torch.gather(k_ctx, 2, idx), k[:, :, own]], 2)
        vc = torch.cat([torch.gather(v_ctx, 2, idx), v[:, :, own]], 2)
        outs.append(F.scaled_dot_product_attention(
            q[:, :, c.j0 * bs:c.j1 * bs], kc, vc, attn_mask=c.mask[:, None],
            enable_gqa=q.shape[1] != hkv))
    return torch.cat(outs, 2)
