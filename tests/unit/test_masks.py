"""The three mask forms (dflash/model/masks.py) give the same attention as the dense
reference: tile lists exact, flex and chunked outputs (and chunked gradients) equal."""
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from dflash.model.masks import block_mask, chunked_attention, chunked_block_mask, flex_block_mask


@pytest.mark.parametrize("b,s,a", [(2, 100, 13), (1, 256, 16), (3, 37, 5), (2, 300, 20)])
def test_tile_built_block_mask_equals_dense_mask(b, s, a):
    """Each 128x128 tile is listed as full exactly when every entry of the dense mask is
    visible there, as partial when some are, and not at all when none are."""
    g = torch.Generator().manual_seed(b * s + a)
    anchors = torch.sort(torch.randint(0, s, (b, a), generator=g), 1).values
    ok = torch.rand(b, a, generator=g) > 0.2
    valid = torch.rand(b, s, generator=g) > 0.1
    dense = block_mask(anchors, ok, valid, 16)
    bm = flex_block_mask(anchors, ok, valid, 16)
    q, kv = dense.shape[1:]
    t = 128
    nq, nk = -(-q // t), -(-kv // t)
    padded = torch.zeros(b, nq * t, nk * t, dtype=torch.bool)
    padded[:, :q, :kv] = dense
    tiles = padded.view(b, nq, t, nk, t)
    listed = torch.zeros(b, nq, nk, dtype=torch.bool)
    full = torch.zeros(b, nq, nk, dtype=torch.bool)
    for bi in range(b):
        for qi in range(nq):
            n, m = int(bm.kv_num_blocks[bi, 0, qi]), int(bm.full_kv_num_blocks[bi, 0, qi])
            listed[bi, qi, bm.kv_indices[bi, 0, qi, :n].long()] = True
            full[bi, qi, bm.full_kv_indices[bi, 0, qi, :m].long()] = True
    assert torch.equal(full, tiles.all((2, 4)))
    assert torch.equal(listed, tiles.any((2, 4)) & ~full)
    assert bm.seq_lengths == (q, kv)
    # and attention through it equals the dense path (mask_mod inside partial tiles)
    qt, k, v = torch.randn(b, 4, q, 16), torch.randn(b, 2, kv, 16), torch.randn(b, 2, kv, 16)
    out = flex_attention(qt, k, v, block_mask=bm, enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        qt, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=dense[:, None])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_flex_mask_with_documents_equals_the_dense_mask():
    g = torch.Generator().manual_seed(5)
    b, s, a = 2, 300, 20
    anchors = torch.sort(torch.randint(0, s, (b, a), generator=g), 1).values
    ok = torch.rand(b, a, generator=g) > 0.2
    valid = torch.rand(b, s, generator=g) > 0.1
    ctx_lo = (anchors - torch.randint(0, 60, (b, a), generator=g)).clamp(min=0)
    dense = block_mask(anchors, ok, valid, 16, ctx_lo)
    bm = flex_block_mask(anchors, ok, valid, 16, ctx_lo)
    q, kv = dense.shape[1:]
    qt, k, v = torch.randn(b, 2, q, 16), torch.randn(b, 2, kv, 16), torch.randn(b, 2, kv, 16)
    out = flex_attention(qt, k, v, block_mask=bm)
    ref = torch.nn.functional.scaled_dot_product_attention(qt, k, v, attn_mask=dense[:, None])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    # documents make tiles sparser: fewer listed tiles than without them
    plain = flex_block_mask(anchors, ok, valid, 16)
    listed = lambda m: int(m.kv_num_blocks.sum() + m.full_kv_num_blocks.sum())  # noqa: E731
    assert listed(bm) <= listed(plain)


def _case(seed, b, s, a, docs):
    """Sorted anchors with some invalid slots, padded context, and (docs) document starts."""
    g = torch.Generator().manual_seed(seed)
    anchors = torch.sort(torch.randint(0, s, (b, a), generator=g), 1).values
    ok = torch.rand(b, a, generator=g) > 0.2
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[0, s - s // 5:] = False  # a padded tail
    ctx_lo = None
    if docs:  # documents of random length: each anchor's document start
        bounds = torch.sort(torch.randint(0, s, (b, 4), generator=g), 1).values
        ctx_lo = torch.where(bounds[:, None, :] <= anchors[:, :, None], bounds[:, None, :],
                             0).amax(-1)
    return anchors, ok, valid, ctx_lo


@pytest.mark.parametrize("b,s,a,docs,per_chunk", [
    (2, 100, 13, False, 4), (3, 300, 40, True, 16), (1, 37, 5, True, 16),
    (2, 256, 33, True, 1), (4, 64, 20, False, 7)])
def test_chunked_attention_equals_the_dense_mask_with_gradients(b, s, a, docs, per_chunk):
    anchors, ok, valid, ctx_lo = _case(b * s + a, b, s, a, docs)
    dense = block_mask(anchors, ok, valid, 16, ctx_lo)
    chunked = chunked_block_mask(anchors, ok, valid, 16, ctx_lo, blocks_per_chunk=per_chunk)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, 4, a * 16, 8, generator=g, requires_grad=True)
    k = torch.randn(b, 2, s + a * 16, 8, generator=g, requires_grad=True)
    v = torch.randn(b, 2, s + a * 16, 8, generator=g, requires_grad=True)
    w = torch.randn(b, 4, a * 16, 8, generator=g)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=dense[:, None])
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    out = chunked_attention(q, k, v, chunked)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # the keys are only what the blocks can see: each chunk's window is the hull of the
    # context its blocks read (padding aside), not the whole row
    reach = block_mask(anchors, ok, torch.ones_like(valid), 16, ctx_lo)
    for c in chunked.chunks:
        assert int(c.keys.max()) < s if c.keys.numel() else True
        seen = reach[:, c.j0 * 16:c.j1 * 16, :s].any(1)  # [B, S]
        hull = [int(r.nonzero().max() - r.nonzero().min() + 1) if r.any() else 0 for r in seen]
        assert c.keys.shape[1] == max(hull)
        assert (c.keys[:, :1] <= seen.float().argmax(1, keepdim=True))[seen.any(1)].all()

def test_chunked_is_the_cpu_default_and_agrees_in_the_drafter():
    from omegaconf import OmegaConf

    from dflash.config import DrafterConfig, TargetConfig
    from dflash.model.drafter import DFlashDrafter, DrafterSpec
    from dflash.model.target import Target
    t = Target.from_config(OmegaConf.structured(TargetConfig))
    torch.manual_seed(0)
    d = DFlashDrafter(DrafterSpec.from_target(t, OmegaConf.structured(DrafterConfig(num_layers=2))))
    assert d.backend(torch.device("cpu")) == "chunked"
    assert d.backend(torch.device("cuda")) == "flex"
    anchors, ok, valid, _ = _case(3, 2, 90, 11, False)
    pos = torch.arange(90).repeat(2, 1)
    pos[1, 40:] -= 40  # row 1 packs two documents: [0, 40) and [40, 90)
    g = torch.Generator().manual_seed(2)
    ctx = torch.randn(2, 90, 3 * t.hidden_size, generator=g)
    emb = torch.randn(2, 11, 16, t.hidden_size, generator=g)
    outs, grads = {}, {}
    for backend in ("sdpa", "chunked"):
        d.set_attention(backend)
        d.zero_grad()
        outs[backend] = d(ctx, valid, anchors, ok, emb, pos)
        outs[backend][ok].square().mean().backward()
        grads[backend] = [p.grad.clone() for p in d.parameters()]
    torch.testing.assert_close(outs["chunked"], outs["sdpa"], rtol=1e-5, atol=1e-5)
    for got, want in zip(grads["chunked"], grads["sdpa"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


LAYOUTS = [(None, True), (40, False), (40, True), (8, True), (5, False)]  # (window, causal)


@pytest.mark.parametrize("window,causal", LAYOUTS)
def test_sliding_and_causal_masks_follow_the_public_formula(window, causal):
    """Query (block j, offset k) sees context ctx_lo <= p < a_j with
    p >= a_j + k - (W - 1), and its own block's k' with k' <= k (causal); inside the
    block |k - k'| < W (k - k' < W when causal), as the reference drafter's mask."""
    anchors, ok, valid, ctx_lo = _case(11, 2, 90, 7, True)
    dense = block_mask(anchors, ok, valid, 16, ctx_lo, window, causal)
    want = torch.zeros_like(dense)
    for bi in range(2):
        for j in range(7):
            for k in range(16):
                row = j * 16 + k
                for p in range(90):
                    want[bi, row, p] = bool(ok[bi, j] and valid[bi, p] and ctx_lo[bi, j] <= p
                                            < anchors[bi, j] and (window is None or
                                                                  p >= anchors[bi, j] + k - window + 1))
                for k2 in range(16):
                    d = k - k2
                    want[bi, row, 90 + j * 16 + k2] = ((not causal or d >= 0) and (
                        window is None or (d < window and (causal or -d < window))))
    assert torch.equal(dense, want)


@pytest.mark.parametrize("window,causal", LAYOUTS)
def test_flex_and_chunked_masks_equal_the_dense_one_under_windows_and_causality(window, causal):
    b, s, a = 2, 300, 20
    anchors, ok, valid, ctx_lo = _case(7, b, s, a, True)
    dense = block_mask(anchors, ok, valid, 16, ctx_lo, window, causal)
    bm = flex_block_mask(anchors, ok, valid, 16, ctx_lo, window, causal)
    q_len, kv = dense.shape[1:]
    t = 128  # tile lists exact: full where all visible, listed where some
    nq, nk = -(-q_len // t), -(-kv // t)
    padded = torch.zeros(b, nq * t, nk * t, dtype=torch.bool)
    padded[:, :q_len, :kv] = dense
    tiles = padded.view(b, nq, t, nk, t)
    for bi in range(b):
        for qi in range(nq):
            n, m = int(bm.kv_num_blocks[bi, 0, qi]), int(bm.full_kv_num_blocks[bi, 0, qi])
            full = set(bm.full_kv_indices[bi, 0, qi, :m].tolist())
            listed = set(bm.kv_indices[bi, 0, qi, :n].tolist())
            assert full <= set(torch.nonzero(tiles[bi, qi].all((0, 2))).flatten().tolist())
            assert full | listed >= set(torch.nonzero(tiles[bi, qi].any((0, 2))).flatten().tolist())
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, 4, q_len, 8, generator=g, requires_grad=True)
    k = torch.randn(b, 2, kv, 8, generator=g, requires_grad=True)
    v = torch.randn(b, 2, kv, 8, generator=g, requires_grad=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=dense[:, None])
    flex = flex_attention(q.detach(), k.detach(), v.detach(), block_mask=bm, enable_gqa=True)
    torch.testing.assert_close(flex, ref.detach(), rtol=1e-4, atol=1e-5)  # (no CPU backward)
    chunked = chunked_block_mask(anchors, ok, valid, 16, ctx_lo, window, causal, blocks_per_chunk=6)
    out = chunked_attention(q, k, v, chunked)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    w = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad((out * w).sum(), (q, k, v)),
                         torch.autograd.grad((ref * w).sum(), (q, k, v))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if window is not None:  # a window narrows what a chunk reads
        wide = chunked_block_mask(anchors, ok, valid, 16, ctx_lo, blocks_per_chunk=6)
        assert sum(c.keys.shape[1] for c in chunked.chunks) <= sum(c.keys.shape[1] for c in wide.chunks)
