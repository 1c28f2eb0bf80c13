"""The small typed records that cross component boundaries: batches, sample info, update results."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: the ground floor does not import torch (or jax) at run time
    import jax
    import torch

OFFLINE = 0
ONLINE = 1
# the offline rows of a buffer with a demonstration segment, split where the online phase began (a mixture's
# per-source parts draw from one each): the dataset, written before the first online row, slots
# [0, num_before_online); the demonstrations that joined during online training, [num_before_online, num_offline)
DATASET_ROWS = 2
DEMONSTRATION_ROWS = 3
SOURCE_NAMES = {OFFLINE: "offline", ONLINE: "online", DATASET_ROWS: "dataset", DEMONSTRATION_ROWS: "demonstration"}
# where a stored row came from (the storage's per-row ``origin`` column), beside its source: a dataset row and an
# intervention row (a person or an expert took over the agent) are both OFFLINE (never evicted, sampled as
# demonstrations); an agent row is ONLINE (an intervention row may also be kept on the ring: ONLINE, INTERVENTION)
DATASET = 0
INTERVENTION = 1
AGENT = 2
ORIGIN_NAMES = {DATASET: "dataset", INTERVENTION: "intervention", AGENT: "agent"}


@dataclass(frozen=True)
class SampleInfo:
    """Which rows a batch holds, and what the sampler knew about them when it drew them.

    ``indices`` are storage slots, ``generation`` the slot's write stamp at sampling time (an update whose
    stamp no longer matches is stale and is skipped), ``probability`` the per-draw probability of the row
    under the sampler's distribution, ``is_weight`` the importance-sampling weight to multiply per-sample
    losses by (all ones for samplers without IS correction), ``source`` 0 = offline, 1 = online.
    """

    indices: np.ndarray
    generation: np.ndarray
    probability: np.ndarray
    is_weight: np.ndarray | torch.Tensor | jax.Array  # float32 in the copy a batch moved to torch / JAX carries
    source: np.ndarray
    # per-batch values a sampler publishes for the agent's update (e.g. ReF-ER's ``c_max`` and ``beta``):
    # scalars, or arrays of shape [B] (``to_torch`` turns those into tensors); empty for most samplers
    hints: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.indices.shape[0])


_CORE = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


@dataclass(frozen=True)
class Batch:
    """A sampled minibatch. Core columns are fields; extra columns are in ``extras`` and also readable as
    attributes (``batch.mc_return``). Arrays are NumPy until :meth:`to_torch` or :meth:`to_jax` is called. With dict
    observations ``obs`` and ``next_obs`` are dicts key -> array (``batch.obs["image"]``).

    ``discount``: None for one-step batches (targets use gamma (1 - terminated)). From a buffer with
    ``n_step > 1`` (:mod:`relive.replay.returns`): ``reward`` is the n-step return sum_{k<n'} gamma^k r_{t+k},
    ``next_obs`` / ``terminated`` / ``truncated`` are those of the bootstrap row t + n' - 1, and ``discount``
    [B] float32 = gamma^{n'} (1 - terminated), so the target is ``reward + discount * V(next_obs)``.
    ``mask``: None for row batches; for sequence batches (``ReplayBuffer.sample_sequences``) every column is
    [B, L, ...] and ``mask`` [B, L] bool marks the steps inside the start row's episode (padding is zeros)."""

    obs: Any
    action: Any
    reward: Any
    next_obs: Any
    terminated: Any
    truncated: Any
    info: SampleInfo
    extras: Mapping[str, Any] = field(default_factory=dict)
    discount: Any = None
    mask: Any = None

    def __getattr__(self, name: str):
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"Batch has no column {name!r}; columns: {list(_CORE) + list(extras)}")

    def __len__(self) -> int:
        return len(self.info)

    def columns(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _CORE} | dict(self.extras)

    def to_torch(self, device="cpu", dtype=None, flag_dtype=None) -> Batch:
        """Torch tensors on ``device`` (zero-copy on CPU); float columns cast to ``dtype`` when given.
        ``terminated`` / ``truncated`` become ``flag_dtype`` (default float32, so that ``1 - terminated`` works in
        targets; ``torch.bool`` keeps them as flags). The ``info`` record stays NumPy except ``is_weight``, which
        becomes a float32 tensor."""
        import torch  # (torch: `import relive.replay` does not load it)

        flag_dtype = torch.float32 if flag_dtype is None else flag_dtype
        flag_np = {torch.float32: np.float32, torch.bool: np.bool_, torch.uint8: np.uint8}.get(flag_dtype)

        def conv(x, is_flag=False):
            if is_flag and flag_np is not None and isinstance(x, np.ndarray):
                x = x.astype(flag_np)  # (NumPy converts a flag at a fifth of torch's .to)
            t = as_tensor(x, device)
            if is_flag:
                return t if t.dtype == flag_dtype else t.to(flag_dtype)
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t

        info = self.info
        weight = info.is_weight
        torch_info = new_sample_info(
            info.indices, info.generation, info.probability,
            as_tensor(np.asarray(weight, dtype=np.float32) if isinstance(weight, np.ndarray) else weight,
                      device).to(torch.float32),
            info.source,
            {k: (torch.as_tensor(v, device=device) if isinstance(v, np.ndarray) else v) for k, v in info.hints.items()},
        )
        return self._converted(conv, torch_info, lambda m: torch.as_tensor(m, device=device))

    def to_jax(self, device=None, dtype=None) -> Batch:
        """JAX arrays through DLPack (``jax.dlpack.from_dlpack``), on ``device`` when given (a ``jax.Device``; default:
        the CPU, where the NumPy rows are). Float columns are cast to ``dtype`` when given (in NumPy, before the
        hand-over); ``terminated`` / ``truncated`` / ``mask`` become bool; dict observations one array per key;
        extras and ``discount`` too. The ``info`` record stays NumPy except ``is_weight`` (float32) and array hints.

        Zero-copy on CPU where the layout allows: a column whose data starts on a 64-byte boundary (XLA's CPU
        alignment), C-contiguous (or a transposition of it), writeable, of a dtype JAX keeps. Otherwise JAX or this
        method copies it: an unaligned array (NumPy aligns most allocations to 16 bytes only, so many sampled
        columns are copied), a strided view, a read-only array, a cast (``dtype``; flags stored
        as other than bool), and 64-bit columns while ``jax_enable_x64`` is off (JAX turns them into 32-bit).
        A shared column aliases the NumPy array: do not write into this batch's NumPy arrays afterwards (a
        sampled batch's arrays are its own copies of the rows, never the storage)."""
        from relive.extras import require

        jax = require("jax", "Batch.to_jax")  # (an optional dependency: the extra "jax")
        cast = None if dtype is None else np.dtype(dtype)  # (jnp.float32, jnp.bfloat16, "float16": NumPy dtypes)

        def conv(x, flag=False):
            if isinstance(x, np.ndarray):
                if flag and x.dtype != np.bool_:
                    x = x.astype(np.bool_)
                elif cast is not None and x.dtype.kind == "f" and x.dtype != cast:
                    x = x.astype(cast)
            return as_jax(x, device, jax)

        info = self.info
        weight = info.is_weight
        jax_info = new_sample_info(
            info.indices, info.generation, info.probability,
            as_jax(np.asarray(weight, dtype=np.float32) if isinstance(weight, np.ndarray) else weight, device, jax),
            info.source,
            {k: (as_jax(v, device, jax) if isinstance(v, np.ndarray) else v) for k, v in info.hints.items()})
        return self._converted(conv, jax_info, lambda m: conv(m, True))

    def pack(self, dtype=None, x64: bool = False) -> tuple[np.ndarray, JaxLayout]:
        """The batch as ONE byte buffer and its layout, for a jitted JAX update: every column's bytes copied into one
        64-byte aligned uint8 NumPy array, and a hashable :class:`JaxLayout` whose ``unpack(data)`` returns the
        columns as JAX arrays -- called inside the jitted function (the layout a static argument), where the slices
        and bit-casts cost next to nothing. Hand ``data`` to the jitted function as it is: jit moves a NumPy
        argument to the device in one transfer, which is faster than importing it first (``jax.device_put(data)``
        when a JAX array is wanted). :meth:`to_jax` makes one JAX array a column instead (~50 us each on CPU, and
        each one an argument of the jitted call): docs/benchmarks.md, "relive -> JAX".

        ``unpack`` gives a dict: ``obs``, ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated`` (bool),
        the extras by name, ``discount`` and ``mask`` when the batch has them, and ``is_weight`` (float32);
        dict observations as dicts of keys. Float columns cast to ``dtype`` when given, flags as bool, 64-bit
        columns as 32-bit (JAX's default) unless ``x64`` (for ``jax_enable_x64``). ``info`` (indices, generations:
        what ``update`` needs) stays on this batch. Needs no jax to pack (the buffer is NumPy).

            data, layout = buf.sample(256).pack()
            state = update(state, data, layout)      # jax.jit(update, static_argnums=2); inside: layout.unpack(data)
        """
        cast = None if dtype is None else np.dtype(dtype)
        parts: list[tuple[tuple[str, ...], np.ndarray]] = []

        def add(path: tuple[str, ...], x, flag=False):
            x = np.asarray(x)
            if flag or x.dtype == np.bool_:
                x = x.astype(np.bool_, copy=False)
            elif cast is not None and x.dtype.kind == "f":
                x = x.astype(cast, copy=False)
            elif not x64 and x.dtype.itemsize == 8:
                x = x.astype(x.dtype.str[:-1] + "4", copy=False)  # (JAX's 32-bit default)
            parts.append((path, np.ascontiguousarray(x)))

        for name in ("obs", "next_obs"):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                for key, v in value.items():
                    add((name, key), v)
            else:
                add((name,), value)
        add(("action",), self.action)
        add(("reward",), self.reward)
        add(("terminated",), self.terminated, True)
        add(("truncated",), self.truncated, True)
        for key, v in self.extras.items():
            add((key,), v)
        if self.discount is not None:
            add(("discount",), self.discount)
        if self.mask is not None:
            add(("mask",), self.mask, True)
        add(("is_weight",), np.asarray(self.info.is_weight, dtype=np.float32))
        # the columns grouped by dtype, each group one run of bytes (unpack bit-casts a group once, then slices it)
        parts.sort(key=lambda part: (-part[1].dtype.itemsize, part[1].dtype.str))
        columns, offset = [], 0
        for path, x in parts:
            offset = -(-offset // x.dtype.itemsize) * x.dtype.itemsize
            columns.append((path, x.dtype.str, tuple(x.shape), offset))
            offset += x.nbytes
        raw = np.empty(offset + _PACK_ALIGN, np.uint8)
        start = -raw.ctypes.data % _PACK_ALIGN
        data = raw[start:start + offset]  # (64-byte aligned: DLPack imports it without a copy)
        for (_, _, _, at), (_, x) in zip(columns, parts, strict=True):
            data[at:at + x.nbytes] = x.reshape(-1).view(np.uint8)
        key = (tuple(columns), offset)
        layout = _LAYOUTS.get(key)
        if layout is None:  # (one object per layout: jit's cache of static arguments then hits on identity)
            layout = _LAYOUTS[key] = JaxLayout(*key)
            if len(_LAYOUTS) > 256:
                _LAYOUTS.pop(next(iter(_LAYOUTS)))
        return data, layout

    def _converted(self, conv: Callable[..., Any], info: SampleInfo, conv_mask: Callable[[Any], Any]) -> Batch:
        """This batch with every column through ``conv(x, is_flag)`` (dict observations one array per key; uint8
        images stay uint8), ``info`` given and ``mask`` through ``conv_mask``: :meth:`to_torch`'s and
        :meth:`to_jax`'s one layout."""
        def conv_obs(x):
            return {k: conv(v) for k, v in x.items()} if isinstance(x, Mapping) else conv(x)

        return Batch(
            obs=conv_obs(self.obs),
            action=conv(self.action),
            reward=conv(self.reward),
            next_obs=conv_obs(self.next_obs),
            terminated=conv(self.terminated, True),
            truncated=conv(self.truncated, True),
            info=info,
            extras={k: conv(v) for k, v in self.extras.items()},
            discount=None if self.discount is None else conv(self.discount),
            mask=None if self.mask is None else conv_mask(self.mask),
        )


_PACK_ALIGN = 64  # XLA's CPU alignment: a buffer starting on it is imported by DLPack without a copy
_LAYOUTS: dict = {}  # the layouts Batch.pack made, by value (the newest 256)


@dataclass(frozen=True)
class JaxLayout:
    """Where each column of a packed batch lies in its uint8 buffer (:meth:`Batch.pack`): ``columns`` =
    (path, NumPy dtype string, shape, byte offset) each, ``nbytes`` the buffer's size. Hashable, so a jitted update
    takes it as a static argument (one compilation per layout: batch size and columns)."""

    columns: tuple[tuple[tuple[str, ...], str, tuple[int, ...], int], ...]
    nbytes: int

    def unpack(self, data) -> dict[str, Any]:
        """The columns of ``data`` (the packed buffer) as JAX arrays of their dtypes and shapes, by name (dict
        observations: a dict of keys). Meant for inside ``jax.jit``, where the slices and bit-casts fuse away."""
        from relive.extras import require

        jax = require("jax", "JaxLayout.unpack")
        if tuple(data.shape) != (self.nbytes,):
            raise ValueError(f"a packed batch of {self.nbytes} bytes was expected, got shape {tuple(data.shape)}")
        out: dict[str, Any] = {}
        groups: dict[str, tuple[int, Any]] = {}  # dtype -> (first byte, the group's bytes as that dtype)
        for path, dtype_str, shape, at in self.columns:
            dt = np.dtype(dtype_str)
            if dtype_str not in groups:  # (columns of one dtype lie in one run: pack's order)
                end = max(a + int(np.prod(s, dtype=np.int64)) * dt.itemsize
                          for _, d, s, a in self.columns if d == dtype_str)
                raw = data[at:end]
                if dt == np.bool_:
                    group = raw != 0
                elif dt.itemsize == 1:
                    group = jax.lax.bitcast_convert_type(raw, dt)
                else:  # (uint8 [n, itemsize] -> dtype [n]: the host's byte order, as NumPy wrote it)
                    group = jax.lax.bitcast_convert_type(raw.reshape(-1, dt.itemsize), dt)
                groups[dtype_str] = (at, group)
            first, group = groups[dtype_str]
            begin = (at - first) // dt.itemsize
            col = group[begin:begin + int(np.prod(shape, dtype=np.int64))].reshape(shape)
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = col
        return out


def as_jax(x, device=None, jax=None):
    """``x`` as a JAX array on ``device`` (default: the CPU), sharing memory where it can: a NumPy array goes through
    DLPack (``jax.dlpack.from_dlpack``: zero-copy on CPU when 64-byte aligned and of a dtype JAX keeps, otherwise JAX
    copies it); a strided view or a read-only array is first copied to a C-contiguous one (DLPack takes neither);
    anything else (scalars, lists, JAX or torch arrays) through ``jax.numpy.asarray`` / ``jax.device_put``."""
    if jax is None:
        from relive.extras import require

        jax = require("jax", "relive.types.as_jax")
    if isinstance(x, np.ndarray) and x.dtype.kind in "biuf":  # (DLPack: bool, integer and float dtypes)
        if not x.flags.writeable or not (x.flags.c_contiguous or x.flags.f_contiguous):
            x = np.array(x, order="C")  # (numpy exports no read-only array; JAX takes no strided view)
        out = jax.dlpack.from_dlpack(x)
    else:
        out = jax.numpy.asarray(x)
    return out if device is None else jax.device_put(out, device)


def as_tensor(x, device="cpu"):
    """``x`` as a torch tensor on ``device``, sharing memory where it can: on CPU a writeable NumPy array of a dtype
    torch takes goes through ``torch.from_numpy`` (zero-copy, like ``torch.as_tensor``, at a third of its cost per
    call); anything else through ``torch.as_tensor``."""
    import torch

    if isinstance(x, np.ndarray) and x.flags.writeable and (
            device is None or device == "cpu"
            or (device.type == "cpu" if isinstance(device, torch.device) else torch.device(device).type == "cpu")):
        try:
            return torch.from_numpy(x)
        except TypeError:  # a dtype torch does not take from NumPy: as_tensor converts it
            pass
    return torch.as_tensor(x, device=device)


#: names an extra column cannot take: ``batch.<name>`` finds Batch's own fields, methods and attributes before the
#: extras (the column would be stored but never read), and SampleInfo's fields (``batch.indices`` would be mistaken
#: for ``batch.info.indices``)
RESERVED_COLUMN_NAMES = frozenset({f for f in Batch.__dataclass_fields__} | set(dir(Batch))
                                  | {f for f in SampleInfo.__dataclass_fields__})


@dataclass(frozen=True)
class UpdateReport:
    """What ``ReplayBuffer.update`` did: rows updated, and rows skipped because their slot was overwritten
    after they were sampled (``stale``, a boolean mask over the batch). A device buffer's report holds 0-d tensors
    and a tensor mask on its device (read them only when needed: a read is a sync)."""

    num_updated: Any  # int (host) or a 0-d tensor (device buffer)
    num_stale: Any
    stale: Any  # np.ndarray (host) or a bool tensor (device buffer)


# -- the hot paths' records, built without the frozen dataclasses' __init__ (one object.__setattr__ per field:
# ~1 us for a Batch, paid on every sample). The same objects -- frozen, equal, the same repr -- as the
# constructors build; tests/replay/test_hot_paths.py holds each builder to its class.
_new = object.__new__


def new_sample_info(indices, generation, probability, is_weight, source, hints) -> SampleInfo:
    """``SampleInfo(indices, generation, probability, is_weight, source, hints)``, faster."""
    info = _new(SampleInfo)
    info.__dict__.update({"indices": indices, "generation": generation, "probability": probability,
                          "is_weight": is_weight, "source": source, "hints": hints})
    return info


def new_batch(obs, action, reward, next_obs, terminated, truncated, info, extras, discount=None) -> Batch:
    """``Batch(obs, action, reward, next_obs, terminated, truncated, info, extras, discount)`` (no mask), faster."""
    out = _new(Batch)
    out.__dict__.update({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                         "terminated": terminated, "truncated": truncated, "info": info, "extras": extras,
                         "discount": discount, "mask": None})
    return out


def new_update_report(num_updated, num_stale, stale) -> UpdateReport:
    """``UpdateReport(num_updated, num_stale, stale)``, faster."""
    out = _new(UpdateReport)
    out.__dict__.update({"num_updated": num_updated, "num_stale": num_stale, "stale": stale})
    return out


class TensorMetrics(Mapping):
    """Scalar metrics that may be held as 0-d tensors until someone reads them: the first read converts all
    of them at once (one ``torch.stack(...).tolist()``, instead of an ``.item()`` -- a device sync on a GPU --
    per metric and update). Reads as a plain ``Mapping[str, float]``; ``metrics | other`` gives a dict. The
    trainer keeps the latest update's metrics and reads them only when it logs, so a run converts on its
    logging cadence. Values must not be modified in place after they are handed over (agents pass fresh
    tensors: ``loss.detach()``, ``q.mean()``)."""

    __slots__ = ("_values", "_floats")

    def __init__(self, values: Mapping[str, Any] | None = None):
        self._values = dict(values or {})
        self._floats: dict[str, float] | None = None

    def _read(self) -> dict[str, float]:
        if self._floats is None:
            import torch  # (torch: `import relive.replay` does not load it)

            keys = [k for k, v in self._values.items() if torch.is_tensor(v)]
            floats = {k: float(v) for k, v in self._values.items() if not torch.is_tensor(v)}
            if keys:
                stacked = torch.stack([self._values[k].detach().reshape(()).float() for k in keys])
                floats |= dict(zip(keys, stacked.cpu().tolist(), strict=True))
            self._floats = {k: floats[k] for k in self._values}  # the insertion order of the metrics
        return self._floats

    def __getitem__(self, key: str) -> float:
        if key not in self._values:
            raise KeyError(key)
        return self._read()[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __or__(self, other: Mapping) -> dict:
        return dict(self._read()) | dict(other)

    def __ror__(self, other: Mapping) -> dict:
        return dict(other) | dict(self._read())

    def __repr__(self) -> str:
        return f"TensorMetrics({self._read()!r})"


@dataclass(frozen=True)
class UpdateResult:
    """What an agent's ``update(batch)`` returns: scalar ``metrics`` for logging and per-sample ``signals``
    (arrays of shape [B], e.g. ``td_error``, ``log_likelihood``) for the buffer."""

    metrics: Mapping[str, float]
    signals: Mapping[str, np.ndarray] = field(default_factory=dict)




@dataclass(frozen=True)
class ColumnDecl:
    """A per-row column a method needs stored beside the core columns (a *behaviour record* written by the
    collector from ``act``, or a column the loop fills, like Cal-QL's ``mc_return``).

    ``offline``: ``"required"`` -- a dataset without this column is refused with a message naming it;
    ``"fill"`` -- offline rows that lack it get ``fill``. Online rows always come from ``act`` (or from a loop
    hook such as returns-to-go, which writes ``fill`` first and the value at episode end)."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    offline: str = "fill"
    fill: float = 0.0
    doc: str = ""

    def __post_init__(self):
        if self.offline not in ("required", "fill"):
            raise ValueError(f"column {self.name!r}: offline must be 'required' or 'fill', got {self.offline!r}")
        if not self.name.isidentifier():
            raise ValueError(f"column name must be an identifier, got {self.name!r}")

    @property
    def spec(self) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype), as ``ReplayBuffer(extra_columns=...)`` takes it."""
        return tuple(self.shape), np.dtype(self.dtype)

    def filled(self, n: int) -> np.ndarray:
        return np.full((n, *self.shape), self.fill, dtype=np.dtype(self.dtype))


@dataclass(frozen=True)
class Acted:
    """What ``act`` may return instead of a bare action array.

    ``action``: [N, *action_shape]; ``record``: per-step columns to store with each row (name -> [N, ...],
    e.g. the behaviour policy's Gaussian mean and std for ReF-ER, the base action for residual RL); ``store``:
    False (or a [N] boolean mask) for steps that are executed but never stored (PLD's base-policy probing)."""

    action: np.ndarray
    record: Mapping[str, np.ndarray] = field(default_factory=dict)
    store: Any = True


def unpack_acted(out) -> tuple[np.ndarray, Mapping[str, np.ndarray], np.ndarray]:
    """(action, record, store mask [N]) of whatever ``act`` returned (an array or an :class:`Acted`)."""
    if isinstance(out, Acted):
        action = np.asarray(out.action)
        store = np.broadcast_to(np.asarray(out.store, dtype=bool), (action.shape[0],))
        return action, out.record, store
    action = np.asarray(out)
    return action, {}, np.ones(action.shape[0], bool)
