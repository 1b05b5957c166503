"""The asynchronous target -> drafter pipeline.

    prefetch thread   plan Batch -> padded host tensors (pinned, reused buffers on GPU)
    target thread     host -> target device, frozen target forward (its own CUDA stream),
                      context -> drafter device (non-blocking), into a bounded queue
    main thread       drafter forward / backward / update (the caller's loop)

While the drafter trains on batch t the target computes the context of batch t+1..t+depth,
so a step costs max(target, drafter) rather than their sum. `depth=0` is the plain
sequential loop (collate, target, drafter in one thread), the default where both stages
share the CPU's cores; a depth set there gives each stage thread its share of the cores. Batches come
out in plan order whatever the depth: the queues are FIFO and each stage has one thread.

Every item carries its stage timings (seconds): `data_wait` (target stage waiting for
the prefetcher), `target` (target stage busy), `target_wait` (target stage blocked on a
full queue: the drafter is the bottleneck), `drafter_wait` (drafter waiting for a context:
the target is the bottleneck). The trainer adds `drafter` (busy) and logs their sums.
"""
from __future__ import annotations

import queue
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Optional

import torch

from dflash.step import DeviceBatch
from dflash.errors import ConfigError

_DONE = object()


@dataclass
class Item:
    batch: object  # the plan's Batch
    shape: object  # the Shape it runs at
    device_batch: DeviceBatch
    context: torch.Tensor
    times: dict = field(default_factory=dict)


def _device_batch(batch, shape, tensors) -> DeviceBatch:
    ids, mask, valid, *pos = tensors
    return DeviceBatch(batch, ids, mask, valid, shape, pos[0] if pos else None)


class HostBuffers:
    """Padded host tensors per shape, reused; pinned on CUDA so copies are asynchronous.
    A buffer goes back to the pool once the copy that read it has completed."""

    def __init__(self, pin: bool, per_shape: int):
        self.pin, self.per_shape = pin, per_shape
        self.free: dict = {}
        self.lock = threading.Lock()

    def fill(self, dataset, batch, shape):
        """(ids, loss mask, valid) host tensors, and position ids for a packed batch."""
        arrays = dataset.collate_batch(batch, shape.batch_size, shape.seq_len)
        key = (shape, len(arrays))
        with self.lock:
            pool = self.free.setdefault(key, [])
            bufs = pool.pop() if pool else None
        if bufs is None:
            make = lambda dt: torch.zeros(shape.batch_size, shape.seq_len, dtype=dt,  # noqa: E731
                                          pin_memory=self.pin)
            bufs = tuple(make(dt) for dt in (torch.int64, torch.bool, torch.bool, torch.int64)
                         [:len(arrays)])
        else:
            *bufs, event = bufs
            if event is not None:
                event.synchronize()  # the copy that last read this buffer is done
            for t in bufs:
                t.zero_()
        n = len(arrays[0])
        for t, a in zip(bufs, arrays):
            t[:n].numpy()[:] = a
        return bufs

    def release(self, shape, bufs, event) -> None:
        if not self.pin:  # on the CPU the "device" tensors are these buffers: never reuse
            return
        with self.lock:
            pool = self.free.setdefault((shape, len(bufs)), [])
            if len(pool) < self.per_shape:
                pool.append((*bufs, event))


def _shared_cpu(target_device: torch.device, drafter_device: torch.device) -> bool:
    return target_device.type == "cpu" and drafter_device.type == "cpu"


def default_depth(target_device: torch.device, drafter_device: torch.device) -> int:
    """`pipeline.depth=null`: overlap the stages only where they do not share CPU cores."""
    return 0 if _shared_cpu(target_device, drafter_device) else 2


class Pipeline:
    def __init__(self, step, dataset, shapes, target_device, drafter_device,
                 depth: int | None = None, prefetch: int = 2):
        depth = default_depth(target_device, drafter_device) if depth is None else int(depth)
        if depth < 0 or prefetch < 0:
            raise ConfigError(f"pipeline.depth and pipeline.prefetch must be >= 0, got {depth}, {prefetch}")
        self.step, self.dataset, self.shapes = step, dataset, shapes
        self.target_device, self.drafter_device = target_device, drafter_device
        self.depth, self.prefetch = depth, int(prefetch)
        # both stages on the CPU: each thread's intra-op pool gets its share of the cores,
        # or the two pools (each as wide as the machine) thrash each other
        cores = torch.get_num_threads()
        self.split_cores = ((cores - cores // 2, max(1, cores // 2))
                            if depth and _shared_cpu(target_device, drafter_device) else None)
        cuda = target_device.type == "cuda"
        self.buffers = HostBuffers(pin=cuda, per_shape=self.depth + self.prefetch + 2)
        self.stream = torch.cuda.Stream(target_device) if cuda and self.depth else None

    # ---- the two stages ----------------------------------------------------------------
    def _host(self, batch):
        shape = self.shapes.for_batch(batch)
        return batch, shape, self.buffers.fill(self.dataset, batch, shape)

    def _target(self, batch, shape, bufs) -> Item:
        """Host tensors -> device, target forward, context -> drafter device."""
        t0 = time.perf_counter()
        stream = self.stream
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            moved = [t.to(self.target_device, non_blocking=True) for t in bufs]
            b = _device_batch(batch, shape, moved)
            ctx = self.step.context(b).to(self.drafter_device, non_blocking=True)
            if self.target_device != self.drafter_device:
                b = _device_batch(batch, shape, [t.to(self.drafter_device, non_blocking=True)
                                                 for t in moved])
            event = None
            if stream is not None:
                event = torch.cuda.Event()
                event.record(stream)
                event.synchronize()  # this thread only: the target's busy time is real
            elif self.target_device.type == "cuda":
                event = torch.cuda.Event()
                event.record()
        self.buffers.release(shape, bufs, event)
        return Item(batch, shape, b, ctx, {"target": time.perf_counter() - t0})

    def _consume(self, item: Item) -> Item:
        """The target thread waited for its item's event, so the data is there; the
        allocator must still learn that the side stream's tensors are now used by the
        drafter's stream (or it could hand their memory out again too early)."""
        if self.stream is not None:
            cur = torch.cuda.current_stream(self.drafter_device)
            db = item.device_batch
            for t in (item.context, db.ids, db.loss_mask, db.valid, db.position_ids):
                if t is not None:
                    t.record_stream(cur)
        return item

    # ---- driving -----------------------------------------------------------------------
    def run(self, batches):
        """Items in plan order. Close the generator (or break out of the loop) to stop."""
        if self.depth == 0:
            for batch in batches:
                t0 = time.perf_counter()
                host = self._host(batch)
                data = time.perf_counter() - t0
                item = self._target(*host)
                item.times.update(data_wait=data, target_wait=0.0, drafter_wait=0.0)
                yield item
            return
        yield from self._threaded(batches)

    def _threaded(self, batches):
        stop = threading.Event()
        host, ctx = _Channel(max(1, self.prefetch), stop), _Channel(self.depth, stop)
        threads = [_stage("dflash-prefetch", lambda: self._prefetch_stage(batches, host, stop), host),
                   _stage("dflash-target", lambda: self._target_stage(host, ctx), ctx)]
        main_threads = torch.get_num_threads()
        if self.split_cores:  # the drafter runs in the caller's thread
            torch.set_num_threads(self.split_cores[0])
        for t in threads:
            t.start()
        try:
            while True:  # the drafter stage: the caller's loop
                t0 = time.perf_counter()
                item = ctx.get()
                if item is _DONE:
                    break
                item.times["drafter_wait"] = time.perf_counter() - t0
                yield self._consume(item)
        finally:
            stop.set()
            for ch in (host, ctx):  # unblock any put waiting on a full queue
                ch.drain()
            for t in threads:
                t.join(timeout=10)
            torch.set_num_threads(main_threads)

    def _prefetch_stage(self, batches, out: "_Channel", stop: threading.Event) -> None:
        """Plan batches -> padded host tensors, in plan order."""
        for batch in batches:
            if stop.is_set():
                return
            out.put(self._host(batch))

    def _target_stage(self, inp: "_Channel", out: "_Channel") -> None:
        """Host tensors -> target context on the drafter's device, in order."""
        if self.split_cores:
            torch.set_num_threads(self.split_cores[1])
        with torch.no_grad():
            t0 = time.perf_counter()
            while True:
                host = inp.get()
                if host is _DONE:
                    return
                wait = time.perf_counter() - t0
                item = self._target(*host)
                item.times["data_wait"] = wait
                item.times["target_wait"] = out.put(item)
                t0 = time.perf_counter()


class _Channel:
    """A bounded FIFO between two stages that gives up once the run stops. A stage's
    error travels through it and is raised in the stage that reads it."""

    def __init__(self, size: int, stop: threading.Event):
        self.q: queue.Queue = queue.Queue(maxsize=size)
        self.stop = stop

    def put(self, x) -> float:
        """Seconds blocked on a full queue (the reader is the bottleneck)."""
        t0 = time.perf_counter()
        while not self.stop.is_set():
            try:
                self.q.put(x, timeout=0.1)
                break
            except queue.Full:
                continue
        return time.perf_counter() - t0

    def get(self):
        """The next item, _DONE at the end (or once the run stops); a stage's error is
        raised here."""
        while not self.stop.is_set():
            try:
                item = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            return item
        return _DONE

    def drain(self) -> None:
        while not self.q.empty():
            self.q.get_nowait()


def _stage(name: str, body, out: _Channel) -> threading.Thread:
    """A stage thread: runs `body`, then closes `out` (its error first, if it raised)."""
    def run():
        try:
            body()
        except BaseException as exc:  # noqa: BLE001  (re-raised by the reader of `out`)
            out.put(exc)
        finally:
            out.put(_DONE)
    return threading.Thread(target=run, name=name, daemon=True)


class DrafterClock:
    """Drafter busy time: a host clock on the CPU; CUDA events on GPU (kernels run
    asynchronously), read only when the metrics are synchronised anyway."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pending: list = []

    def start(self):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, tick) -> float:
        if not self.cuda:
            return time.perf_counter() - tick
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.pending.append((tick, ev))
        return 0.0  # added at the next flush

    def collect(self) -> float:
        """Seconds of the steps timed on the device since the last call."""
        out = sum(a.elapsed_time(b) for a, b in self.pending) / 1000.0
        self.pending = []
        return out


class StageTimes:
    """Sums per-stage seconds between log syncs (host clocks: no device sync)."""

    KEYS = ("data_wait", "target", "target_wait", "drafter_wait", "drafter")

    def __init__(self):
        self.sums = dict.fromkeys(self.KEYS, 0.0)
        self.steps = 0

    def add(self, times: dict) -> None:
        for k in self.KEYS:
            self.sums[k] += float(times.get(k, 0.0))
        self.steps += 1

    def flush(self, clock: DrafterClock | None = None) -> dict:
        """Mean milliseconds per step of each stage since the last flush, and which
        stage limits the run (the other side is the one left waiting)."""
        if clock is not None and clock.cuda:
            self.sums["drafter"] += clock.collect()
        n = max(1, self.steps)
        out = {f"time_{k}_ms": 1000.0 * v / n for k, v in self.sums.items()}
        sm = self.sums
        waits = sm["drafter_wait"] + sm["target_wait"]
        slow_target = sm["drafter_wait"] > sm["target_wait"] if waits > 0 \
            else sm["target"] > sm["drafter"]  # sequential: nobody waits, compare busy times
        out["bottleneck"] = "target" if slow_target else "drafter"
        self.sums = dict.fromkeys(self.KEYS, 0.0)
        self.steps = 0
        return out


# ---- its config section (registered with Hydra by dflash.config) ----

@dataclass
class PipelineConfig:
    # contexts the target may run ahead of the drafter (a bounded queue); 0: the plain
    # sequential loop (collate, target, drafter in one thread). None: 2 where the target
    # has a GPU (its own, or a CUDA stream on a shared one), 0 where target and drafter
    # share the CPU's cores (a thread per stage would only split them; measured 2.2x
    # slower with both stages running all cores). A depth set on CPU splits the cores.
    depth: Optional[int] = None
    prefetch: int = 2  # batches collated ahead on the host (pinned buffers on GPU)
