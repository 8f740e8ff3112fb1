"""Parameter shape tables of the models whose training traffic the patterns reproduce.

The tables (``shapes/<model>.json``) are written by ``scripts/model_shapes.py``: every
parameter tensor in registration order with its shape and the forward FLOPs attributed to
it (per 224x224 image for ResNet-50, per token for GPT-2). Published totals: ResNet-50
25.557 M parameters (about 102 MB in fp32), GPT-2 small 124.44 M (about 498 MB).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

SHAPES_DIR = Path(__file__).resolve().with_name("shapes")
MODELS = ("resnet50", "gpt2_small")
FP32_BYTES = 4


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    forward_flops: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelShapes:
    name: str
    params: tuple[Param, ...]
    source: str = ""
    forward_flops_per: str = ""

    @property
    def total_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def forward_flops(self) -> int:
        return sum(p.forward_flops for p in self.params)

    def param_bytes(self, bytes_per_param: int = FP32_BYTES) -> list[int]:
        """Bytes of every parameter's gradient, in registration order."""
        return [p.numel * bytes_per_param for p in self.params]


def model_from_dict(table: dict) -> ModelShapes:
    return ModelShapes(table["model"],
                       tuple(Param(p["name"], tuple(p["shape"]), p.get("forward_flops", 0))
                             for p in table["params"]),
                       table.get("source", ""), table.get("forward_flops_per", ""))


def load_model(name: str) -> ModelShapes:
    """A shipped table by name (``MODELS``)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return model_from_dict(json.loads((SHAPES_DIR / f"{name}.json").read_text()))


def scaled_elems(size_bytes: int, scale: float, itemsize: int = FP32_BYTES) -> int:
    """Elements that carry ``size_bytes * scale`` bytes (at least one), so a scaled-down run
    keeps every message of the full model, smaller."""
    return max(1, round(size_bytes * scale / itemsize))
