"""What a dtype spelling means: its canonical name (``"bfloat16"``), bytes per element, short name
(``"bf16"``) and whether it is floating point.

Accepts a `torch.dtype`, its names ``"bfloat16"`` / ``"torch.bfloat16"``, Kineto's and C++'s spellings
(``"c10::BFloat16"``, ``"float"``, ``"long int"``), and, through `SCALAR_TYPE_NAMES`, the compiled
recorder's ``c10::ScalarType`` codes. Needs no torch.
"""
from __future__ import annotations

# canonical name -> (bytes per element, short name, is floating point)
_DTYPES = {
    "float64": (8, "f64", True), "float32": (4, "f32", True), "float16": (2, "f16", True),
    "bfloat16": (2, "bf16", True), "float8_e4m3fn": (1, "f8e4m3", True), "float8_e5m2": (1, "f8e5m2", True),
    "float8_e4m3fnuz": (1, "f8e4m3", True), "float8_e5m2fnuz": (1, "f8e5m2", True),
    "float8_e8m0fnu": (1, "f8e8m0", True), "float4_e2m1fn_x2": (1, "f4x2", True),
    "complex128": (16, "c128", True), "complex64": (8, "c64", True), "complex32": (4, "c32", True),
    "int64": (8, "i64", False), "int32": (4, "i32", False), "int16": (2, "i16", False),
    "int8": (1, "i8", False), "uint8": (1, "u8", False), "uint16": (2, "u16", False),
    "uint32": (4, "u32", False), "uint64": (8, "u64", False), "bool": (1, "b8", False),
    "quint8": (1, "qu8", False), "qint8": (1, "qi8", False), "qint32": (4, "qi32", False),
}
# other spellings (Kineto's "Input type", C++ names) -> canonical
_ALIASES = {
    "float": "float32", "double": "float64", "half": "float16", "c10::half": "float16",
    "c10::bfloat16": "bfloat16", "long int": "int64", "long": "int64", "int": "int32",
    "short int": "int16", "short": "int16", "signed char": "int8", "unsigned char": "uint8",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "c10::float8_e4m3fn": "float8_e4m3fn", "c10::float8_e5m2": "float8_e5m2",
    "c10::float8_e4m3fnuz": "float8_e4m3fnuz", "c10::float8_e5m2fnuz": "float8_e5m2fnuz",
    "long long": "int64", "unsigned int": "uint32",
}
_DTYPE_CACHE: dict = {}

# c10::ScalarType in enum order (c10/core/ScalarType.h): the dtype codes recorder.cpp writes
SCALAR_TYPE_NAMES = (
    "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32", "complex64",
    "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16", "quint4x2", "quint2x4", "bits1x8", "bits2x4",
    "bits4x2", "bits8", "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz",
    "uint16", "uint32", "uint64",
)


def dtype_name(dtype) -> str:
    """Canonical dtype name (``"bfloat16"``) of a `torch.dtype` or a spelling of one; ``""`` if unknown."""
    hit = _DTYPE_CACHE.get(dtype)
    if hit is not None:
        return hit
    s = str(dtype).strip()
    low = s.lower()
    if low.startswith("torch."):
        low = low[6:]
    name = low if low in _DTYPES else _ALIASES.get(low, "")
    try:
        _DTYPE_CACHE[dtype] = name
    except TypeError:
        pass
    return name


def itemsize(dtype) -> int:
    """Bytes per element of `dtype` (0 when unknown)."""
    return _DTYPES.get(dtype_name(dtype), (0, "", False))[0]


def short_dtype_name(dtype) -> str:
    """Short name of `dtype` for a shapes string (``"bf16"``); ``"?"`` when unknown."""
    return _DTYPES.get(dtype_name(dtype), (0, "?", False))[1]


def is_floating(canonical_name: str) -> bool:
    """Whether the dtype of canonical name `canonical_name` (a `dtype_name` result) is floating point
    (complex included); False when unknown."""
    return _DTYPES.get(canonical_name, (0, "", False))[2]
