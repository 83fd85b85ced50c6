"""Serving an exported SavedModel as TF Serving would: a clean process with stock TensorFlow only.

The process is started isolated (``python -I``: no PYTHONPATH, no user site,
not the repository as its working directory) with an empty environment, and
`tfdist_trainer` and `keras` are made unimportable before TensorFlow is
imported: any attempt by the SavedModel to reach either fails the load. No
cluster is up for it to reach. It loads the export with `tf.saved_model.load`,
runs the ``serving_default`` signature on the given inputs and reports the op
types of the serving graph, which a stock TensorFlow must have registered for
the load to succeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

_SERVE = r"""
import json, sys
for blocked in ("tfdist_trainer", "keras", "recipes"):
    sys.modules[blocked] = None  # importing it raises ImportError
import numpy as np
import tensorflow as tf

export_dir, inputs_path, outputs_path = sys.argv[1:]
inputs = dict(np.load(inputs_path, allow_pickle=False))
loaded = tf.saved_model.load(export_dir)
serve = loaded.signatures["serving_default"]
outputs = serve(**{name: tf.constant(value) for name, value in inputs.items()})
(prediction,) = outputs.values()
np.save(outputs_path, prediction.numpy())
ops = sorted({op.type for op in serve.graph.get_operations()})
for function in serve.graph._functions.values():
    ops += [node.op for node in function.definition.node_def]
for blocked in ("tfdist_trainer", "keras", "recipes"):
    try:
        __import__(blocked)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{blocked} was importable")
print(json.dumps({"ops": sorted(set(ops))}))
"""


def serve_in_clean_process(
    export_dir: str, inputs: dict[str, np.ndarray]
) -> tuple[np.ndarray, list]:
    """The export's predictions for `inputs` from a clean process, and the op types it ran."""
    with tempfile.TemporaryDirectory() as scratch:
        inputs_path = os.path.join(scratch, "inputs.npz")
        outputs_path = os.path.join(scratch, "outputs.npy")
        np.savez(inputs_path, **inputs)
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TF_CPP_MIN_LOG_LEVEL": "2"}
        result = subprocess.run(
            [sys.executable, "-I", "-c", _SERVE, export_dir, inputs_path, outputs_path],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        return np.load(outputs_path), report["ops"]
