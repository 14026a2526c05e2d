"""The served configuration a site's `when` reads (standard library only): from `vllm serve`
arguments (the image's start) or from `--served key=value,...` (apply, check)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

# What `when` may ask about the served configuration.
WHEN_KEYS: tuple[str, ...] = (
    "quantization",
    "kv_cache_dtype",
    "speculative",
    "architecture",
    "model",
    "dtype",
)


_SERVE_FLAGS = {
    "--quantization": "quantization",
    "-q": "quantization",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--dtype": "dtype",
    "--model": "model",
    "--tool-call-parser": "tool_call_parser",
    "--reasoning-parser": "reasoning_parser",
}


def served_from_args(args: Sequence[str]) -> dict[str, str]:
    """The served configuration `when` reads, from `vllm serve` arguments: quantization,
    kv_cache_dtype, dtype, model (the first positional argument or --model), tool_call_parser,
    reasoning_parser, speculative
    (the method of --speculative-config), architecture and model_type (--hf-overrides
    architectures, model_type; else the model's config decides them at start:
    `patchset.kernel.modelconfig`)."""
    served: dict[str, str] = {}
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        key, _, value = arg.partition("=")
        has_value = "=" in arg
        if key.startswith("-") and not has_value and i + 1 < len(items):
            value = items[i + 1]
        if key in _SERVE_FLAGS:
            served[_SERVE_FLAGS[key]] = value.lower()
        elif key == "--speculative-config":
            method = _json_key(value, "method")
            if method:
                served["speculative"] = method.lower()
        elif key == "--hf-overrides":
            archs = _json_key(value, "architectures")
            if archs:
                served["architecture"] = archs.lower()
            kind = _json_key(value, "model_type")
            if kind:
                served["model_type"] = kind.lower()
        elif not arg.startswith("-") and "model" not in served and i == 0:
            served["model"] = arg.lower()
        i += 1 if has_value or not key.startswith("-") else 2
    return served


def _json_key(value: str, key: str) -> str:
    try:
        data = json.loads(value)
    except ValueError:
        return ""
    found = data.get(key) if isinstance(data, dict) else None
    if isinstance(found, list) and found:
        found = found[0]
    return found if isinstance(found, str) else ""


def parse_served(text: str, keys: Sequence[str] = WHEN_KEYS) -> dict[str, str]:
    """`--served quantization=auto_round,speculative=mtp` as a dict (each key one of
    `keys`); raises ValueError."""
    served: dict[str, str] = {}
    for part in shlex.split(text.replace(",", " ")):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not value:
            raise ValueError(f"{part!r}: expected key=value")
        if key not in keys:
            raise ValueError(f"{key!r} is not one of {', '.join(keys)}")
        served[key] = value.strip().lower()
    return served


__all__ = ["WHEN_KEYS", "parse_served", "served_from_args"]
