"""Peak bytes of live tensor storage while a piece of work runs: `LiveBytes` follows
every op's outputs until their storage is freed (real or fake tensors alike), and
`MemTrackerPeak` wraps torch's MemTracker in the same interface (the reference it is
checked against on real tensors)."""
from __future__ import annotations

import torch


class LiveBytes:
    """Peak bytes of live tensor storage while it is entered: every op's outputs are
    counted from the op on (the storage once, whatever views share it) until their
    storage is freed. It sees what torch's MemTracker sees, op by op, at a fraction of
    its cost (MemTracker walks its whole table in Python on every op: ~1 ms an op, a
    minute for an 8B step). `held`: tensors alive before it (weights, optimizer state)."""

    def __init__(self, *held):
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._python_dispatch import TorchDispatchMode
        self._ref, self.live = StorageWeakRef, {}
        # what is held stays held while measured: counted once, never swept
        self.held = {self._ref(t.untyped_storage()).cdata: t.untyped_storage().nbytes()
                     for t in held}
        self.current = sum(self.held.values())
        self.peak = self.current
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        outer._add(t)
                # `current` still counts storages freed since the last sweep, so it is
                # an upper bound: only where it passes the peak is the exact figure needed
                if outer.current > outer.peak:
                    outer._sweep()
                    outer.peak = max(outer.peak, outer.current)
                return out
        self.mode = Mode()

    def _add(self, t) -> None:
        st = t.untyped_storage()
        ref = self._ref(st)
        if ref.cdata in self.held:
            return
        old = self.live.get(ref.cdata, (None, 0))[1]  # an op may grow a storage (out=, resize_)
        self.live[ref.cdata] = (ref, st.nbytes())
        self.current += st.nbytes() - old

    def _sweep(self) -> None:
        for key in [k for k, (r, _) in self.live.items() if r.expired()]:
            self.current -= self.live.pop(key)[1]

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


class MemTrackerPeak:
    """torch's MemTracker with LiveBytes' interface (the reference on real tensors)."""

    def __init__(self, *held):
        from torch.distributed._tools.mem_tracker import MemTracker

        class Tracker(MemTracker):
            # MemTracker hooks the gradient of every parameter of a module it enters,
            # which a frozen one refuses: only where a gradient can come (torch 2.13)
            def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
                grads = install_grad_hooks and all(p.requires_grad for p in module.parameters())
                return super()._track_module_params_and_buffers(module, install_grad_hooks=grads)
        self.tracker, self.peak = Tracker(), 0.0
        self.held = sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in held}.values())

    def __enter__(self):
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc):
        self.tracker.__exit__(*exc)
        snap = self.tracker.get_tracker_snapshot("peak")
        # MemTracker's peak counts the parameters (and optimizer state) of what it saw;
        # those are among `held`, counted once
        skip = ("param", "buffer", "optstate", "total")
        self.peak = self.held + max(sum(float(v) for k, v in d.items()
                                        if not any(w in str(k).lower() for w in skip))
                                    for d in snap.values())


def held_tensors(*objs) -> list:
    """Every tensor a module (parameters, buffers, gradients) or optimizer holds."""
    out = []
    for o in objs:
        if isinstance(o, torch.optim.Optimizer):
            out += [v for st in o.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        else:
            out += [*o.parameters(), *o.buffers()]
    return out
