"""Real data for tests (no download): scikit-learn's bundled handwritten digits, split the one way every test uses."""

from __future__ import annotations

import numpy as np
import pytest


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels): 8x8 images as 64 floats in [0, 1], shuffled with a fixed
    seed, half for training and 898 held out (half a point of accuracy is 4.5 images). Skips without scikit-learn."""
    datasets = pytest.importorskip("sklearn.datasets")
    images, labels = datasets.load_digits(return_X_y=True)
    images = (images / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    split = int(len(images) * 0.5)
    return images[:split], labels[:split], images[split:], labels[split:]
