"""Helpers shared by the benchmarks: the data pool, the benchmark Trainer, statistics, tables, JSON.

TensorFlow is imported lazily (inside functions), so that a benchmark can
set TF_CONFIG and logging variables before TF starts.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from typing import Any, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = "bench_out"


def quiet_tensorflow() -> None:
    """Fewer C++ log lines; must run before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# -- data ----------------------------------------------------------------------

def load_pool(source: str, pool_size: int, seed: int = 0):
    """Returns (images uint8 [N, 28, 28, 1], labels int64 [N]) held in memory.

    'digits' is the MNIST recipe's offline set (scikit-learn digits upscaled to
    28x28, train split, 1437 images); 'synthetic' is `pool_size` random
    MNIST-shaped images. Both give the model exactly MNIST's shapes and dtypes.
    """
    import numpy as np
    if source == "digits":
        from recipes.mnist import data as mnist_data
        images, labels = mnist_data.load_offline_digits("train").batch(1 << 20).get_single_element()
        return images.numpy().astype(np.uint8), labels.numpy().astype(np.int64)
    if source == "synthetic":
        rng = np.random.RandomState(seed)
        images = rng.randint(0, 256, size=(pool_size, 28, 28, 1), dtype=np.uint8)
        labels = rng.randint(0, 10, size=(pool_size,)).astype(np.int64)
        return images, labels
    raise ValueError(f"--data must be 'digits' or 'synthetic', got {source!r}.")


def make_dataset(pool, batch_size: int):
    """The one pipeline every variant reads: normalize once, cache, repeat, batch (no shuffle).

    Callers add ``prefetch(AUTOTUNE)`` (the library's loops do it themselves
    in tfdist_trainer.data.finish). No shuffling, so every variant sees the
    same batches in the same order.
    """
    import tensorflow as tf
    from recipes.mnist.data import normalize
    images, labels = pool
    return (tf.data.Dataset.from_tensor_slices((images, labels))
            .map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
            .cache()
            .repeat()
            .batch(batch_size, drop_remainder=True))


def bench_trainer_cls():
    """A MnistTrainer (the recipe's model, loss, optimizer, metrics) that reads the benchmark pool."""
    from recipes.mnist.trainer import MnistTrainer

    class BenchMnistTrainer(MnistTrainer):
        def __init__(self, *, pool, **kwargs):
            super().__init__(data_source="digits", **kwargs)
            self._pool = pool

        def build_train_dataset(self, input_context):
            return make_dataset(self._pool, self.per_replica_batch_size(input_context))

    return BenchMnistTrainer


def loss_value(result) -> float:
    """The mean loss from `TrainLoop.train` (a float, or a result object with `.loss`)."""
    return float(getattr(result, "loss", result))


def parse_int_list(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


# -- statistics and reports ------------------------------------------------------

def summarize(times_s: Sequence[float], steps: int) -> dict[str, Any]:
    """Median and spread of repeated timings of `steps` steps."""
    times = list(times_s)
    med = statistics.median(times)
    return {
        "steps": steps,
        "repetitions": len(times),
        "times_s": [round(t, 6) for t in times],
        "time_s_median": med,
        "time_s_min": min(times),
        "time_s_max": max(times),
        "steps_per_s": steps / med,
        "steps_per_s_min": steps / max(times),
        "steps_per_s_max": steps / min(times),
    }


def ratio_spread(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, float]:
    """Per-repetition ratios (paired: same round), as median and min..max."""
    ratios = [a / b for a, b in zip(numerator, denominator)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[int] = (0,)) -> str:
    """A plain-text table; columns in `left` are left-aligned (text), the others right-aligned (numbers)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i in left else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["load_average_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    if "tensorflow" in sys.modules:
        import keras
        import tensorflow as tf
        info["tensorflow"] = tf.__version__
        info["keras"] = keras.__version__
        info["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
    return info


def write_json(out_dir: str, name: str, payload: dict[str, Any]) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=False)
        f.write("\n")
    return path
