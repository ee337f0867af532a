"""Hand-written matrix-vector products that read a decode step's weights at memory speed on a CPU.

Chapter 00's roofline: a one-token step must read every weight once, so its floor is
``bytes / bandwidth`` (Williams, Waterman, Patterson, "Roofline: An Insightful Visual Performance
Model for Multicore Architectures", CACM 2009). On this course's 2-core machine oneDNN's prepacked
products (:mod:`refimpl.models.cpu_linear`) read SmolLM2-135M's 538 MB at 10-14 GB/s where a plain
``sum`` reads 20-24: each product is a library call tuned for larger batches. ``cpu_gemv.cpp``
(~150 lines of products, AVX2 + FMA, OpenMP) does only what a decode step needs, and its header says how:
each weight packed once (:func:`pack`) into panels of 8 output rows stored k-major, so a k step is one
8-lane vector multiplied by a broadcast ``x[r, k]`` into 8 outputs' accumulator (GotoBLAS's
register-blocked kernel: Goto, van de Geijn, "Anatomy of High-Performance Matrix Multiplication",
ACM TOMS 2008: its micro-kernel's outer-product update); 1-2 rows take 4 panels at a time from 4
far-apart slabs (4 sequential streams), more rows 2 panels in tiles of 3-6 rows, the first tile
streaming them into cache and the others reusing them. An earlier version read the weight row-major with a horizontal
sum per output: as fast at 1 row, but 17 rows of ``tiny``'s products ran at ~48 GFLOP/s (2 threads)
where the panels run at ~85, because its tiles spent their time in horizontal sums and a
streaming pass without reuse. ``python -m refimpl.bench --suite latency`` measures your machine.

:class:`LayerStep` runs all the decoder layers of a Llama step in one call (``refimpl_layers``,
~190 more lines), each layer: RMSNorm, the fused q/k/v product, rotary, the cache write, grouped-query attention,
``o_proj`` with the residual, RMSNorm, the fused gate/up product, SwiGLU and ``down_proj`` with
the residual, inside one OpenMP region. A stage-by-stage step pays a thread fork and join per
product and ~15 torch calls per layer for the stages that read no weights (~11 ms of a ~40 ms
SmolLM2 step on the course machine); in one region the threads meet at a barrier between stages
and between layers, and those stages are plain loops. It is what :func:`refimpl.models.lean_llama.forward` runs by
default where the kernel builds (a one-token SmolLM2 step ~31 ms, 1.07x its memory floor, where
stage by stage it takes ~42 on the same machine).

A weight whose values are all fp16 numbers -- a draft stored in fp16, as the zoo's are -- may be
packed into fp16 panels (``pack(w, half=True)``, or ``PackedCopy(half=True)``, which checks): the
kernel widens each 8-weight step to fp32 with F16C's ``vcvtph2ps`` (exact), so the products are
the fp32 panels' bits at half the bytes read (:mod:`refimpl.models.lean_draft` uses them, and
:class:`LayerStep` takes a layer whose four matrices are all fp16 panels: the EAGLE drafts' layer,
with EAGLE-3's embedded first stage, runs there in one call). A draft may also be read from int8
panels (``pack(w, int8=True)``: :func:`quantize`'s symmetric integers per output row, each row's sum
times its scale): a quarter of fp32's bytes, the products of the quantized weight, not the same bits.

The products are *batch-invariant*: every output element is the same sequence of float operations
whatever the number of rows (one FMA chain over k, then the residual added), so a draft token scored in a block of ``k`` gets exactly the logits
it gets alone (the tests check ``torch.equal``); the layer's norm, rotary and attention keep that
(each query's scores, softmax and weighted sum in one fixed order). They are not the bits of MKL or oneDNN (the sums
run in another order: ~1e-6 relative; e^x is a polynomial within 1.3 ulp); greedy output stays Hugging Face's on every benchmark
prompt, which the tests and the benchmark's ``exact`` column check.

The source is compiled on first use with the system's C++ compiler (``g++ -O3 -mavx2 -mfma -mf16c
-ffp-contract=off -fopenmp``, plus ``-mavx512f`` on a CPU with AVX-512: :func:`build_flags`; ~2 s) into
``$REFIMPL_CACHE/build`` and loaded with ``ctypes``. Its threads are
torch's own OpenMP threads (``torch.get_num_threads()`` of them). A version with its own helper threads, kept
spinning between products, ran AR as fast but a speculative step slower: those helpers and torch's threads
fought over the two cores around every draft call. :func:`available` is False -- and the lean forward keeps
oneDNN -- on a CPU without AVX2/FMA/F16C, without a compiler, or with ``REFIMPL_GEMV=0`` in the environment (the
off switch, e.g. to compare; ``REFIMPL_AVX512=0`` keeps the AVX2 build on an AVX-512 CPU).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import torch

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_gemv.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
FLAGS_AVX512 = (*FLAGS, "-mavx512f")  # on a CPU with AVX-512F (build_flags)


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """The instruction-set flags this x86-64 Linux CPU reports (``/proc/cpuinfo``); empty elsewhere."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def cpu_has_avx2_fma() -> bool:
    """True on an x86-64 Linux CPU that reports AVX2 and FMA (and F16C, which every such CPU has:
    the fp16 panels widen their weights with it)."""
    return {"avx2", "fma", "f16c"} <= cpu_flags()


def build_flags() -> tuple[str, ...]:
    """The compiler flags for this machine: :data:`FLAGS`, plus ``-mavx512f`` where the CPU reports
    AVX-512F and ``REFIMPL_AVX512`` is not ``0``: tiles of 3 rows and more then multiply two panels in
    one 16-lane vector (``tile16`` in ``cpu_gemv.cpp``, the same bits)."""
    avx512 = "avx512f" in cpu_flags() and os.environ.get("REFIMPL_AVX512", "1") != "0"
    return FLAGS_AVX512 if avx512 else tuple(FLAGS)


def build_dir() -> str:
    from .hf import cache_dir

    return os.path.join(cache_dir(), "build")


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The compiled kernel for this machine (:func:`build` with :func:`build_flags`; the AVX2 build if
    the AVX-512 one does not compile), or None."""
    return build(build_flags()) or build(tuple(FLAGS))


@functools.lru_cache(maxsize=None)
def build(flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """The kernel compiled with ``flags`` (once per source version and flags; a test builds the AVX2
    one beside the AVX-512 one to compare them), or None when it cannot be."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None or not cpu_has_avx2_fma():
        return None
    torch.zeros(2, device="cpu").sum()  # torch's OpenMP runtime is loaded first: the kernel links to the same one
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + " ".join(flags).encode()).hexdigest()[:16]
    path = os.path.join(build_dir(), f"cpu_gemv-{key}.so")
    if not os.path.exists(path):
        os.makedirs(build_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=build_dir())  # parallel workers: build aside, rename
        os.close(fd)
        done = subprocess.run([compiler, *flags, SOURCE, "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            os.unlink(tmp)
            return None
        os.replace(tmp, path)
    lib = ctypes.CDLL(path)
    for fn in (lib.refimpl_gemv, lib.refimpl_gemv_f16):
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    lib.refimpl_gemv_i8.restype = None
    lib.refimpl_gemv_i8.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    lib.refimpl_layers.restype = None
    lib.refimpl_layers.argtypes = [ctypes.POINTER(LayerArgs), ctypes.c_int]
    lib.refimpl_rmsnorm.restype = None
    lib.refimpl_rmsnorm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_float]
    lib.refimpl_move_slots.restype = None
    lib.refimpl_move_slots.argtypes = ([ctypes.POINTER(ctypes.c_void_p)] + [ctypes.c_int] * 6
                                       + [ctypes.c_void_p, ctypes.c_int])
    return lib


def available() -> bool:
    """True when the kernel is on (``REFIMPL_GEMV`` is not ``0``) and builds on this machine."""
    return os.environ.get("REFIMPL_GEMV", "1") != "0" and library() is not None


#: outputs per panel of the packed layout (``PW`` in ``cpu_gemv.cpp``)
PANEL = 8


class Packed:
    """A weight (N, K) in the kernel's layout: panels of :data:`PANEL` output rows, each stored k-major,
    ``data[p, k, c] = weight[p * PANEL + c, k]`` (zero rows pad N up to a multiple of PANEL). A k step
    of a panel is one 8-lane vector, which the kernel multiplies by one broadcast ``x[r, k]`` per row.
    ``shape`` is the weight's (N, K); ``data_ptr()`` is what the kernel reads. ``half``: the panels
    hold fp16 numbers (half the bytes; the kernel widens them to fp32 exactly, so a weight whose
    values are all fp16 numbers gives the same bits from either layout). ``int8``: the panels hold
    :func:`quantize`'s integers and ``scale`` (N rounded up to PANEL,) each row's scale (a quarter of
    the bytes; the products are those of the quantized weight ``scale * q``, not of ``weight``).
    ``kind``: 0 fp32, 1 fp16, 2 int8 (``struct Layer``'s ``half``)."""

    def __init__(self, weight: torch.Tensor, half: bool = False, int8: bool = False):
        N, K = weight.shape
        self.half, self.int8, self.scale = bool(half) and not int8, bool(int8), None
        w = weight.detach().to(device="cpu", dtype=torch.float32)
        pad = -N % PANEL
        if pad:
            w = torch.cat([w, w.new_zeros(pad, K)])
        if self.int8:
            w, self.scale = quantize(w)
        elif self.half:
            w = w.half()
        self.data = w.reshape((N + pad) // PANEL, PANEL, K).transpose(1, 2).contiguous()  # (N / PANEL, K, PANEL)
        self.shape = (N, K)
        self.kind = 2 if self.int8 else int(self.half)

    def data_ptr(self) -> int:
        return self.data.data_ptr()


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: ``weight`` (N, K) -> (q (N, K) int8 in [-127, 127], scale (N,)
    float32) with ``weight ~ scale[:, None] * q`` (scale = the row's largest magnitude / 127; 1 for a
    zero row). A draft's weights lose ~0.2% each; its trees barely move
    (bench_results/experiments/2026-11-28_eagle3_kernel_layer_int8/)."""
    w = weight.detach().float()
    scale = w.abs().amax(1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale.contiguous()


def fits_half(weight: torch.Tensor) -> bool:
    """Is every value of ``weight`` an fp16 number (a draft stored in fp16 and loaded as fp32 is)?"""
    return bool(torch.equal(weight.detach().half().to(weight.dtype), weight.detach()))


def pack(weight: torch.Tensor, half: bool = False, int8: bool = False) -> Packed:
    """``weight`` (N, K) in the kernel's panel layout (:class:`Packed`): pack once, multiply many times.
    ``half``: fp16 panels, for a weight whose values are all fp16 numbers (:func:`fits_half`; same
    products, half the bytes read). ``int8``: :func:`quantize`-d panels (lossy by choice: a draft's)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor (N, K), got {type(weight).__name__} "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    if half and int8:
        raise ValueError("half and int8 exclude each other: choose one panel type")
    if half and not fits_half(weight):
        raise ValueError("weight has values that are not fp16 numbers: half=True would round them "
                         "(pack it in fp32, or use PackedCopy(half=True), which chooses)")
    return Packed(weight, half, int8)


class PackedCopy:
    """A weight's :func:`pack`-ed copy kept beside it, rebuilt when the weight is moved, cast or
    edited in place (its ``data_ptr`` or ``_version`` changed): ``copy.of(weight)`` -> :class:`Packed`.
    ``half``: fp16 panels whenever the weight's values are all fp16 numbers (:func:`fits_half`), fp32
    ones otherwise -- the same products either way. ``int8``: int8 panels always (:func:`quantize`)."""

    def __init__(self, half: bool = False, int8: bool = False):
        self.key, self.packed, self.half, self.int8 = None, None, bool(half), bool(int8)

    def of(self, weight: torch.Tensor) -> Packed:
        key = (weight.data_ptr(), weight._version)
        if self.key != key:
            self.key = key
            self.packed = pack(weight.detach(), self.half and not self.int8 and fits_half(weight), self.int8)
        return self.packed


def linear(x: torch.Tensor, weight, add: torch.Tensor | None = None,
           threads: int | None = None) -> torch.Tensor:
    """``add + x @ weight.T`` (``add`` optional), every row computed alone: x (..., K) -> (..., N).

    ``weight``: a contiguous (N, K) tensor (packed here, at every call) or a :func:`pack`-ed one;
    x and ``add`` (..., N) CPU float32 (made contiguous here).
    ``threads``: how many of torch's threads share the rows (None: ``torch.get_num_threads()``).
    """
    if library() is None:
        raise ValueError("cpu_gemv.linear needs an x86-64 CPU with AVX2 and FMA and a C++ compiler "
                         "(cpu_gemv.available() is False)")
    if isinstance(weight, torch.Tensor) and not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous, got strides {weight.stride()}")
    for name, t in (("x", x), ("weight", weight), ("add", add)):
        if isinstance(t, torch.Tensor) and (t.device.type != "cpu" or t.dtype != torch.float32):
            raise ValueError(f"{name} must be a CPU float32 tensor, got {t.dtype} on {t.device}")
    if not isinstance(weight, Packed):
        weight = pack(weight)
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"x (..., {K}) expected for a weight (N, {K}); got x {tuple(x.shape)}")
    if add is not None and add.shape != (*x.shape[:-1], N):
        raise ValueError(f"add must have the output's shape {(*x.shape[:-1], N)}, got {tuple(add.shape)}")
    return run(x, weight, add, threads)


def run(x: torch.Tensor, weight: Packed, add: torch.Tensor | None = None,
        threads: int | None = None) -> torch.Tensor:
    """:func:`linear` without its argument checks, for a caller whose operands hold them by
    construction (the lean forward, ~120 products a step: the checks cost ~10 us each). The
    kernel must be :func:`available`; ``weight`` a :class:`Packed` (N, K) (a contiguous tensor is
    packed here, at every call), x (..., K) and ``add`` (..., N) CPU float32."""
    if not isinstance(weight, Packed):
        weight = Packed(weight)
    N, K = weight.shape
    x = x.contiguous()
    y = torch.empty(*x.shape[:-1], N, dtype=torch.float32, device="cpu")  # (..., N)
    if add is not None:
        add = add.contiguous()
    rows = x.numel() // K if K else 0
    if rows and N:
        args = (x.data_ptr(), y.data_ptr(), 0 if add is None else add.data_ptr(),
                rows, K, N, torch.get_num_threads() if threads is None else int(threads))
        if weight.int8:
            library().refimpl_gemv_i8(weight.data_ptr(), weight.scale.data_ptr(), *args)
        else:
            (library().refimpl_gemv_f16 if weight.half else library().refimpl_gemv)(weight.data_ptr(), *args)
    elif add is not None:
        y.copy_(add)
    else:
        y.zero_()
    return y


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis of a CPU float32 ``x`` (..., n) in one
    kernel call (the layers' own RMSNorm: each row alone, in a fixed order, so batch-invariant; within
    float rounding of ``torch.rms_norm``, ~1e-7 relative). An EAGLE draft's final norm: on a few rows
    torch's RMSNorm is ~6 small operations, ~30 us warm and ~230 us after a target step's cold caches."""
    n = x.shape[-1]
    if x.device.type != "cpu" or x.dtype != torch.float32:
        raise ValueError(f"x must be a CPU float32 tensor, got {x.dtype} on {x.device}")
    if weight.shape != (n,) or weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"weight must be a CPU float32 ({n},) for x (..., {n}), got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    x, w = x.contiguous(), weight.detach().contiguous()
    y = torch.empty_like(x)
    library().refimpl_rmsnorm(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() // n if n else 0, n, float(eps))
    return y


def move_slots(buffers: list, dst: int, src: torch.Tensor) -> None:
    """Copy each row's positions ``src`` (B, k) to positions ``dst .. dst + k - 1`` in every buffer of
    ``buffers`` (each a contiguous CPU float32 (B, H, capacity, D) tensor of one shape: a KV cache's
    keys and values, every layer's) in one kernel call: :class:`refimpl.models.kv_cache.KVCache`'s
    compaction after a tree's verification, where torch pays ~4 calls a buffer (~1.2 ms for SmolLM2's
    60). Each row's k positions are read before any is written, so overlaps are safe."""
    B, H, cap, D = buffers[0].shape
    src = src.to(device="cpu", dtype=torch.long).contiguous()
    ptrs = (ctypes.c_void_p * len(buffers))(*(b.data_ptr() for b in buffers))
    library().refimpl_move_slots(ptrs, len(buffers), B, H, cap, D, int(dst), src.data_ptr(), src.shape[1])


class LayerArgs(ctypes.Structure):
    """The arguments of one layer of ``refimpl_layers`` (``struct Layer`` in ``cpu_gemv.cpp``, field for field)."""

    _fields_ = ([(n, ctypes.c_int) for n in ("B", "Q", "P", "cap", "hidden", "H", "Hkv", "D", "I", "threads",
                                              "mask_batch", "mask_len")]
                + [("eps", ctypes.c_float), ("scale", ctypes.c_float)]
                + [(n, ctypes.c_void_p) for n in ("norm1", "w_qkv", "w_o", "norm2", "w_gate_up", "w_down", "x",
                                                   "cos2", "sin2", "mask", "out", "keys", "values",
                                                   "h", "t", "o", "gu", "a", "e", "norm_e")]
                + [("half", ctypes.c_int)]
                + [(n, ctypes.c_void_p) for n in ("s_qkv", "s_o", "s_gate_up", "s_down")])


class LayerStep:
    """One cached step of a Llama-recipe decoder, all its layers in one kernel call (``refimpl_layers``).

    Built once per step with what every layer shares: B rows of Q new tokens after P cached ones,
    the rotary tables ``cos2 = [cos, cos]``, ``sin2 = [-sin, sin]`` (B, Q, D), an additive ``mask``
    (B or 1, Q, P + Q) or None for the causal rule, and scratch buffers. :meth:`run` then runs, per layer,
    RMSNorm, the fused q/k/v product, rotary, the cache write, grouped-query attention, ``o_proj``
    with the residual, RMSNorm, the fused gate/up product, SwiGLU and ``down_proj`` with the
    residual -- the math of ``LlamaDecoderLayer`` -- in one OpenMP region. The caller checks the
    operands (CPU float32, contiguous, ``D <= 512``); :mod:`refimpl.models.lean_llama` does.

    ``embedded=True``: the first layer is EAGLE-3's draft layer (arXiv 2503.01840, §3.2; vLLM's
    ``llama_eagle3.py``), whose q/k/v product reads ``[norm_e(e); norm1(x)]`` (2 hidden wide: the
    normed token embedding ``e``, then the normed feature ``x``) while ``x`` stays the residual:
    :meth:`run` takes ``e`` and ``norm_e``. :mod:`refimpl.models.lean_draft` runs the EAGLE drafts' layer here.
    """

    def __init__(self, B, Q, P, hidden, heads, kv_heads, head_dim, inter, eps, scale, cos2, sin2, mask=None,
                 threads=None, embedded: bool = False):
        R, D = B * Q, head_dim
        self.keep = [cos2, sin2, mask] + [torch.empty(R, n, dtype=torch.float32, device="cpu") for n in
                                          ((1 + bool(embedded)) * hidden, (heads + 2 * kv_heads) * D, heads * D,
                                           2 * inter, inter)]
        h, t, o, gu, a = self.keep[3:]
        self.shape, self.embedded = (B, Q, hidden), bool(embedded)
        self.args = LayerArgs(B=B, Q=Q, P=P, hidden=hidden, H=heads, Hkv=kv_heads, D=D, I=inter,
                              threads=torch.get_num_threads() if threads is None else int(threads),
                              mask_batch=0 if mask is None else mask.shape[0],
                              mask_len=0 if mask is None else mask.shape[-1], eps=eps, scale=scale,
                              cos2=cos2.data_ptr(), sin2=sin2.data_ptr(), mask=None if mask is None else mask.data_ptr(),
                              h=h.data_ptr(), t=t.data_ptr(), o=o.data_ptr(), gu=gu.data_ptr(), a=a.data_ptr())

    def run(self, x: torch.Tensor, weights: list, caches: list, e: torch.Tensor | None = None,
            norm_e: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, Q, hidden) through ``len(weights)`` layers in one kernel call -> every layer's output
        (layers, B, Q, hidden). ``weights[i]`` = layer i's (input norm, W_qkv, W_o, post-attention
        norm, W_gate_up, W_down), the matrices :func:`pack`-ed, all four of one kind: fp32, fp16 or int8
        panels (plain (N, K) tensors are packed in fp32 at every call: slow, but right); ``caches[i]`` =
        its key and value buffers (B, Hkv, capacity, D), where the new keys and values are written at
        positions P .. P + Q. ``e`` (B, Q, hidden) and ``norm_e`` (hidden,): the first layer's token
        embedding and its norm, given exactly when the step was built ``embedded``."""
        if (e is None or norm_e is None) == self.embedded:
            raise ValueError(f"e and norm_e must be given exactly when the step is embedded ({self.embedded})")
        n = len(weights)
        outs = torch.empty(n, *self.shape, dtype=torch.float32, device="cpu")
        layers = (LayerArgs * n)()
        alive = []
        for i, (w, (keys, values)) in enumerate(zip(weights, caches)):
            layers[i] = self.args  # a copy of the shared fields
            a = layers[i]
            kind = w[1].kind if isinstance(w[1], Packed) else 0
            if not all(isinstance(m, Packed) and m.kind == kind for m in w[1:3] + w[4:6]):  # the one check a step pays
                if any(isinstance(m, Packed) and m.kind for m in w):
                    raise ValueError("weights: a layer's four matrices must all be fp32 panels, all fp16 or all int8")
                # plain tensors: packed here, each call
                w, kind = [m if j in (0, 3) or isinstance(m, Packed) else Packed(m) for j, m in enumerate(w)], 0
                alive.append(w)  # until the kernel has run
            a.norm1, a.w_qkv, a.w_o, a.norm2, a.w_gate_up, a.w_down = (t.data_ptr() for t in w)
            a.x = (x if i == 0 else outs[i - 1]).data_ptr()
            a.out, a.keys, a.values, a.cap = outs[i].data_ptr(), keys.data_ptr(), values.data_ptr(), keys.shape[2]
            a.half = kind
            if kind == 2:
                a.s_qkv, a.s_o, a.s_gate_up, a.s_down = (w[j].scale.data_ptr() for j in (1, 2, 4, 5))
            if i == 0 and self.embedded:
                a.e, a.norm_e = e.data_ptr(), norm_e.data_ptr()
        library().refimpl_layers(layers, n)
        return outs
