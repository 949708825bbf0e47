"""Regenerate the sample traces in this directory (recorded by memlens itself, on CPU).

    .venv/bin/python sample_traces/generate.py

Each trace is a `NAME.memlens/` directory; see README.md here for what each one holds. Seeds are
fixed, so sizes and op sequences are the same on every run (times differ).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def transformer_training(steps: int = 6):
    """Tiny transformer LM, AdamW, `steps` steps with memlens.step() markers."""
    import torch

    import memlens
    from memlens.demo import make_transformer, train_transformer_steps
    torch.manual_seed(0)
    model = make_transformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with memlens.record(model) as rec:
        train_transformer_steps(model, opt, steps)
    return rec.trace


def mlp_training_sgd(steps: int = 5):
    """Three-layer MLP, SGD with momentum, iterations from optimizer steps, Python stacks on."""
    import torch

    import memlens
    from memlens.demo import make_mlp, train_classifier_steps
    torch.manual_seed(0)
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def batch():
        return torch.randn(32, 128), torch.randint(0, 10, (32,))

    with memlens.record(model, stacks=True) as rec:
        train_classifier_steps(model, opt, steps, batch, mark_steps=False)
    return rec.trace


def cnn_inference(batches: int = 4):
    """Small CNN inference under torch.no_grad, memlens.step() per batch."""
    import torch

    import memlens
    from memlens.demo import make_cnn
    torch.manual_seed(0)
    model = make_cnn().eval()
    with memlens.record(model) as rec, torch.no_grad():
        for _ in range(batches):
            model(torch.randn(16, 3, 32, 32)).argmax(dim=1)
            memlens.step()
    return rec.trace


SAMPLES = {
    "transformer_train_adamw": transformer_training,
    "mlp_train_sgd_stacks": mlp_training_sgd,
    "cnn_inference": cnn_inference,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", default=str(HERE), help="directory to write into (default: here)")
    parser.add_argument("names", nargs="*", choices=[[]] + list(SAMPLES), help="which samples (default all)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for name in args.names or SAMPLES:
        trace = SAMPLES[name]()
        path = trace.save(out / f"{name}.memlens", overwrite=True)
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"{path}: {trace} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
