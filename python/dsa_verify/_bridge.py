"""The Python side of each op call of a Python backend (used by dsa_verify._core.PyBackend).

The C++ adapter hands over inputs as DLPack capsules of host tensors; here they become torch
tensors on the backend's device (one bulk copy each, none on the host), the backend's method
is called with SPEC argument names, and its outputs are checked and handed back as capsules
of host tensors (one bulk copy each from a device). Exceptions never cross into C++:
NotImplementedError is reported as "not supported" (a skip); anything else as an error
carrying the Python traceback (a failure), SystemExit and a KeyboardInterrupt the kernel
raised itself included (fresh16 F2: sys.exit(0) in a kernel stopped the audit as if the user
had pressed Ctrl-C); only a KeyboardInterrupt of a real SIGINT stops the audit.

SPEC §10 ops (fp8_indexer_scores, paged_indexer_scores, sparse_mla_fp8_fwd): FP8 tensors are
handed over as torch.uint8 bytes (the format in the scalar `fp8_format`, "e4m3fn" or "e5m2"),
on every torch version: DLPack has no FP8 type code in torch 1.13, and on torch >= 2.1 a
kernel reinterprets them for free with `t.view(torch.float8_e4m3fn)` / `torch.float8_e5m2`.
"""
import signal
import threading
import traceback

# torch is imported where a Bridge first needs it (constructing one), not with this module: a
# command that stops at a usage error (`python3 -m dsa_verify audit --timeout 0`, the pytest
# plugin's option checks) never pays for importing torch (~2 s of CPU per process).

OPS = ("indexer_scores", "indexer_scores_backward", "topk", "sparse_mla_fwd", "sparse_mla_bwd",
       "indexer_kl_loss", "fp8_indexer_scores", "paged_indexer_scores", "sparse_mla_fp8_fwd")
# The SPEC §10 inference ops (FP8 bytes as torch.uint8, paged KV).
FP8_OPS = ("fp8_indexer_scores", "paged_indexer_scores", "sparse_mla_fp8_fwd")
# Every output of each op, SPEC order (sparse_mla_bwd's dsink only exists with attn_sink).
OUTPUTS = {
    "indexer_scores": ("scores",),
    "indexer_scores_backward": ("dq_idx", "dk_idx", "dw"),
    "topk": ("indices",),
    "sparse_mla_fwd": ("out", "lse", "max_logits"),
    "sparse_mla_bwd": ("dq", "dkv", "dsink"),
    "indexer_kl_loss": ("loss", "d_scores"),
    "fp8_indexer_scores": ("scores",),
    "paged_indexer_scores": ("scores",),
    "sparse_mla_fp8_fwd": ("out", "lse", "max_logits"),
}
# Inputs whose dtype is the kernel's choice (the rest are fp32 / int by contract). In the §10
# ops the FP8 bytes are uint8 by contract (their format is `fp8_format`): only q is checked.
DATA_INPUTS = ("q_idx", "k_idx", "q", "kv", "dout")
FP8_DATA_INPUTS = ("q",)
FP8_FORMATS = ("e4m3fn", "e5m2")
# The dtypes an output may have (those DLPack hands to C++), by name (_dtype_name).
_DLPACK_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "uint8")
TIE_BREAKS = ("any", "small", "large")


class OutputError(Exception):
    """An output that breaks the contract's form (reported without a traceback)."""


def _dtype_name(d):
    return str(d).replace("torch.", "")


class _SigintWatch:
    """Tells a KeyboardInterrupt of a real SIGINT from one the kernel raised itself, during one
    call. A signal's handler runs only in the main thread: in any other thread (the in-process
    audit runs each task in a worker thread) a KeyboardInterrupt is always the kernel's. In the
    main thread (replay, an isolated worker) Python's default SIGINT handler is wrapped for the
    call, recording that the signal came (a handler someone else installed is left alone: its
    KeyboardInterrupt counts as a signal's). received: True when the signal came, or may have."""

    def __init__(self):
        self.received, self._previous = False, None
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            self.received = True  # not ours to tell: a KeyboardInterrupt stops the audit, as before
            return

        def record(signum, frame):
            self.received = True
            signal.default_int_handler(signum, frame)
        self._previous = signal.signal(signal.SIGINT, record)

    def restore(self):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class Bridge:
    """Wraps a backend object for the C++ adapter.

    backend: any object with methods named after the ops (OPS) taking SPEC argument names as
    keywords. Optional attributes: name (str), deterministic (bool, default True: identical
    inputs must give identical bytes, SPEC §3.5), outputs ({op: names it returns}, SPEC §9
    complete outputs), tie_breaks (subset of TIE_BREAKS, default all), dtypes (torch dtypes or
    names of the data inputs it accepts, default any; in the §10 ops only q is a data input,
    the FP8 bytes are always uint8), fp8_formats (subset of FP8_FORMATS the FP8 indexer ops
    accept, default both: cases in another format are skipped), fp8_reduced_accumulation
    (bool, default False: True for tensor cores that accumulate FP8 products with fewer
    mantissa bits than fp32, judged by that table row and noted, SPEC §10).
    device: "cpu" or "cuda[:n]": where input tensors are placed. Raises ValueError naming a
    bad attribute value.
    """

    def __init__(self, backend, device="cpu"):
        import torch
        self.backend = backend
        self.device = torch.device(device)
        name = getattr(backend, "name", None)
        self.name = str(name() if callable(name) else name) if name else type(backend).__name__
        self.deterministic = bool(getattr(backend, "deterministic", True))
        outputs = getattr(backend, "outputs", None) or {}
        if not isinstance(outputs, dict):
            raise ValueError(f"backend '{self.name}': attribute 'outputs' is {type(outputs).__name__}, "
                             "expected a dict {op: [output names]}")
        for op, names in outputs.items():
            if op not in OUTPUTS:
                raise ValueError(f"backend '{self.name}': outputs names op '{op}', expected one of {', '.join(OPS)}")
            bad = [n for n in names if n not in OUTPUTS[op]]
            if bad:
                raise ValueError(f"backend '{self.name}': outputs['{op}'] names {bad}, expected a subset of "
                                 f"{list(OUTPUTS[op])}")
            twice = sorted({n for n in names if list(names).count(n) > 1})
            if twice:  # as the CLI's --outputs out,out: a usage error, never merged silently
                raise ValueError(f"backend '{self.name}': outputs['{op}'] names {twice} twice, expected each "
                                 f"output name once")
        self.outputs = {op: tuple(names) for op, names in outputs.items()}
        self._check_shared_outputs()
        ties = getattr(backend, "tie_breaks", None)
        self.tie_breaks = tuple(ties) if ties else TIE_BREAKS
        bad = [t for t in self.tie_breaks if t not in TIE_BREAKS]
        if bad:
            raise ValueError(f"backend '{self.name}': tie_breaks has {bad}, expected a subset of {list(TIE_BREAKS)}")
        dtypes = getattr(backend, "dtypes", None)
        self.dtypes = tuple(_dtype_name(d) for d in dtypes) if dtypes else None
        formats = getattr(backend, "fp8_formats", None)
        self.fp8_formats = tuple(formats) if formats else FP8_FORMATS
        bad = [f for f in self.fp8_formats if f not in FP8_FORMATS]
        if bad:
            raise ValueError(f"backend '{self.name}': fp8_formats has {bad}, expected a subset of {list(FP8_FORMATS)}")
        self.fp8_reduced_accumulation = bool(getattr(backend, "fp8_reduced_accumulation", False))

    def _check_shared_outputs(self):
        """The audit's provided outputs are names (the CLI's --outputs): two ops the backend has
        that share an output name (sparse_mla_fwd / sparse_mla_fp8_fwd: out, lse, max_logits)
        must declare it alike, else one op's declaration would silently apply to the other."""
        have = [op for op in OPS if self.supports(op)]
        for i, a in enumerate(have):
            for b in have[i + 1:]:
                shared = [n for n in OUTPUTS[a] if n in OUTPUTS[b]]
                da, db = self._provided(a, shared), self._provided(b, shared)
                if da != db:
                    raise ValueError(
                        f"backend '{self.name}': outputs declares {a} -> {da} but {b} -> {db}; ops that share "
                        f"output names must declare them alike (declare both in outputs, or leave one op out)")

    def unavailable_reason(self):
        import torch
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return "device 'cuda' requested but torch.cuda.is_available() is False"
        return ""

    def supports(self, op):
        return callable(getattr(self.backend, op, None))

    def _to_torch(self, tensors):
        from torch.utils import dlpack as _dlpack
        kw = {}
        for name, cap in tensors.items():
            kw[name] = None if cap is None else _dlpack.from_dlpack(cap).to(self.device)
        return kw

    def _check_supported(self, op, kw, scalars):
        if self.dtypes is not None:
            for n in (FP8_DATA_INPUTS if op in FP8_OPS else DATA_INPUTS):
                t = kw.get(n)
                if t is not None and _dtype_name(t.dtype) not in self.dtypes:
                    return f"backend '{self.name}' declares dtypes {list(self.dtypes)}; input '{n}' is {_dtype_name(t.dtype)}"
        if "fp8_format" in scalars and scalars["fp8_format"] not in self.fp8_formats:
            return (f"backend '{self.name}' declares fp8_formats {list(self.fp8_formats)}; case has "
                    f"'{scalars['fp8_format']}' bytes")
        if op == "topk" and scalars["tie_break"] not in self.tie_breaks:
            return f"backend '{self.name}' declares tie_breaks {list(self.tie_breaks)}; case asks for '{scalars['tie_break']}'"
        return ""

    def _own_forward(self, kw, scalars):
        """out, lse of the backend's own forward for its backward (SPEC §5), or (None, None)."""
        if not self.supports("sparse_mla_fwd"):
            return None, None
        fwd_kw = {k: v for k, v in kw.items() if k != "dout"}
        try:
            res = self.backend.sparse_mla_fwd(**fwd_kw, **scalars)
        except NotImplementedError:
            return None, None
        named = self._named("sparse_mla_fwd", res, OUTPUTS["sparse_mla_fwd"])
        return named.get("out"), named.get("lse")

    def _provided(self, op, names):
        declared = self.outputs.get(op)
        return [n for n in names if declared is None or n in declared]

    def _named(self, op, result, names):
        """Maps a method's result (tensor, tuple/list in SPEC order, or dict) to {name: value}."""
        import torch
        provided = self._provided(op, names)
        if isinstance(result, torch.Tensor):
            result = (result,)
        if isinstance(result, dict):
            unknown = [k for k in result if k not in OUTPUTS[op]]
            if unknown:
                raise OutputError(f"returned outputs {unknown}; {op} defines {list(OUTPUTS[op])}")
            return dict(result)
        if isinstance(result, (tuple, list)):
            values = list(result)
            while len(values) > len(provided) and values[-1] is None:
                values.pop()  # e.g. (dq, dkv, None) without a sink
            if len(values) != len(provided):
                hint = ("" if op in self.outputs else
                        f"; a kernel that returns only some outputs declares them: outputs = {{'{op}': [...]}}")
                raise OutputError(f"returned {len(values)} outputs, expected {len(provided)} ({', '.join(provided)}){hint}")
            return dict(zip(provided, values))
        raise OutputError(f"returned {type(result).__name__}, expected a torch.Tensor, a tuple of tensors "
                          f"({', '.join(provided)}) or a dict by output name")

    def call(self, op, tensors, scalars, names):
        """Runs backend.<op>; returns ("ok", {name: capsule}) | ("not_supported", why) |
        ("invalid_argument", text) (the kernel raised ValueError: its documented rejection of bad
        input, SPEC §10) | ("error", text)."""
        import torch
        from torch.utils import dlpack as _dlpack
        sigint = _SigintWatch()
        try:
            kw = self._to_torch(tensors)
            why = self._check_supported(op, kw, scalars)
            if why:
                return ("not_supported", why)
            if op == "sparse_mla_bwd":
                kw["out"], kw["lse"] = self._own_forward(kw, scalars)
            try:
                result = getattr(self.backend, op)(**kw, **scalars)
            except ValueError:
                return ("invalid_argument", "raised\n" + traceback.format_exc().rstrip())
            named = self._named(op, result, names)
            caps = {}
            for n in self._provided(op, names):
                t = named.get(n)
                if t is None:
                    raise OutputError(f"output '{n}' is missing" + (" (declared in outputs)" if op in self.outputs else ""))
                if not isinstance(t, torch.Tensor):
                    raise OutputError(f"output '{n}' is {type(t).__name__}, expected a torch.Tensor")
                if _dtype_name(t.dtype) not in _DLPACK_DTYPES:
                    raise OutputError(f"output '{n}' has dtype {_dtype_name(t.dtype)}, expected a floating dtype "
                                      "(int32 for indices)")
                if not t.is_contiguous():
                    raise OutputError(f"output '{n}' is not contiguous (shape {list(t.shape)}, strides "
                                      f"{list(t.stride())}); return a contiguous row-major tensor (.contiguous())")
                t = t.detach()
                if t.device.type != "cpu":
                    t = t.cpu()
                caps[n] = _dlpack.to_dlpack(t)
            return ("ok", caps)
        except NotImplementedError as e:
            return ("not_supported", f"{self.name}.{op} raised NotImplementedError" + (f": {e}" if str(e) else ""))
        except OutputError as e:
            return ("error", str(e))
        except Exception:  # noqa: BLE001 - every other error is the kernel's failure, with its traceback
            return ("error", "raised\n" + traceback.format_exc().rstrip())
        except (SystemExit, KeyboardInterrupt) as e:
            if isinstance(e, KeyboardInterrupt) and sigint.received:
                raise  # Ctrl-C (or SIGINT) while the kernel ran: the audit stops (run_task re-raises it)
            what = f"SystemExit({e.code!r})" if isinstance(e, SystemExit) else "KeyboardInterrupt without a SIGINT"
            return ("error", f"raised {what}: a kernel must not end the process; a failed case, the audit goes on\n" +
                    traceback.format_exc().rstrip())
        finally:
            sigint.restore()
