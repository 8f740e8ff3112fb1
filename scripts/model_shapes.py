"""Write the parameter shape tables of ResNet-50 and GPT-2 small used by the training patterns
(traffic/training/shapes/*.json).

Each table lists every parameter tensor in registration order (the order
``model.named_parameters()`` yields, which DDP buckets in reverse) with its shape and the
forward FLOPs attributed to it. Shapes come from the locally installed model definition when
there is one (torchvision's ``resnet50(weights=None)``, transformers' ``GPT2LMHeadModel``
with the default ``GPT2Config``; nothing is downloaded), otherwise from the architecture
written out layer by layer below; with both, they must agree. FLOPs always come from the
written-out architecture:
- ResNet-50 (He et al. 2016, torchvision v1.5: stride on the 3x3 convolution), one 224x224
  image: a convolution 2*Cout*Cin*k*k*H*W at its output size, batch norm one multiply
  (weight) and one add (bias) per output element, the classifier 2*2048*1000 plus 1000.
- GPT-2 small (Radford et al. 2019; 12 layers, d=768, 12 heads, vocabulary 50257, context
  1024), one token at full context: a matrix 2 FLOPs per weight, biases and layer norms one
  per element, attention scores and their weighted sum 2*n_ctx*d per layer (Kaplan et al.
  2020, causal average) counted on c_attn.weight, the output projection (tied to wte)
  2*d*vocab counted on wte.

Run: ``python scripts/model_shapes.py`` (prints which path it took for each model).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "traffic" / "training" / "shapes"

RESNET50_BLOCKS = (3, 4, 6, 3)
RESNET50_WIDTHS = (64, 128, 256, 512)
RESNET_EXPANSION = 4
RESNET_IMAGE = 224
RESNET_CLASSES = 1000

GPT2_LAYERS, GPT2_D, GPT2_VOCAB, GPT2_CTX = 12, 768, 50257, 1024


def resnet50_description() -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, forward FLOPs per 224x224 image) of every ResNet-50 parameter."""
    params: list[tuple[str, tuple[int, ...], int]] = []

    def conv(name: str, cin: int, cout: int, k: int, out_hw: int) -> None:
        params.append((f"{name}.weight", (cout, cin, k, k), 2 * cout * cin * k * k * out_hw * out_hw))

    def bn(name: str, c: int, hw: int) -> None:
        params.append((f"{name}.weight", (c,), c * hw * hw))
        params.append((f"{name}.bias", (c,), c * hw * hw))

    hw = RESNET_IMAGE // 2  # 7x7 stride-2 convolution
    conv("conv1", 3, 64, 7, hw)
    bn("bn1", 64, hw)
    hw //= 2  # 3x3 stride-2 max pool
    cin = 64
    for stage, (blocks, width) in enumerate(zip(RESNET50_BLOCKS, RESNET50_WIDTHS), start=1):
        for b in range(blocks):
            name = f"layer{stage}.{b}"
            stride = 2 if stage > 1 and b == 0 else 1
            out_hw = hw // stride
            conv(f"{name}.conv1", cin, width, 1, hw)
            bn(f"{name}.bn1", width, hw)
            conv(f"{name}.conv2", width, width, 3, out_hw)
            bn(f"{name}.bn2", width, out_hw)
            conv(f"{name}.conv3", width, width * RESNET_EXPANSION, 1, out_hw)
            bn(f"{name}.bn3", width * RESNET_EXPANSION, out_hw)
            if b == 0:
                conv(f"{name}.downsample.0", cin, width * RESNET_EXPANSION, 1, out_hw)
                bn(f"{name}.downsample.1", width * RESNET_EXPANSION, out_hw)
            cin, hw = width * RESNET_EXPANSION, out_hw
    params.append(("fc.weight", (RESNET_CLASSES, cin), 2 * RESNET_CLASSES * cin))
    params.append(("fc.bias", (RESNET_CLASSES,), RESNET_CLASSES))
    return params


def gpt2_small_description() -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, forward FLOPs per token) of every GPT-2 small parameter (the LM head is
    tied to wte, so it is not a parameter of its own)."""
    d, ff = GPT2_D, 4 * GPT2_D
    params = [("transformer.wte.weight", (GPT2_VOCAB, d), 2 * d * GPT2_VOCAB),
              ("transformer.wpe.weight", (GPT2_CTX, d), 0)]

    def linear(name: str, din: int, dout: int, extra_flops: int = 0) -> None:
        # GPT-2's Conv1D stores weights as (in, out)
        params.append((f"{name}.weight", (din, dout), 2 * din * dout + extra_flops))
        params.append((f"{name}.bias", (dout,), dout))

    def norm(name: str) -> None:
        params.append((f"{name}.weight", (d,), d))
        params.append((f"{name}.bias", (d,), d))

    for i in range(GPT2_LAYERS):
        h = f"transformer.h.{i}"
        norm(f"{h}.ln_1")
        linear(f"{h}.attn.c_attn", d, 3 * d, extra_flops=2 * GPT2_CTX * d)
        linear(f"{h}.attn.c_proj", d, d)
        norm(f"{h}.ln_2")
        linear(f"{h}.mlp.c_fc", d, ff)
        linear(f"{h}.mlp.c_proj", ff, d)
    norm("transformer.ln_f")
    return params


def installed_shapes(model: str) -> list[tuple[str, tuple[int, ...]]] | None:
    """Names and shapes from the installed model definition, or None when it is not installed."""
    try:
        if model == "resnet50":
            import torchvision  # optional: only where it is installed

            net = torchvision.models.resnet50(weights=None)
        else:
            import transformers

            net = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    except ImportError:
        return None
    return [(name, tuple(p.shape)) for name, p in net.named_parameters()]


def shape_table(model: str) -> tuple[dict, str]:
    """The table and the path it took."""
    description = {"resnet50": resnet50_description, "gpt2_small": gpt2_small_description}[model]()
    installed = installed_shapes(model)
    if installed is None:
        source = "architecture written out in scripts/model_shapes.py (no local model definition)"
    else:
        written = [(name, shape) for name, shape, _ in description]
        if installed != written:
            raise SystemExit(f"{model}: the installed definition and the written-out architecture "
                             f"disagree ({len(installed)} vs {len(written)} tensors)")
        source = ("local " + ("torchvision resnet50" if model == "resnet50" else "transformers GPT2LMHeadModel")
                  + ", checked against the written-out architecture")
    flops_per = "image 224x224" if model == "resnet50" else f"token at context {GPT2_CTX}"
    params = [{"name": n, "shape": list(s), "forward_flops": f} for n, s, f in description]
    total = sum(_numel(p["shape"]) for p in params)
    return {"model": model, "source": source, "forward_flops_per": flops_per,
            "total_params": total, "params": params}, source


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for model in ("resnet50", "gpt2_small"):
        table, source = shape_table(model)
        path = args.out_dir / f"{model}.json"
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{model}: {table['total_params']:,} parameters in {len(table['params'])} tensors "
              f"from {source} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
