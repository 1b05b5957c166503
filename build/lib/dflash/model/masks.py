"""Who may attend to whom in the drafter, in the three forms its attention backends take.

A query at (block j, offset k) sees context position p when ctx_lo_j <= p < a_j and p is
valid, and every position of block j; nothing else (ctx_lo_j: the start of the anchor's
document in a packed row, else 0). `block_mask` writes that as one dense boolean
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


def block_mask(anchors: torch.Tensor, anchor_valid: torch.Tensor, ctx_valid: torch.Tensor,
               block_size: int, ctx_lo: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean [B, A*bs, S + A*bs]: query (block j, pos k) may see context position p with
    ctx_lo_j <= p < a_j (and valid) and every position of block j; nothing else. ctx_lo
    is the start of the anchor's document in a packed row (None: 0). A padding block
    (invalid anchor) sees only itself, which keeps its softmax defined; its loss weight
    is 0."""
    b, a = anchors.shape
    s = ctx_valid.shape[1]
    p = torch.arange(s, device=anchors.device)
    ctx_ok = (p[None, None, :] < anchors[:, :, None]) & ctx_valid[:, None, :]
    if ctx_lo is not None:
        ctx_ok = ctx_ok & (p[None, None, :] >= ctx_lo[:, :, None])
    ctx_ok = ctx_ok & anchor_valid[:, :, None]  # [B, A, S]
    blk = torch.arange(a, device=anchors.device)
    same = (blk[:, None] == blk[None, :]).expand(b, a, a)
    ctx_part = ctx_ok.repeat_interleave(block_size, dim=1)  # [B, A*bs, S]
    blk_part = same.repeat_interleave(block_size, dim=1).repeat_interleave(block_size, dim=2)
    return torch.cat([ctx_part, blk_part], dim=2)


def _tile_counts(anchors, anchor_valid, ctx_valid, block_size, tile, ctx_lo=None):
    """Visible keys per (query block, key tile): [B, A, KV tiles], and each tile's width."""
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
    start = (torch.zeros_like(anchors) if ctx_lo is None else ctx_lo).clamp(max=s)[:, :, None]
    at = lambda x: torch.gather(prefix, 1, x.flatten(1)).view(b, a, n_kv)  # noqa: E731
    edge = lambda x: x.clamp(max=s)[None, None].expand(b, a, n_kv)  # noqa: E731
    # visible context keys of a tile: valid positions in [tile lo, tile hi) and in
    # [document start, anchor)
    ctx = (at(torch.minimum(cut, edge(hi))) - at(torch.maximum(start, edge(lo)))).clamp(min=0)
    ctx = ctx * anchor_valid[:, :, None]
    # own-block keys: [s + j*bs, s + (j+1)*bs) overlapped with each tile
    first = s + torch.arange(a, device=dev)[:, None] * block_size
    own = (torch.minimum(first + block_size, hi[None]) - torch.maximum(first, lo[None])).clamp(min=0)
    return ctx + own[None], hi - lo


def flex_block_mask(anchors, anchor_valid, ctx_valid, block_size, ctx_lo=None, tile: int = 128):
    """The same visibility as `block_mask`, as a flex_attention BlockMask built from tile
    counts: nothing of size [Q, KV] is ever made (an uncompiled `create_block_mask`
    evaluates the dense mask: +1 GB at 512 anchors x 3K context), and tiles whose every
    entry is visible are marked full so the kernel skips the mask there."""
    from torch.nn.attention.flex_attention import BlockMask

    if tile % block_size:
        raise ValueError(f"flex tile {tile} must be a multiple of the block size {block_size}")
    b, a = anchors.shape
    s = ctx_valid.shape[1]
    q_len, kv_len = a * block_size, s + a * block_size
    per_tile = tile // block_size
    n_q = -(-a // per_tile)
    counts, width = _tile_counts(anchors, anchor_valid, ctx_valid, block_size, tile, ctx_lo)
    lo_of = torch.zeros_like(anchors) if ctx_lo is None else ctx_lo
    pad = n_q * per_tile - a  # blocks past the last query row: they make a tile partial
    counts = torch.nn.functional.pad(counts, (0, 0, 0, pad), value=-1)
    counts = counts.view(b, n_q, per_tile, -1)
    full = (counts == width).all(2)  # [B, Qt, KVt]
    part = (counts > 0).any(2) & ~full

    def lists(m):  # tile indices, listed ones first (ascending), and their count
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return m.sum(-1, dtype=torch.int32)[:, None], idx[:, None]

    def mask_mod(bi, _h, q_idx, kv_idx):
        blk = (q_idx // block_size).clamp(max=a - 1)
        is_ctx = kv_idx < s
        ctx_ok = (is_ctx & (kv_idx < anchors[bi, blk]) & (kv_idx >= lo_of[bi, blk])
                  & anchor_valid[bi, blk] & ctx_valid[bi, kv_idx.clamp(max=s - 1)])
        same_blk = ~is_ctx & ((kv_idx - s) // block_size == blk)
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
                       blocks_per_chunk: int = 16) -> ChunkedMask:
    """The visibility of `block_mask`, cut into chunks of blocks. Anchors are sorted, so
    a chunk's blocks read one narrow window [earliest document start, latest anchor) of
    the context; only that window and the chunk's own blocks become keys. The window
    widths are data-dependent (one host sync a forward), so this runs eager only."""
    b, a = anchors.shape
    s = ctx_valid.shape[1]
    dev = anchors.device
    n = -(-a // blocks_per_chunk)
    pad = n * blocks_per_chunk - a
    lo = torch.zeros_like(anchors) if ctx_lo is None else ctx_lo
    # invalid anchors, and anchors at their document's start, read nothing: they widen
    # no window
    reads = anchor_valid & (anchors.clamp(max=s) > lo)
    start = F.pad(torch.where(reads, lo, s), (0, pad), value=s)
    end = F.pad(torch.where(reads, anchors.clamp(max=s), 0), (0, pad), value=0)
    start = start.view(b, n, blocks_per_chunk).amin(-1)
    end = end.view(b, n, blocks_per_chunk).amax(-1)
    width = (end - start).clamp(min=0).amax(0)  # [n]: one width per chunk, across rows
    start = torch.minimum(start, s - width[None]).clamp(min=0)  # keep every window inside
    widths = width.tolist()
    chunks = []
    for c, w in enumerate(widths):
        j0, j1 = c * blocks_per_chunk, min(a, (c + 1) * blocks_per_chunk)
        keys = start[:, c:c + 1] + torch.arange(w, device=dev)  # [B, W]
        an, lo_c = anchors[:, j0:j1, None], lo[:, j0:j1, None]
        ok = ((keys[:, None] < an) & (keys[:, None] >= lo_c)
              & torch.gather(ctx_valid, 1, keys)[:, None] & anchor_valid[:, j0:j1, None])
        nb = j1 - j0
        own = torch.eye(nb, dtype=torch.bool, device=dev).repeat_interleave(block_size, 1)
        mask = torch.cat([ok, own.expand(b, nb, nb * block_size)], 2)
        chunks.append(Chunk(j0, j1, keys, mask.repeat_interleave(block_size, 1)))
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
