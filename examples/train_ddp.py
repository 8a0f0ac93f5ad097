"""Data-parallel training of a small MLP on npusim, with gradient all-reduce overlapping backward.

Run it with the launcher (rank 0 prints the progress and the summary):

    npurun --nproc-per-node 4 examples/train_ddp.py
    npurun --nproc-per-node 4 examples/train_ddp.py --steps 20 --check
    npurun --nproc-per-node 2 examples/train_ddp.py --steps 10 --profile /tmp/ddp_trace
    npurun --nproc-per-node 4 --max-restarts 3 examples/train_ddp.py --checkpoint-dir /tmp/ckpt

What it shows, the way torch DistributedDataParallel does it on a real NPU:

* every rank binds its NPU (``runtime.set_device(LOCAL_RANK)``) and joins the job's communicator
  (``hccl.init_comm()``); rank 0 initialises the parameters and broadcasts them;
* forward and backward are numpy kernels launched on a *compute stream*; each rank trains on its
  fixed slice of every global batch of a deterministic synthetic data set;
* gradients live in *buckets* filled in the order backward produces them (last layer first).
  As soon as backward has written a bucket, an event recorded on the compute stream makes the
  *communication stream* wait for it, and that bucket's all_reduce (SUM, then a 1/world scaling
  kernel) runs there while backward goes on with the earlier layers;
* the optimizer (SGD with momentum) waits on an event of the communication stream;
* timing events split the compute stream's time into computing and waiting for communication;
* with ``--checkpoint-dir DIR``, rank 0 saves the parameters, the momentum and the step every
  ``--checkpoint-every`` steps (atomically, see ``checkpoint.py``); a job started again (by
  ``npurun --max-restarts`` after a rank died, or by hand) resumes from the newest complete
  checkpoint and ends with the very parameters of a run that never stopped: the data order
  depends only on the seed and the step, so the step is the data position.

At the end rank 0 prints ``final params sha256: <hex>``, the digest of the final parameters
(bitwise identical on every rank): two runs that agree on it trained the same model.

``--check`` verifies at the end that every replica holds bitwise-identical parameters (an
all_gather of their digests) and that they match, within 1e-6 relative, the same model trained
in the rank-0 process over the full global batches without hccl. ``--profile DIR`` writes a
Chrome trace per rank (``DIR/trace_rank<RANK>.json``) and merges them into
``DIR/trace_merged.json`` (open it in https://ui.perfetto.dev).

Parameters are float64 so the data-parallel run and the single-process reference agree to far
better than 1e-6 although they sum the gradients in different orders.
"""
from __future__ import annotations

import functools
import hashlib
import io
import math
import os
import sys
import time

import numpy as np

import checkpoint
import hccl
import runtime
import training_args

DIM, CLASSES, CENTERS_PER_CLASS, CENTER_STD, NOISE_STD = 32, 10, 4, 1.2, 1.55
N_TRAIN, N_TEST = 65536, 4096
DEPTH = 4                      # hidden layers
DTYPE = np.float64
CHECK_RTOL = 1e-6


# ---------------------------------------------------------------------- data
def make_dataset(seed: int):
    """Gaussian blobs: each class is a mixture of a few blobs (not linearly separable)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, CENTER_STD, (CLASSES * CENTERS_PER_CLASS, DIM))
    owner = np.arange(CLASSES * CENTERS_PER_CLASS) % CLASSES
    n = N_TRAIN + N_TEST
    blob = rng.integers(0, len(centers), n)
    x = centers[blob] + rng.normal(0.0, NOISE_STD, (n, DIM))
    y = owner[blob].astype(np.int64)
    x = (x - x[:N_TRAIN].mean(0)) / x[:N_TRAIN].std(0)
    return x[:N_TRAIN].astype(DTYPE), y[:N_TRAIN], x[N_TRAIN:].astype(DTYPE), y[N_TRAIN:]


@functools.lru_cache(maxsize=2)
def _epoch_order(seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(N_TRAIN)


def global_batch(step: int, batch: int, seed: int) -> np.ndarray:
    """Row indices of global batch ``step``: a fixed permutation per epoch (same on every rank)."""
    epoch, k = divmod(step, N_TRAIN // batch)
    return _epoch_order(seed, epoch)[k * batch:(k + 1) * batch]


# ---------------------------------------------------------------------- the model
class Layout:
    """Where each parameter lives in the flat buffers, and the gradient buckets.

    The flat gradient buffer holds the gradients in the order backward produces them (last
    layer first; bias before weight, as DDP buckets reversed ``parameters()``), preceded by one
    slot for the local loss, which thus rides along in the first bucket's all_reduce and comes
    out as the global mean loss. The flat parameter (and momentum) buffer uses the same order,
    so the optimizer is one kernel over the whole model.
    """

    def __init__(self, hidden: int, bucket_bytes: int):
        widths = [DIM] + [hidden] * DEPTH + [CLASSES]
        self.widths = widths
        self.nlayers = len(widths) - 1
        self.offsets: dict[tuple[int, str], tuple[int, tuple]] = {}  # (layer, kind) -> off, shape
        order = []
        for i in reversed(range(self.nlayers)):
            order += [(i, "b", (widths[i + 1],)), (i, "W", (widths[i], widths[i + 1]))]
        off = 0
        for layer, kind, shape in order:
            self.offsets[(layer, kind)] = (off, shape)
            off += int(np.prod(shape))
        self.nparams = off
        # Buckets hold whole layers (one backward kernel writes a layer's weight and bias
        # gradients), in backward order; a bucket is closed before the next layer would push it
        # past the cap, so a layer larger than the cap gets a bucket of its own.
        itemsize = np.dtype(DTYPE).itemsize
        self.buckets: list[tuple[int, int, int]] = []   # (start, end, last layer) in grad slots
        start = end = 0
        for i in reversed(range(self.nlayers)):
            size = widths[i + 1] * (widths[i] + 1)
            if end > start and (end - start + size) * itemsize > bucket_bytes:
                self.buckets.append((start, end, i + 1))
                start = end
            end += size + (1 if end == 0 else 0)        # slot 0: the loss
        self.buckets.append((start, end, 0))
        # the bucket(s) complete once backward has produced layer i's gradients
        self.ready_after = {i: [b for b, (_, _, last) in enumerate(self.buckets) if last == i]
                            for i in range(self.nlayers)}

    def param(self, flat, layer: int, kind: str, grad: bool = False):
        """The view of one parameter (or its gradient, ``grad=True``) in a flat numpy buffer."""
        off, shape = self.offsets[(layer, kind)]
        off += 1 if grad else 0
        return flat[off:off + int(np.prod(shape))].reshape(shape)

    def init_params(self, seed: int) -> np.ndarray:
        """He-initialised weights, zero biases (on rank 0 only; the others receive a broadcast)."""
        rng = np.random.default_rng([seed, 1])
        flat = np.zeros(self.nparams, DTYPE)
        for i in range(self.nlayers):
            fan_in = self.widths[i]
            self.param(flat, i, "W")[...] = rng.normal(0.0, math.sqrt(2.0 / fan_in),
                                                       (fan_in, self.widths[i + 1]))
        return flat


# Kernels: plain numpy on arrays (DeviceArray arguments arrive as views of device memory).
# The single-process reference of --check calls the very same functions on host arrays.
def forward_fc(x, w, b, out, relu):
    np.matmul(x, w, out=out)
    out += b
    if relu:
        np.maximum(out, 0.0, out=out)


def softmax_xent(logits, labels, dlogits, grads):
    """Local mean cross-entropy into grads[0]; its gradient w.r.t. the logits into dlogits."""
    z = logits - logits.max(axis=1, keepdims=True)
    np.exp(z, out=dlogits)
    s = dlogits.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    grads[0] = np.mean(np.log(s[:, 0]) - z[rows, labels])
    dlogits /= s
    dlogits[rows, labels] -= 1.0
    dlogits /= len(labels)


def backward_fc(x, w, dz, dw, db, dx):
    """Gradients of out = x @ w + b from dz; dx (if given) is masked by the ReLU of x."""
    np.matmul(x.T, dz, out=dw)
    np.sum(dz, axis=0, out=db)
    if dx is not None:
        np.matmul(dz, w.T, out=dx)
        dx *= x > 0


def grad_scale(bucket, factor):
    bucket *= factor


def sgd_momentum(params, momentum, grads, lr, mu):
    g = grads[1:]                     # grads[0] is the loss
    momentum *= mu
    momentum += g
    params -= lr * momentum


def read_scalar(buf, out, i):
    out[i] = buf[0]


def accuracy_kernel(logits, labels, out):
    out[0] = np.mean(np.argmax(logits, axis=1) == labels)


# ---------------------------------------------------------------------- progress on rank 0
class Progress:
    """A one-line progress bar on stderr (``\\r`` updates on a tty, plain lines otherwise)."""

    def __init__(self, total: int, batch: int, enabled: bool, start: int = 0):
        self.total, self.batch, self.enabled, self.start = total, batch, enabled, start
        self.tty = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.last_draw = 0.0
        self.shown = 0
        self.every = max(1, total // 10)

    def update(self, step: int, loss: float) -> None:
        if not self.enabled:
            return
        done = step + 1
        now = time.perf_counter()
        rate = (done - self.start) * self.batch / max(now - self.t0, 1e-9)
        if self.tty:
            if now - self.last_draw < 0.1 and done < self.total:
                return
            self.last_draw = now
            width = 24
            fill = width * done // self.total
            bar = "#" * fill + "-" * (width - fill)
            line = (f"step {done:>{len(str(self.total))}}/{self.total} [{bar}] "
                    f"loss {loss:.4f}  {rate:,.0f} samples/s")
            sys.stderr.write("\r" + line.ljust(self.shown))    # blank what a longer line left
            self.shown = len(line)
            if done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif done % self.every == 0 or done == self.total or done == self.start + 1:
            print(f"step {done}/{self.total}  loss {loss:.4f}  {rate:,.0f} samples/s",
                  file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- training
class Trainer:
    """One data-parallel replica: device buffers, the two streams and one step's task graph."""

    def __init__(self, args, comm, layout: Layout, data):
        self.args, self.comm, self.lay = args, comm, layout
        self.world, self.rank = comm.size, comm.rank
        self.local = args.batch // self.world
        self.x_train, self.y_train, self.x_test, self.y_test = data
        self.compute = runtime.Stream()
        self.comm_stream = runtime.Stream()
        n, L = layout.nparams, layout.nlayers
        self.params = runtime.zeros(n, DTYPE)
        self.momentum = runtime.zeros(n, DTYPE)
        self.grads = runtime.zeros(n + 1, DTYPE)
        self.x = runtime.empty((self.local, DIM), DTYPE)
        self.y = runtime.empty(self.local, np.int64)
        w = layout.widths
        self.acts = [runtime.empty((self.local, w[i + 1]), DTYPE) for i in range(L)]
        self.dacts = [runtime.empty((self.local, w[i + 1]), DTYPE) for i in range(L)]
        # device views into the flat buffers (DeviceArrays that share the memory, not own it)
        self.W = [self._view(self.params, i, "W") for i in range(L)]
        self.b = [self._view(self.params, i, "b") for i in range(L)]
        self.dW = [self._view(self.grads, i, "W", grad=True) for i in range(L)]
        self.db = [self._view(self.grads, i, "b", grad=True) for i in range(L)]
        item = np.dtype(DTYPE).itemsize
        self.bucket_views = [runtime.DeviceArray(self.grads.ptr + s * item, e - s, DTYPE)
                             for s, e, _ in layout.buckets]
        self.losses = np.full(args.steps, np.nan)
        self.start = 0                     # the step this run started at (a resumed run: > 0)
        self.marks: list[tuple] = []       # per step: timing events (start, bwd_end, wait_end, end)

    def _view(self, flat, layer, kind, grad=False):
        off, shape = self.lay.offsets[(layer, kind)]
        off += 1 if grad else 0
        return runtime.DeviceArray(flat.ptr + off * flat.dtype.itemsize, shape, DTYPE)

    def broadcast_state(self, state: dict | None) -> int:
        """Rank 0's parameters, momentum and step to every rank (HcclBroadcast on the
        communication stream); returns the step to start from. ``state`` is rank 0's."""
        ks = self.comm_stream
        step = runtime.zeros(1, np.int64)
        if self.rank == 0:
            self.params.copy_from_host(state["params"], stream=ks)
            self.momentum.copy_from_host(state["momentum"], stream=ks)
            step.copy_from_host(np.array([state["step"]], np.int64), stream=ks)
            self.losses[:len(state["losses"])] = state["losses"][:self.args.steps]
        for buf in (self.params, self.momentum, step):
            self.comm.broadcast(buf, root=0, stream=ks)
        self.compute.wait_stream(ks)
        self.start = int(step.to_host(stream=ks)[0])
        return self.start

    def save_checkpoint(self, step: int) -> None:
        """Rank 0: the state after ``step`` steps into the checkpoint directory (waits for it)."""
        buf = io.BytesIO()
        np.savez(buf, params=self.params.to_host(stream=self.compute),
                 momentum=self.momentum.to_host(stream=self.compute), step=np.int64(step),
                 losses=self.losses[:step])
        checkpoint.save(self.args.checkpoint_dir, step, buf.getvalue(), ".npz",
                        checkpoint_meta(self.lay, self.world))

    def step(self, t: int) -> tuple:
        """Enqueue one training step; returns at once, with the events that end its gradient
        all-reduces (communication stream) and the step (compute stream)."""
        L, cs, ks = self.lay.nlayers, self.compute, self.comm_stream
        ev = [runtime.Event(enable_timing=True) for _ in range(4)]
        self.marks.append(ev)
        rows = global_batch(t, self.args.batch, self.args.seed)
        shard = rows[self.rank * self.local:(self.rank + 1) * self.local]
        ev[0].record(cs)
        self.x.copy_from_host(self.x_train[shard], stream=cs)
        self.y.copy_from_host(self.y_train[shard], stream=cs)
        inp = self.x
        for i in range(L):
            runtime.launch(forward_fc, inp, self.W[i], self.b[i], self.acts[i], i < L - 1,
                           stream=cs, name=f"forward_fc{i + 1}")
            inp = self.acts[i]
        runtime.launch(softmax_xent, self.acts[-1], self.y, self.dacts[-1], self.grads,
                       stream=cs, name="backward_loss")
        for i in reversed(range(L)):
            x_in = self.acts[i - 1] if i else self.x
            dx = self.dacts[i - 1] if i else None
            runtime.launch(backward_fc, x_in, self.W[i], self.dacts[i], self.dW[i], self.db[i], dx,
                           stream=cs, name=f"backward_fc{i + 1}")
            for bkt in self.lay.ready_after[i]:
                # the bucket is complete: the communication stream takes it from here
                ready = cs.record_event()
                ks.wait_event(ready)
                view = self.bucket_views[bkt]
                self.comm.all_reduce(view, op=hccl.ReduceOp.SUM, stream=ks)
                runtime.launch(grad_scale, view, 1.0 / self.world, stream=ks, name="grad_scale")
        ev[1].record(cs)
        reduced = ks.record_event()
        cs.wait_event(reduced)
        ev[2].record(cs)
        runtime.launch(sgd_momentum, self.params, self.momentum, self.grads, self.args.lr,
                       self.args.momentum, stream=cs, name="sgd_step")
        runtime.launch(read_scalar, self.grads, self.losses, t, stream=cs, name="read_loss")
        ev[3].record(cs)
        return reduced, ev[3]

    def train(self, progress: Progress) -> None:
        """Steps ``self.start`` to the end; rank 0 checkpoints every --checkpoint-every steps."""
        args, pending = self.args, {}
        for t in range(self.start, args.steps):
            pending[t] = self.step(t)
            if t > self.start:   # keep one step in flight: the host prepares t while t-1 runs
                # the communication stream's event too: a failed all-reduce (a peer died)
                # raises here instead of letting this rank step on with unreduced gradients
                for ev in pending.pop(t - 1):
                    ev.synchronize()
                progress.update(t - 1, self.losses[t - 1])
            done = t + 1
            if self.rank == 0 and args.checkpoint_dir and (
                    done % args.checkpoint_every == 0 or done == args.steps):
                for ev in pending[t]:       # only the state of a step that really completed
                    ev.synchronize()
                self.save_checkpoint(done)
            runtime.profiler.step()     # a step per iteration in a profile (the first: set-up)
        self.compute.synchronize()
        self.comm_stream.synchronize()
        if self.start < args.steps:
            progress.update(args.steps - 1, self.losses[-1])

    def timings(self) -> dict:
        """Compute / communication-wait split of the compute stream, from the timing events."""
        compute = wait = 0.0
        for start, bwd_end, wait_end, end in self.marks[1:]:     # step 0 is warm-up
            compute += start.elapsed_time(bwd_end) + wait_end.elapsed_time(end)
            wait += bwd_end.elapsed_time(wait_end)
        timed = max(len(self.marks) - 1, 0)
        wall = self.marks[0][3].elapsed_time(self.marks[-1][3]) if timed else float("nan")
        return {"compute_ms": compute, "wait_ms": wait, "wall_ms": wall, "timed_steps": timed}

    def evaluate(self) -> float:
        """Accuracy of this replica on the held-out set (forward kernels on the compute stream)."""
        cs, L = self.compute, self.lay.nlayers
        x = runtime.to_device(self.x_test, stream=cs)
        y = runtime.to_device(self.y_test, stream=cs)
        out = np.zeros(1)
        inp = x
        acts = []
        for i in range(L):
            a = runtime.empty((len(self.x_test), self.lay.widths[i + 1]), DTYPE)
            runtime.launch(forward_fc, inp, self.W[i], self.b[i], a, i < L - 1, stream=cs,
                           name=f"eval_fc{i + 1}")
            acts.append(a)
            inp = a
        runtime.launch(accuracy_kernel, inp, y, out, stream=cs, name="eval_accuracy")
        cs.synchronize()
        return float(out[0])


def reference_train(args, lay: Layout, initial: np.ndarray, data) -> np.ndarray:
    """The same model trained in this process over the full global batches, without hccl."""
    x_train, y_train = data[0], data[1]
    params, momentum = initial.copy(), np.zeros_like(initial)
    grads = np.zeros(lay.nparams + 1, DTYPE)
    L, w = lay.nlayers, lay.widths
    acts = [np.empty((args.batch, w[i + 1]), DTYPE) for i in range(L)]
    dacts = [np.empty((args.batch, w[i + 1]), DTYPE) for i in range(L)]
    for t in range(args.steps):
        rows = global_batch(t, args.batch, args.seed)
        x, y = x_train[rows], y_train[rows]
        inp = x
        for i in range(L):
            forward_fc(inp, lay.param(params, i, "W"), lay.param(params, i, "b"), acts[i],
                       i < L - 1)
            inp = acts[i]
        softmax_xent(acts[-1], y, dacts[-1], grads)
        for i in reversed(range(L)):
            backward_fc(acts[i - 1] if i else x, lay.param(params, i, "W"), dacts[i],
                        lay.param(grads, i, "W", grad=True), lay.param(grads, i, "b", grad=True),
                        dacts[i - 1] if i else None)
        sgd_momentum(params, momentum, grads, args.lr, args.momentum)
    return params


def check(args, trainer: Trainer, lay: Layout, initial, data) -> bool:
    """Every replica bitwise identical, and equal to the single-process run within 1e-6."""
    comm, ks = trainer.comm, trainer.comm_stream
    final = trainer.params.to_host(stream=trainer.compute)
    digest = np.frombuffer(hashlib.blake2b(final.tobytes(), digest_size=32).digest(), np.uint8)
    mine = runtime.to_device(digest)
    every = runtime.zeros(32 * comm.size, np.uint8)
    comm.all_gather(mine, every, stream=ks)
    digests = every.to_host(stream=ks).reshape(comm.size, 32)
    differ = [r for r in range(comm.size) if not np.array_equal(digests[r], digests[0])]
    verdict = np.zeros(1, np.int32)
    if comm.rank == 0:
        ref = reference_train(args, lay, initial, data)
        scale = float(np.max(np.abs(ref)))
        rel = float(np.max(np.abs(final - ref))) / scale
        ok = not differ and rel <= CHECK_RTOL and np.all(np.isfinite(final))
        same = (f"{plural(comm.size, 'replica')} bitwise identical" if not differ else
                f"replicas {differ} differ from rank 0")
        print(f"CHECK {'PASS' if ok else 'FAIL'}: {same}; max|ddp - single| / max|single| = "
              f"{rel:.2e} (limit {CHECK_RTOL:g}) over {lay.nparams} parameters after "
              f"{args.steps} steps", flush=True)
        verdict[0] = int(ok)
    flag = runtime.to_device(verdict)
    comm.broadcast(flag, root=0, stream=ks)        # every rank exits with rank 0's verdict
    return bool(flag.to_host(stream=ks)[0])


def checkpoint_meta(lay: Layout, world: int) -> dict:
    """What a checkpoint must match to be resumed: the world size and every parameter's shape."""
    shapes = {f"{kind}{layer + 1}": list(shape) for (layer, kind), (_, shape) in
              sorted(lay.offsets.items())}
    return {"world_size": world, "shapes": shapes}


def parse_npz(data: bytes) -> dict:
    """A checkpoint payload (numpy .npz, never pickles) as a dict of arrays."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        state = {k: z[k] for k in ("params", "momentum", "step", "losses")}
    state["step"] = int(state["step"])
    return state


def initial_state(args, lay: Layout, world: int) -> dict:
    """Rank 0: the newest checkpoint's state, else step 0 (He-initialised weights, no momentum)."""
    if args.checkpoint_dir:
        found = checkpoint.latest(args.checkpoint_dir, checkpoint_meta(lay, world), parse_npz)
        if found is not None:
            n = lay.nparams
            if found.state["params"].shape != (n,) or found.state["momentum"].shape != (n,):
                raise checkpoint.CheckpointMismatch(
                    f"checkpoint {found.path} holds {found.state['params'].shape} parameters "
                    f"and {found.state['momentum'].shape} momenta; this model has ({n},)")
            return found.state
    params = lay.init_params(args.seed)
    return {"params": params, "momentum": np.zeros_like(params), "step": 0,
            "losses": np.zeros(0)}


def parse_args(argv=None):
    p = training_args.parser(__doc__, depth=DEPTH, steps=150, batch=2048, lr=0.1, bucket_mb=1.0,
                             bucket_help="3 buckets at the default width")
    p.add_argument("--profile", metavar="DIR",
                   help="write DIR/trace_rank<RANK>.json per rank and DIR/trace_merged.json")
    return training_args.parse(p, argv, N_TRAIN)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def resume(trainer: Trainer, state: dict | None) -> int:
    """Every rank takes rank 0's state; rank 0 says where a resumed run starts."""
    start = trainer.broadcast_state(state)
    if trainer.rank == 0 and start:
        print(f"resumed from step {start}", flush=True)
    return start


def main(argv=None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.batch % world:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: --batch {args.batch} is not a multiple of the {world} ranks",
                  file=sys.stderr)
        return 2
    runtime.set_device(int(os.environ["LOCAL_RANK"]))
    comm = hccl.init_comm()
    lay = Layout(args.hidden, int(args.bucket_mb * 2**20))
    data = make_dataset(args.seed)
    lead = comm.rank == 0
    state = initial_state(args, lay, comm.size) if lead else None
    initial = lay.init_params(args.seed) if lead else None     # --check's reference start
    trainer = Trainer(args, comm, lay, data)
    if lead:
        sizes = ", ".join(f"{(e - s) * 8 / 2**10:.0f} KiB" for s, e, _ in lay.buckets)
        print(f"MLP {lay.widths}: {lay.nparams} parameters ({DTYPE.__name__}), "
              f"{plural(comm.size, 'rank')} x {trainer.local} samples = global batch {args.batch}, "
              f"{plural(len(lay.buckets), 'gradient bucket')} ({sizes})", flush=True)

    if args.profile:
        trace = os.path.join(args.profile, f"trace_rank{comm.rank}.json")
        with runtime.profile(trace):
            start = resume(trainer, state)
            trainer.train(Progress(args.steps, args.batch, lead, start))
        comm.barrier(stream=trainer.comm_stream)    # every rank's trace is on disk
        trainer.comm_stream.synchronize()
        if lead:   # this job's ranks only, not traces a larger earlier run left there
            from launcher.profile import tracemerge
            merged = os.path.join(args.profile, tracemerge.MERGED_NAME)
            tracemerge.merge([os.path.join(args.profile, f"trace_rank{r}.json")
                              for r in range(comm.size)], merged)
            print(f"profile: {comm.size} per-rank traces merged into {merged}", flush=True)
    else:
        start = resume(trainer, state)
        trainer.train(Progress(args.steps, args.batch, lead, start))

    tm = trainer.timings()
    acc = trainer.evaluate() if lead else None
    if lead:
        print(f"final loss {trainer.losses[-1]:.4f}, held-out accuracy {acc:.2%} "
              f"({len(data[2])} samples)", flush=True)
        if tm["timed_steps"]:      # step 1 (first touch of memory, first connections) is not timed
            busy = tm["compute_ms"] + tm["wait_ms"]
            rate = tm["timed_steps"] * args.batch / (tm["wall_ms"] / 1e3)
            print(f"throughput {rate:,.0f} samples/s over steps {start + 2}-{args.steps}; "
                  f"rank 0's compute "
                  f"stream: computing {tm['compute_ms'] / 1e3:.2f} s, waiting for communication "
                  f"{tm['wait_ms'] / 1e3:.2f} s ({tm['wait_ms'] / busy:.1%})", flush=True)
        else:
            print("throughput: not measured (the first step is warm-up; run 2 steps or more)",
                  flush=True)
        final = trainer.params.to_host(stream=trainer.compute)
        print(f"final params sha256: {hashlib.sha256(final.tobytes()).hexdigest()}", flush=True)
    ok = check(args, trainer, lay, initial, data) if args.check else True
    comm.destroy()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
