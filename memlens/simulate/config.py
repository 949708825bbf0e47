"""Caching-allocator settings, read the way users write them (``PYTORCH_CUDA_ALLOC_CONF``) or the way a
snapshot stores them (``allocator_settings``), plus the size arithmetic the allocator applies to requests.

The parsing follows c10's ``AllocatorConfig::parseArgs``: tokens are split on ``, : [ ]``; keys are
``max_split_size_mb``, ``max_non_split_rounding_mb``, ``garbage_collection_threshold``,
``roundup_power2_divisions`` (one power of two, or a list ``[256:1,512:2,>:8]`` keyed by MiB interval
starts), ``expandable_segments`` and settings without effect on placement (``backend``,
``release_lock_on_cudamalloc``, ``pinned_*``), which are accepted and ignored.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from memlens.errors import InputError

MiB = 1 << 20
K_MIN_BLOCK = 512  # every request is rounded to a multiple of this
K_SMALL_SIZE = MiB  # largest request served by the small pool
K_SMALL_BUFFER = 2 * MiB  # segment size (and expandable page size) of the small pool
K_LARGE_BUFFER = 20 * MiB  # segment for 1-10 MiB requests; expandable page size of the large pool
K_MIN_LARGE_ALLOC = 10 * MiB  # requests from here on get their own segment, rounded to 2 MiB
K_ROUND_LARGE = 2 * MiB
UNLIMITED = (1 << 64) - 1  # max_split_size when unset (SIZE_MAX in c10)
N_DIVISION_INTERVALS = 16  # roundup_power2_divisions has one entry per power of two from 1 MiB to 32 GiB

_IGNORED_KEYS = {"backend", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                 "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                 "pinned_num_register_threads", "pinned_use_background_threads",
                 "graph_capture_record_stream_reuse", "per_process_memory_fraction"}


@dataclass(frozen=True)
class AllocatorConfig:
    """The settings that change where the caching allocator puts blocks (sizes in bytes)."""

    max_split_size: int = UNLIMITED
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    # divisions per power-of-two interval [2**(20+i), 2**(21+i)) for i in 0..15 (0 or 1: no rounding)
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * N_DIVISION_INTERVALS)

    def divisions_for(self, size: int) -> int:
        """Number of power-of-two divisions that apply to a request of `size` bytes."""
        index = size.bit_length() - 1 - 20
        index = 0 if index < 0 else (N_DIVISION_INTERVALS - 1 if index >= N_DIVISION_INTERVALS else index)
        return self.roundup_power2_divisions[index]

    def to_conf_string(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` string that produces this configuration."""
        parts = []
        if self.max_split_size != UNLIMITED:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding_size != K_LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MiB}")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        if any(self.roundup_power2_divisions):
            items = ",".join(f"{1 << i}:{d}" for i, d in enumerate(self.roundup_power2_divisions))
            parts.append(f"roundup_power2_divisions:[{items}]")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        return ",".join(parts)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _tokens(text: str) -> list[str]:
    """Split like c10's lexArgs: separators , : [ ] are tokens of their own; spaces vanish."""
    return [t for t in re.split(r"([,:\[\]])", text.replace(" ", "")) if t]


def _parse_divisions(tokens: list[str], i: int, where: str) -> tuple[tuple[int, ...], int]:
    """Parse the value of roundup_power2_divisions starting at tokens[i]; return (table, last index)."""
    table = [0] * N_DIVISION_INTERVALS
    if tokens[i] != "[":
        value = _int(tokens[i], "roundup_power2_divisions", where)
        if not _is_power_of_two(value):
            raise InputError(f"{where}: roundup_power2_divisions must be a power of two, got {value}")
        return (value,) * N_DIVISION_INTERVALS, i
    first, last_index = True, 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        key = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise InputError(f"{where}: roundup_power2_divisions list needs entries like 256:4")
        value = _int(tokens[i + 2], "roundup_power2_divisions", where)
        if value != 0 and not _is_power_of_two(value):
            raise InputError(f"{where}: roundup_power2_divisions values must be 0 or a power of two")
        if key == ">":  # every interval above the last one named (torch >= 2.6; older ones included it)
            table[last_index + 1:] = [value] * (N_DIVISION_INTERVALS - last_index - 1)
        else:
            start_mb = _int(key, "roundup_power2_divisions interval", where)
            if not _is_power_of_two(start_mb):
                raise InputError(f"{where}: roundup_power2_divisions intervals must be powers of two (MiB)")
            index = min(start_mb.bit_length() - 1, N_DIVISION_INTERVALS - 1)
            if first:  # the first entry also covers every smaller interval
                table[:index] = [value] * index
                first = False
            table[index] = value
            last_index = index
        i += 3
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    if i >= len(tokens):
        raise InputError(f"{where}: roundup_power2_divisions list is missing its closing ']'")
    return tuple(table), i


def _int(token: str, key: str, where: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise InputError(f"{where}: {key} expects an integer, got '{token}'") from None


def _bool(token: str, key: str, where: str) -> bool:
    if token not in ("True", "False", "true", "false", "1", "0"):
        raise InputError(f"{where}: {key} expects True or False, got '{token}'")
    return token in ("True", "true", "1")


def parse_conf_string(text: str, where: str = "PYTORCH_CUDA_ALLOC_CONF") -> AllocatorConfig:
    """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string such as ``"expandable_segments:True,max_split_size_mb:128"``.

    Raises `InputError` on unknown keys or malformed values, as torch refuses them at start-up.
    """
    tokens = _tokens(text or "")
    values: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise InputError(f"{where}: expected 'key:value' at '{key}' in '{text}'")
        raw = tokens[i + 2]
        if key == "max_split_size_mb":
            mb = _int(raw, key, where)
            if mb < K_LARGE_BUFFER // MiB:
                raise InputError(f"{where}: max_split_size_mb must be >= 20, got {mb}")
            values["max_split_size"] = mb * MiB
        elif key == "max_non_split_rounding_mb":
            mb = _int(raw, key, where)
            if mb < K_LARGE_BUFFER // MiB:
                raise InputError(f"{where}: max_non_split_rounding_mb must be >= 20, got {mb}")
            values["max_non_split_rounding_size"] = mb * MiB
        elif key == "garbage_collection_threshold":
            try:
                threshold = float(raw)
            except ValueError:
                raise InputError(f"{where}: garbage_collection_threshold expects a number, got '{raw}'") from None
            if not 0.0 < threshold < 1.0:
                raise InputError(f"{where}: garbage_collection_threshold must be in (0, 1), got {threshold}")
            values["garbage_collection_threshold"] = threshold
        elif key == "roundup_power2_divisions":
            values["roundup_power2_divisions"], i = _parse_divisions(tokens, i + 2, where)
            i -= 2  # realign: the common step below skips "key : value"
        elif key == "expandable_segments":
            values["expandable_segments"] = _bool(raw, key, where)
        elif key not in _IGNORED_KEYS:
            raise InputError(f"{where}: unknown allocator option '{key}'")
        i += 3
        if i < len(tokens):
            if tokens[i] != ",":
                raise InputError(f"{where}: expected ',' after the value of '{key}' in '{text}'")
            i += 1
    return AllocatorConfig(**values)


def _from_settings_dict(settings: Mapping[str, Any], where: str) -> AllocatorConfig:
    """Read a snapshot's ``allocator_settings`` (bytes, booleans, a MiB-keyed divisions dict) or a user dict
    of conf keys (``{"max_split_size_mb": 128, "expandable_segments": True}``)."""
    if any(k.endswith("_mb") or k == "roundup_power2_divisions" and not isinstance(v, Mapping)
           for k, v in settings.items()):
        text = ",".join(f"{k}:{_dict_value(v)}" for k, v in settings.items())
        return parse_conf_string(text, where)
    config = AllocatorConfig()
    raw_conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    if isinstance(raw_conf, str) and raw_conf.strip():
        config = parse_conf_string(raw_conf, where)
    changes: dict[str, Any] = {}
    split = settings.get("max_split_size")
    if isinstance(split, (int, float)) and split > 0:
        changes["max_split_size"] = int(split)
    rounding = settings.get("max_non_split_rounding_size")
    if isinstance(rounding, (int, float)) and rounding > 0:
        changes["max_non_split_rounding_size"] = int(rounding)
    gc = settings.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and gc > 0:
        changes["garbage_collection_threshold"] = float(gc)
    if "expandable_segments" in settings:
        changes["expandable_segments"] = bool(settings["expandable_segments"])
    divisions = settings.get("roundup_power2_divisions")
    if isinstance(divisions, Mapping) and divisions:
        table = list(config.roundup_power2_divisions)
        for key, value in divisions.items():
            index = min(int(key).bit_length() - 1, N_DIVISION_INTERVALS - 1)
            table[index] = int(value)
        changes["roundup_power2_divisions"] = tuple(table)
    return replace(config, **changes)


def _dict_value(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def parse_conf(conf: str | Mapping[str, Any] | AllocatorConfig | None,
               where: str = "PYTORCH_CUDA_ALLOC_CONF") -> AllocatorConfig:
    """Any way of giving settings -> `AllocatorConfig`: None (defaults), a conf string, a snapshot's
    ``allocator_settings`` dict, a dict of conf keys, or an `AllocatorConfig`."""
    if conf is None:
        return AllocatorConfig()
    if isinstance(conf, AllocatorConfig):
        return conf
    if isinstance(conf, str):
        return parse_conf_string(conf, where)
    if isinstance(conf, Mapping):
        return _from_settings_dict(conf, where)
    raise InputError(f"{where}: cannot read allocator settings from a {type(conf).__name__}")


def round_size(size: int, config: AllocatorConfig) -> int:
    """Bytes the allocator reserves for a request of `size` bytes (c10 ``round_size``)."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    divisions = config.divisions_for(size)
    if divisions > 1 and size > K_MIN_BLOCK * divisions:
        return roundup_power2_next_division(size, divisions)
    return K_MIN_BLOCK * ((size + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round `size` up to the next of `divisions` equal steps between the surrounding powers of two."""
    if _is_power_of_two(size):
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded_floor = size & ~(step - 1)
    return size if rounded_floor == size else rounded_floor + step


def allocation_size(size: int) -> int:
    """Size of the new segment cudaMalloc'ed for a rounded request of `size` bytes (``get_allocation_size``)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)
