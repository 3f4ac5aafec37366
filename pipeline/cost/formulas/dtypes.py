"""Element dtypes: the spellings Kineto and torch use, normalised to one short name each.

``Input type`` holds C++ type names (``c10::BFloat16``, ``float``), record_param_comms' ``dtype``
holds c10::ScalarType names, Concrete Inputs print a dtype argument as its ScalarType code; all map
to ``bf16``, ``fp32``, ... so that `DTYPE_SIZE` gives the bytes of one element.
"""

from __future__ import annotations

from typing import Any

DTYPE_SIZE = {
    "bf16": 2,
    "fp16": 2,
    "fp32": 4,
    "fp64": 8,
    "fp8": 1,
    "fp4x2": 1,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
}
FLOATING = frozenset({"bf16", "fp16", "fp32", "fp64", "fp8", "fp4x2", "complex32", "complex64", "complex128"})
# Kineto "Input type" strings (C++ type names), c10::ScalarType names (record_param_comms "dtype"),
# torch dtype names; all lower case, "c10::" / "torch." prefixes removed before lookup.
_DTYPE_ALIASES = {
    "float": "fp32",
    "float32": "fp32",
    "double": "fp64",
    "float64": "fp64",
    "half": "fp16",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "float8_e8m0fnu": "fp8",
    "float4_e2m1fn_x2": "fp4x2",
    "complex<half>": "complex32",
    "complexhalf": "complex32",
    "complex<float>": "complex64",
    "complexfloat": "complex64",
    "complex<double>": "complex128",
    "complexdouble": "complex128",
    "bool": "bool",
    "signed char": "int8",
    "char": "int8",
    "unsigned char": "uint8",
    "byte": "uint8",
    "short int": "int16",
    "short": "int16",
    "short unsigned int": "uint16",
    "unsigned short": "uint16",
    "int": "int32",
    "unsigned int": "uint32",
    "long int": "int64",
    "long": "int64",
    "int64_t": "int64",
    "long long": "int64",
    "long unsigned int": "uint64",
    "unsigned long": "uint64",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    # HCCL's data types (msprof HCCL_DATA_TYPE_TABLE): FP32, FP16, BFP16, INT8, ... HIF8, FP8E4M3
    "bfp16": "bf16",
    "hif8": "fp8",
    "fp8e4m3": "fp8",
    "fp8e5m2": "fp8",
    "fp8e8m0": "fp8",
}
# c10::ScalarType codes, as Concrete Inputs print a dtype argument (`dtype=torch.bfloat16` -> "15").
SCALAR_TYPE_CODES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "fp16",
    6: "fp32",
    7: "fp64",
    8: "complex32",
    9: "complex64",
    10: "complex128",
    11: "bool",
    12: "qint8",
    13: "quint8",
    14: "qint32",
    15: "bf16",
    23: "fp8",
    24: "fp8",
    25: "fp8",
    26: "fp8",
    27: "uint16",
    28: "uint32",
    29: "uint64",
    44: "fp8",
    45: "fp4x2",
}


def normalize_dtype(name: Any) -> str | None:
    """``c10::BFloat16`` / ``BFloat16`` / ``torch.bfloat16`` / ``bf16`` -> ``bf16``; unknown -> None."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower().replace("c10::", "").removeprefix("torch.")  # c10::complex<c10::Half>
    if key in DTYPE_SIZE:
        return key
    return _DTYPE_ALIASES.get(key)
