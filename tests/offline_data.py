"""Small fake data in the real formats torchvision reads (MNIST's idx files, CIFAR-10's pickled batches, an
ImageFolder of JPEGs) and a stand-in for resnet18's pretrained weights, so that the scripts in published shapes
(tests/scripts/migrate/shapes/) run offline with torchvision's own readers. The classes are learnable (each has its own
pattern under the noise): a script that trains shows its loss going down within a few epochs."""
from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np

SITE = Path(__file__).parent / "offline_site"  # tests/offline_site/sitecustomize.py: why it is needed


def _images(n: int, shape: tuple, classes: int, seed: int) -> tuple:
    """uint8 images of ``shape`` (H, W[, C]) and their labels: a class's own bright band under noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    images = rng.integers(0, 90, (n, *shape)).astype(np.uint8)
    band = shape[0] // classes
    for i, label in enumerate(labels):
        images[i, label * band:(label + 1) * band] += 150
    return images, labels.astype(np.uint8)


def mnist(root: Path, train: int = 256, test: int = 64) -> None:
    """``root``/MNIST/raw/: the four idx files torchvision's MNIST reads (download=True finds them there)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, n, seed in (("train", train, 1), ("t10k", test, 2)):
        images, labels = _images(n, (28, 28), 10, seed)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, n) + labels.tobytes())


def cifar10(root: Path, per_batch: int = 16, test: int = 16) -> None:
    """``root``/cifar-10-batches-py/: five training batches, the test batch and the meta file, pickled as the real
    ones (rows of 3072 bytes, channels first)."""
    out = root / "cifar-10-batches-py"
    out.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        images, labels = _images(test if name == "test_batch" else per_batch, (32, 32, 3), 10, 10 + i)
        rows = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
        (out / name).write_bytes(pickle.dumps({"data": rows, "labels": [int(x) for x in labels]}))
    (out / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))


def image_folder(root: Path, per_class: dict) -> None:
    """``root``/SPLIT/{cat,dog}/N.jpg: ``per_class`` images per class and split (64x64 JPEGs)."""
    from PIL import Image

    for split, n in per_class.items():
        images, labels = _images(2 * n, (64, 64, 3), 2, hash(split) % 1000)
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = root / split / ("cat", "dog")[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i}.jpg", quality=95)


def resnet18_weights(torch_home: Path) -> None:
    """torchvision's cache file for resnet18's pretrained weights, with freshly initialised ones: what
    ``resnet18(pretrained=True)`` loads without a download (it checks the hash only of what it downloads)."""
    import runpy

    import torch

    runpy.run_path(str(SITE / "sitecustomize.py"))  # the CUDA wheel of torchvision against the CPU torch
    from torchvision.models import resnet18

    hub = torch_home / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(resnet18().state_dict(), hub / "resnet18-f37072fd.pth")


def environment(torch_home: Path, **extra: str) -> dict:
    """The environment of a check run: the shim on PYTHONPATH, torchvision's cache at ``torch_home``."""
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "TORCH_HOME": str(torch_home), **extra}
