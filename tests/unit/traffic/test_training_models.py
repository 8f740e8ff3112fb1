"""The shipped parameter shape tables: totals against the published counts, FLOPs against
hand arithmetic, and the tables equal to what scripts/model_shapes.py writes."""
from __future__ import annotations

import importlib.util
import json

import pytest

from testbed.traffic.training.models import SHAPES_DIR, load_model, model_from_dict, scaled_elems

FLOAT_REL = 1e-12
RESNET50_GMACS = 4.09   # torchvision's published figure for resnet50 (multiply-adds)
MACS_REL = 0.01


def load_script():
    path = SHAPES_DIR.parents[2] / "scripts" / "model_shapes.py"
    spec = importlib.util.spec_from_file_location("model_shapes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resnet50_total_matches_the_anchor():
    model = load_model("resnet50")
    assert model.total_params == 25_557_032
    assert round(model.total_params / 1e6, 3) == 25.557
    assert round(sum(model.param_bytes()) / 1e6) == 102  # about 102 MB in fp32
    assert len(model.params) == 161
    assert model.params[0].name == "conv1.weight" and model.params[0].shape == (64, 3, 7, 7)
    assert [p.name for p in model.params[-2:]] == ["fc.weight", "fc.bias"]


def test_gpt2_small_total_matches_the_anchor():
    model = load_model("gpt2_small")
    assert model.total_params == 124_439_808
    assert round(model.total_params / 1e6, 2) == 124.44
    assert round(sum(model.param_bytes()) / 1e6) == 498
    assert len(model.params) == 2 + 12 * 12 + 2
    assert model.params[0].shape == (50257, 768)  # wte, tied to the LM head


def test_gpt2_total_by_hand():
    d, vocab, ctx, ff = 768, 50257, 1024, 3072
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d)
    assert block == 7_087_872
    assert vocab * d + ctx * d + 12 * block + 2 * d == 124_439_808


def test_resnet50_flops_match_the_published_multiply_adds():
    model = load_model("resnet50")
    assert model.forward_flops / 2 / 1e9 == pytest.approx(RESNET50_GMACS, rel=MACS_REL)
    conv1 = model.params[0]
    assert conv1.forward_flops == 2 * 64 * 3 * 7 * 7 * 112 * 112  # at its 112x112 output


def test_gpt2_flops_per_token_by_hand():
    model = load_model("gpt2_small")
    d, vocab, ctx, layers = 768, 50257, 1024, 12
    matrices = layers * (d * 3 * d + d * d + 2 * d * 4 * d)
    small = layers * (3 * d + d + 4 * d + d + 4 * d) + 2 * d  # biases and layer norms, 1 per element
    attention = layers * 2 * ctx * d
    lm_head = 2 * d * vocab
    assert model.forward_flops == 2 * matrices + small + attention + lm_head


def test_shipped_tables_are_what_the_script_writes(tmp_path):
    script = load_script()
    assert script.main(["--out-dir", str(tmp_path)]) == 0
    for name in ("resnet50", "gpt2_small"):
        written = json.loads((tmp_path / f"{name}.json").read_text())
        shipped = json.loads((SHAPES_DIR / f"{name}.json").read_text())
        assert written["params"] == shipped["params"]
        assert written["total_params"] == shipped["total_params"]
        assert "architecture" in shipped["source"] or "local" in shipped["source"]


def test_unknown_models_are_refused():
    with pytest.raises(ValueError, match="unknown model"):
        load_model("bert")


def test_model_from_dict_and_scaled_elems():
    model = model_from_dict({"model": "toy", "params": [{"name": "w", "shape": [3, 4]},
                                                         {"name": "b", "shape": [4]}]})
    assert model.total_params == 16 and model.param_bytes() == [48, 16]
    assert scaled_elems(4_000_000, 0.01) == 10_000   # 40 kB of float32
    assert scaled_elems(100, 0.001) == 1              # never an empty message
