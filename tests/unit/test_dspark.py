"""DSpark's heads, objective, layouts and export against plain-torch references."""
import json

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from dflash.config import DrafterConfig, TargetConfig
from dflash.errors import ConfigError, DataError
from dflash.decode import DrafterProposer, speculative_decode
from dflash.model.checkpoint import check_compatible, load_drafter, save_drafter
from dflash.model.draft_head import save_draft_head
from dflash.model.draft_vocab import DraftVocab
from dflash.model.drafter import DFlashDrafter, DrafterSpec
from dflash.model.dspark import check_heads_objective, markov_chain
from dflash.model.dspark_loss import dspark_rows, slot_weights
from dflash.model.loss import Objective, drafter_loss, sample_anchors
from dflash.model.target import Target


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return Target.from_config(OmegaConf.structured(TargetConfig()))


def _drafter(target, seed=0, **kw):
    torch.manual_seed(seed)
    d = DFlashDrafter(DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig(**kw))))
    if d.markov_head is not None:  # W2 starts at zero: give it a bias to test
        torch.nn.init.normal_(d.markov_head.markov_w2.weight, std=0.5)
    return d


def test_rank_zero_is_plain_dflash_parameter_for_parameter(target):
    plain, zero = _drafter(target), _drafter(target, markov_rank=0, sample_from_anchor=False)
    a, b = plain.state_dict(), zero.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert plain.markov_head is None and plain.confidence_head is None


def test_markov_chain_equals_a_plain_loop_with_argmax_feedback():
    torch.manual_seed(1)
    v, r, n = 40, 8, 5
    from dflash.model.dspark import MarkovHead
    head = MarkovHead(v, r, v)
    torch.nn.init.normal_(head.markov_w2.weight)
    base, anchor = torch.randn(3, n, v), torch.tensor([3, 7, 11])
    got, prev = markov_chain(base, anchor, head, v)
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    for b in range(3):
        p = int(anchor[b])
        for j in range(n):
            want = base[b, j] + w2 @ w1[p]  # W2 W1[prev] on the backbone's logits
            torch.testing.assert_close(got[b, j], want)
            assert int(prev[b, j]) == p
            p = int(want.argmax())
    # a draft vocabulary: W2's rows scatter to their ids, 0 bias elsewhere
    ids = torch.tensor([1, 4, 9, 30])
    small = MarkovHead(v, r, len(ids))
    torch.nn.init.normal_(small.markov_w2.weight)
    small.ids = ids
    full = small.full(torch.tensor([5]), v)[0]
    assert torch.equal(full[ids], small(torch.tensor([5]))[0])
    assert int((full != 0).sum()) == len(ids)


def _direct(h, t, prev, y, sup, w1, w2, conf_w, conf_b, head, gamma, weights):
    """DeepSpec's loss written out in full, one dense tensor per term."""
    z = h @ head.T + (w1[prev] @ w2.T)
    pd, pt = z.softmax(-1), (t @ head.T).softmax(-1)
    l1 = (pd - pt).abs().sum(-1)
    ce = F.cross_entropy(z.flatten(0, -2), y.flatten(), reduction="none").view_as(l1)
    c = torch.cat([h, w1[prev]], -1) @ conf_w.T + conf_b
    a = (1 - 0.5 * l1.detach()).clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(c.squeeze(-1), a, reduction="none")
    n = h.shape[-2]
    w = torch.exp(-torch.arange(n) / gamma) * torch.cumprod(sup.long(), -1)
    return (weights[0] * (w * ce).sum() + weights[1] * (w * l1).sum()
            + weights[2] * (w * bce).sum()) / w.sum()


@pytest.mark.parametrize("anchor_first", [False, True])
def test_dspark_loss_equals_the_direct_computation(target, anchor_first):
    d = _drafter(target, markov_rank=8, confidence_head=True, sample_from_anchor=anchor_first,
                 block_size=4)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 500, (2, 24), generator=g)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, 20:] = False
    mask = (torch.arange(24)[None] >= 4) & valid
    anchors = sample_anchors(mask, valid, 6, torch.Generator().manual_seed(4))
    ctx = target.context(ids, valid.long(), final=True)
    ob = Objective(6, gamma=4.0, kind="dspark", norm="batch")
    out = drafter_loss(d, ctx, target.embed_tokens, target.lm_head_weight, ids, mask, valid, ob,
                       anchors=anchors)
    # the same from scratch: the drafting slots, their tokens and the target's states
    n_ctx = ctx.shape[-1] - target.hidden_size
    first = 0 if anchor_first else 1
    from dflash.model.loss import block_embeddings
    emb = block_embeddings(target.embed_tokens, ids, anchors[0], 4, d.spec.mask_token_id)
    h = d(ctx[..., :n_ctx], valid, anchors[0], anchors[1], emb)[:, :, first:]
    n = 4 - first
    pos = anchors[0][:, :, None] + torch.arange(n)  # the token before each slot's
    inside = pos + 1 < 24
    posc = pos.clamp(max=23)
    gather = lambda x: torch.gather(x, 1, posc.flatten(1)).view_as(posc)  # noqa: E731
    y = torch.gather(ids, 1, (pos + 1).clamp(max=23).flatten(1)).view_as(pos)
    sup = inside & torch.gather(mask, 1, (pos + 1).clamp(max=23).flatten(1)).view_as(pos) \
        & anchors[1][:, :, None]
    t = torch.gather(ctx[..., n_ctx:], 1, posc.flatten(1)[..., None].expand(-1, -1, 64)
                     ).view(*pos.shape, 64)
    want = _direct(h, t, gather(ids), y * sup, sup, d.markov_head.markov_w1.weight,
                   d.markov_head.markov_w2.weight, d.confidence_head.proj.weight,
                   d.confidence_head.proj.bias, target.lm_head_weight, 4.0, (0.1, 0.9, 1.0))
    torch.testing.assert_close(out.loss, want, rtol=1e-5, atol=1e-6)


def test_chunked_rows_equal_one_chunk_with_gradients():
    torch.manual_seed(3)
    h, t = torch.randn(10, 16, requires_grad=True), torch.randn(10, 16)
    w1p, head, w2 = torch.randn(10, 4), torch.randn(50, 16), torch.randn(50, 4, requires_grad=True)
    y, inside = torch.randint(0, 50, (10,)), torch.ones(10)
    outs = []
    for mb in (1e-3, 256):  # one row a chunk (checkpointed), then all rows at once
        ce, l1, arg = dspark_rows(h, t, w1p, head, w2, y, inside, mb)
        gh, gw = torch.autograd.grad((ce + l1).sum(), (h, w2))
        outs.append((ce, l1, arg, gh, gw))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)


def test_slot_weights_decay_and_stop_at_the_first_gap():
    sup = torch.tensor([[True, True, False, True]])
    w = slot_weights(4, 4.0, sup)
    torch.testing.assert_close(w, torch.tensor([[1.0, torch.exp(torch.tensor(-0.25)), 0, 0]]))


def test_heads_are_refused_where_they_cannot_train_or_load(target):
    with pytest.raises(ConfigError, match="confidence_head needs model.drafter.markov_rank"):
        _drafter(target, confidence_head=True)
    with pytest.raises(ConfigError, match="markov_rank=-1: a rank is 0"):
        _drafter(target, markov_rank=-1)
    spec = _drafter(target, markov_rank=8).spec
    with pytest.raises(ConfigError, match="trains with loss=dspark"):
        check_heads_objective(spec, "ce")
    with pytest.raises(ConfigError, match="no confidence head"):
        DrafterProposer(_drafter(target, markov_rank=8), target, confidence_stop=0.5)


@pytest.mark.parametrize("kw", [dict(markov_rank=8, confidence_head=True),
                                dict(markov_rank=8, confidence_head=True, sample_from_anchor=True),
                                dict(sample_from_anchor=True)])
def test_export_states_the_layout_and_loads_back_equal(tmp_path, target, kw):
    d = _drafter(target, **kw)
    save_drafter(d, tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["sample_from_anchor"] is bool(kw.get("sample_from_anchor", False))
    assert cfg["architectures"] == ["DSparkDraftModel"] and cfg["markov_head_type"] == "vanilla"
    from safetensors.torch import load_file
    w = load_file(str(tmp_path / "d" / "model.safetensors"))
    r = kw.get("markov_rank") or 1  # plain anchor-first: a zero rank-1 head for llama.cpp
    assert tuple(w["markov_head.markov_w1.weight"].shape) == (target.vocab_size, r)
    assert tuple(w["markov_head.markov_w2.weight"].shape) == (target.vocab_size, r)
    assert "embed_tokens.weight" not in w and "lm_head.weight" not in w  # the target's
    if kw.get("confidence_head"):
        assert tuple(w["confidence_head.proj.weight"].shape) == (1, target.hidden_size + r)
    back = load_drafter(tmp_path / "d")
    check_compatible(back.spec, d.spec, "here")
    a, b = d.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(DataError, match="markov_rank"):
        check_compatible(back.spec, _drafter(target, markov_rank=4,
                                             sample_from_anchor=d.spec.sample_from_anchor).spec, "x")


def test_draft_vocabulary_w2_rows_scatter_on_export_and_gather_in_the_draft_head(tmp_path, target):
    spec = DrafterSpec.from_target(target, OmegaConf.structured(DrafterConfig(markov_rank=4)))
    import dataclasses
    torch.manual_seed(0)
    d = DFlashDrafter(dataclasses.replace(spec, draft_rows=6))
    torch.nn.init.normal_(d.markov_head.markov_w2.weight)
    vocab = DraftVocab.most_frequent(torch.arange(512).numpy(), 6)
    d.markov_head.ids = vocab.ids
    save_drafter(d, tmp_path / "full")
    from safetensors.torch import load_file
    w2 = load_file(str(tmp_path / "full" / "model.safetensors"))["markov_head.markov_w2.weight"]
    assert torch.equal(w2[vocab.ids], d.markov_head.markov_w2.weight.detach())
    assert int(w2.abs().sum(1).ne(0).sum()) == 6
    save_draft_head(tmp_path / "full", tmp_path / "small", vocab.ids.tolist(), target.lm_head_weight)
    small = load_drafter(tmp_path / "small")
    assert torch.equal(small.markov_head.markov_w2.weight, d.markov_head.markov_w2.weight.detach())
    assert torch.equal(small.markov_head.ids, vocab.ids)


@pytest.mark.parametrize("kw,stop", [(dict(markov_rank=8, confidence_head=True), 0.0),
                                     (dict(markov_rank=8, confidence_head=True,
                                           sample_from_anchor=True), 0.0),
                                     (dict(markov_rank=8, confidence_head=True), 0.5),
                                     (dict(markov_rank=8, confidence_head=True), 1.01)])
def test_dspark_decoding_is_lossless_and_the_confidence_stop_caps_drafts(target, kw, stop):
    d = _drafter(target, **kw).eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 9, 7)]
    res = speculative_decode(target, DrafterProposer(d, target, confidence_stop=stop), prompts, 24)
    for p, toks in zip(prompts, res.tokens):
        ref = target.lm.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False,
                                 attention_mask=torch.ones(1, len(p), dtype=torch.long))
        assert toks == ref[0, len(p):].tolist()
    assert len(res.histogram) == d.spec.block_size + bool(kw.get("sample_from_anchor"))
    if stop > 1:  # nothing is ever confident enough: one token a step, the target's
        assert all(a == 1 for row in res.accept_lengths for a in row)


def test_another_drafter_is_a_baseline_of_the_same_prompts(tmp_path, target):
    from dflash.eval.baselines import build_baseline
    dspark, plain = _drafter(target, markov_rank=8), _drafter(target, seed=1)
    save_drafter(plain, tmp_path / "plain")
    p = build_baseline(f"drafter:{tmp_path / 'plain'}", dspark, target)
    assert isinstance(p, DrafterProposer) and p.drafter.markov_head is None
    import dataclasses
    other = DFlashDrafter(dataclasses.replace(plain.spec, target_layer_ids=[0, 1, 2]))
    save_drafter(other, tmp_path / "other")
    with pytest.raises(ConfigError, match="an A/B shares one target context"):
        build_baseline(f"drafter:{tmp_path / 'other'}", dspark, target)
    # a config that disagrees with its tensors: one line, not load_state_dict's traceback
    cfg = json.loads((tmp_path / "plain" / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 2]
    (tmp_path / "plain" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match="does not match its config.json: size mismatch for fc"):
        load_drafter(tmp_path / "plain")


@pytest.mark.parametrize("kw,kind,drafts", [({}, "draft-dflash", 15),
                                             (dict(markov_rank=8), "draft-dspark", 15),
                                             (dict(markov_rank=8, sample_from_anchor=True),
                                              "draft-dspark", 16),
                                             (dict(sample_from_anchor=True), "draft-dspark", 16)])
def test_llama_server_is_asked_for_the_mode_and_draft_count_the_export_states(target, kw, kind, drafts):
    from dflash.recipe.llama_cpp import dflash_args
    from dflash.model.checkpoint import drafter_config_dict
    cfg = drafter_config_dict(_drafter(target, **kw).spec)
    args = dflash_args("d.gguf", cfg, confidence_stop=0.6)
    assert args[args.index("--spec-type") + 1] == kind
    assert args[args.index("--spec-draft-n-max") + 1] == drafts
    assert args[args.index("--spec-draft-p-min") + 1] == 0.6
    assert "--spec-draft-p-min" not in dflash_args("d.gguf", cfg)


def test_calibration_counts_the_trials_the_streaks_imply(target):
    import numpy as np
    from dflash.eval.calibration import confidence_calibration, format_calibration
    from dflash.eval.teacher_forced import continuation_streaks
    d = _drafter(target, markov_rank=8, confidence_head=True).eval()
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (20, 26)]
    firsts = [5, 9]
    cal = confidence_calibration(target, d, seqs, firsts)
    streaks = np.concatenate(continuation_streaks(target, d, seqs, firsts))
    per = cal["per_slot"]
    assert len(per) == d.spec.block_size - 1 and cal["trials"] == sum(r["trials"] for r in per)
    for k, r in enumerate(per):  # a trial at slot k+1: every earlier draft right
        # slot 1: every block; later slots: the blocks right so far, less those whose
        # slot runs past the continuation's end
        assert (r["trials"] == len(streaks)) if k == 0 else (r["trials"] <= int((streaks >= k).sum()))
        if r["trials"]:
            assert r["observed"] == pytest.approx(float((streaks >= k + 1).sum()) / r["trials"])
            assert 0 <= r["predicted"] <= 1
    assert "calibration over" in format_calibration(cal)
    assert confidence_calibration(target, _drafter(target), seqs, firsts) == {}


def test_regenerate_drafts_with_the_confidence_stop_it_is_given(target):
    from dflash.config import compose
    from dflash.decode.local import LocalBackend
    cfg = compose("regenerate", ["out=x.jsonl", "confidence_stop=0.5"])
    d = _drafter(target, markov_rank=8, confidence_head=True)
    backend = LocalBackend.from_config(cfg, target, [2], drafter=d)
    assert backend.proposer.confidence_stop == 0.5 and backend.proposer.drafter is d
    with pytest.raises(ConfigError, match="no confidence head"):
        LocalBackend.from_config(cfg, target, [2], drafter=_drafter(target))
