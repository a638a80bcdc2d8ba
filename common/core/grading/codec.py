"""Values as data between the grader and a sandbox: JSON with tags, nothing executable.

`encode(obj)` turns numbers, strings, lists, tuples, dicts, sets, bytes, tensors, NumPy arrays and scalars, dtypes,
dataclasses and named tuples of `common` into JSON-able data, and (with `handles`, on the grader's side) any other
object into a numbered handle: the other side gets a stand-in that asks for calls, attributes, items and iteration;
`decode(data)` builds them again. Decoding runs no code of the sender: no pickle, no eval; classes come only from
`common` modules, dtypes only from torch's and NumPy's numeric ones, and a tensor's bytes must match its shape.

Strict encoding (the grader's arguments) raises NotSendable for anything else; lenient encoding (a learner's results)
turns it into an `Opaque` that keeps the type name and a short repr, so a checker says what came back.
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import math

MAX_DEPTH = 40


class NotSendable(BaseException):
    """A grader-side argument that is not data (the exercise is then judged in the learner's kernel). A
    BaseException, so that no checker's `except Exception` takes it for the learner's error."""


class Opaque:
    """A learner's result that is not data: its type name and repr, for the verdict."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text


def _opaque_class(type_name: str):
    name = "".join(c for c in str(type_name) if c.isalnum() or c == "_")[:60] or "object"
    return type(name, (Opaque,), {})


def _is_function(obj) -> bool:
    import types
    return isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)) or \
        type(obj).__name__ == "partial"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _common_class(obj) -> str | None:
    cls = type(obj)
    mod = getattr(cls, "__module__", "") or ""
    if mod == "common" or mod.startswith("common."):
        return f"{mod}:{cls.__qualname__}"
    return None


def encode(obj, handles=None, strict: bool = True, _depth: int = 0):
    """JSON-able data for `obj`; `handles` (with .add(obj, kind) -> id) lets callables and iterators through."""
    if _depth > MAX_DEPTH:
        raise NotSendable("nested too deeply")
    again = lambda x: encode(x, handles, strict, _depth + 1)  # noqa: E731
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int) and type(obj) is int:
        return obj
    if type(obj) is float:
        return obj if math.isfinite(obj) else {"$": "f", "v": repr(obj)}
    if type(obj) is complex:
        return {"$": "complex", "v": [again(obj.real), again(obj.imag)]}
    if type(obj) is list:
        return [again(x) for x in obj]
    if type(obj) is tuple:
        return {"$": "tuple", "v": [again(x) for x in obj]}
    if type(obj) is dict:
        if all(type(k) is str for k in obj) and "$" not in obj:
            return {k: again(v) for k, v in obj.items()}
        return {"$": "dict", "v": [[again(k), again(v)] for k, v in obj.items()]}
    if type(obj) in (set, frozenset):
        return {"$": type(obj).__name__, "v": [again(x) for x in obj]}
    if type(obj) in (bytes, bytearray):
        return {"$": "bytes", "v": _b64(bytes(obj))}
    if type(obj) is range:
        return {"$": "range", "v": [obj.start, obj.stop, obj.step]}
    if type(obj) is slice:
        return {"$": "slice", "v": [again(obj.start), again(obj.stop), again(obj.step)]}
    special = _encode_array(obj, again, strict)
    if special is not None:
        return special
    cls = _common_class(obj)
    if cls and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"$": "dataclass", "cls": cls, "v": {f.name: again(getattr(obj, f.name))
                                                     for f in dataclasses.fields(obj)}}
    if cls and isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {"$": "namedtuple", "cls": cls, "v": [again(x) for x in obj]}
    if cls and isinstance(obj, enum.Enum):
        return {"$": "enum", "cls": cls, "v": obj.name}
    if isinstance(obj, enum.Enum) or isinstance(obj, (int, float, str, tuple, list, dict)):
        base = next(t for t in (bool, int, float, str, tuple, list, dict) if isinstance(obj, t))
        return again(base(obj))  # a subclass of a plain type travels as the plain type
    if handles is not None:  # the grader's own object: it stays there, the other side gets a stand-in
        kind = "stream" if getattr(obj, "streams_into_one_buffer", False) else "iterator" if hasattr(
            obj, "__next__") else "callable" if _is_function(obj) else "object"
        return {"$": "obj", "id": handles.add(obj), "kind": kind,
                "name": str(getattr(obj, "__name__", type(obj).__name__))[:100]}
    if strict:
        raise NotSendable(f"a {type(obj).__module__}.{type(obj).__qualname__} cannot be sent as data")
    try:
        text = repr(obj)[:300]
    except Exception:  # a learner's __repr__ that raises
        text = f"<{type(obj).__name__} object>"
    return {"$": "opaque", "type": type(obj).__name__, "v": text}


def _encode_array(obj, again, strict):
    """Tensors, NumPy arrays and scalars, dtypes and devices; None for anything else."""
    import sys
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided or obj.is_quantized:
                raise NotSendable(f"a {obj.layout} tensor cannot be sent as data")
            t = obj.detach().to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return {"$": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                    "v": _b64(raw), "grad": bool(obj.requires_grad), "device": obj.device.type}
        if isinstance(obj, torch.dtype):
            return {"$": "tdtype", "v": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.Size):
            return {"$": "tsize", "v": list(obj)}
        if isinstance(obj, torch.device):
            return {"$": "tdevice", "v": str(obj)}
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind not in "biufc":
                if strict:
                    raise NotSendable(f"a NumPy array of {obj.dtype} cannot be sent as data")
                return {"$": "list_of", "v": [again(x) for x in obj.tolist()]}
            return {"$": "ndarray", "dtype": obj.dtype.str, "shape": list(obj.shape),
                    "v": _b64(np.ascontiguousarray(obj).tobytes())}
        if isinstance(obj, np.generic) and obj.dtype.kind in "biufc":
            return {"$": "npscalar", "dtype": obj.dtype.str, "v": _b64(obj.tobytes())}
        if isinstance(obj, np.dtype) and obj.kind in "biufc":
            return {"$": "npdtype", "v": obj.str}
    return None


def _common_attr(path: str):
    mod, _, qual = str(path).partition(":")
    if not (mod == "common" or mod.startswith("common.")):
        raise ValueError(f"class {path!r} is not from the workbook")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def decode(data, stubs=None, _depth: int = 0):
    """The value `data` encodes; `stubs(kind, id, name)` builds a stand-in for a callback or an iterator."""
    if _depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    again = lambda x: decode(x, stubs, _depth + 1)  # noqa: E731
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [again(x) for x in data]
    if not isinstance(data, dict):
        raise ValueError(f"not encoded data: {type(data).__name__}")
    tag = data.get("$")
    if tag is None:
        return {k: again(v) for k, v in data.items()}
    v = data.get("v")
    if tag == "f":
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[v])
    if tag == "complex":
        return complex(float(again(v[0])), float(again(v[1])))
    if tag == "tuple":
        return tuple(again(x) for x in v)
    if tag == "list_of":
        return [again(x) for x in v]
    if tag == "dict":
        return {_hashable(again(k)): again(x) for k, x in v}
    if tag in ("set", "frozenset"):
        items = (_hashable(again(x)) for x in v)
        return set(items) if tag == "set" else frozenset(items)
    if tag == "bytes":
        return base64.b64decode(v)
    if tag == "range":
        return range(*(int(x) for x in v))
    if tag == "slice":
        return slice(*(again(x) for x in v))
    if tag in ("tensor", "tdtype", "tsize", "tdevice"):
        return _decode_torch(tag, data)
    if tag in ("ndarray", "npscalar", "npdtype"):
        return _decode_numpy(tag, data)
    if tag == "dataclass":
        cls = _common_attr(data["cls"])
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"{data['cls']!r} is not a dataclass")
        obj = cls.__new__(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        for name, x in v.items():
            if name in names:
                object.__setattr__(obj, name, again(x))
        return obj
    if tag == "namedtuple":
        cls = _common_attr(data["cls"])
        if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise ValueError(f"{data['cls']!r} is not a named tuple")
        return cls(*(again(x) for x in v))
    if tag == "enum":
        cls = _common_attr(data["cls"])
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise ValueError(f"{data['cls']!r} is not an Enum")
        return cls[v]
    if tag == "obj":
        if stubs is None:
            raise ValueError("an object handle cannot be received here")
        return stubs(str(data.get("kind", "object")), int(data["id"]), str(data.get("name", ""))[:100])
    if tag == "opaque":
        return _opaque_class(data.get("type", "object"))(str(data.get("type", "object")), str(v)[:300])
    raise ValueError(f"unknown tag {tag!r}")


def _hashable(x):
    if isinstance(x, list):
        return tuple(_hashable(i) for i in x)
    return x


def _decode_torch(tag, data):
    import torch
    v = data["v"]
    if tag == "tdtype":
        dt = getattr(torch, str(v), None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"unknown torch dtype {v!r}")
        return dt
    if tag == "tsize":
        return torch.Size(int(x) for x in v)
    if tag == "tdevice":
        return torch.device(str(v))
    dtype = _decode_torch("tdtype", {"v": data["dtype"]})
    shape = [int(s) for s in data["shape"]]
    raw = bytearray(base64.b64decode(v))
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise ValueError(f"a tensor of shape {shape} and {dtype} needs {numel * itemsize} bytes, got {len(raw)}")
    t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape) if numel else \
        torch.empty(shape, dtype=dtype)
    device = str(data.get("device", "cpu"))
    if device != "cpu" and getattr(torch, device, None) is not None and getattr(torch, device).is_available():
        t = t.to(device)
    if data.get("grad") and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _decode_numpy(tag, data):
    import numpy as np
    if tag == "npdtype":
        dt = np.dtype(str(data["v"]))
    else:
        dt = np.dtype(str(data["dtype"]))
    if dt.kind not in "biufc":
        raise ValueError(f"NumPy dtype {dt} is not numeric")
    if tag == "npdtype":
        return dt
    raw = base64.b64decode(data["v"])
    if tag == "npscalar":
        if len(raw) != dt.itemsize:
            raise ValueError("a NumPy scalar of the wrong size")
        return np.frombuffer(raw, dtype=dt)[0]
    shape = [int(s) for s in data["shape"]]
    if len(raw) != math.prod(shape) * dt.itemsize:
        raise ValueError(f"a NumPy array of shape {shape} and {dt} of the wrong size")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
