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
from clusterlib import REPO, base_env

_SERVE = r"""
import json, sys
for blocked in ("tfdist_trainer", "keras", "recipes"):
    sys.modules[blocked] = None  # importing it raises ImportError
import numpy as np
import tensorflow as tf

export_dir, inputs_path, outputs_path, output_name = sys.argv[1:]
inputs = dict(np.load(inputs_path, allow_pickle=False))
loaded = tf.saved_model.load(export_dir)
serve = loaded.signatures["serving_default"]
outputs = serve(**{name: tf.constant(value) for name, value in inputs.items()})
if output_name:
    assert output_name in outputs, f"the signature's outputs are {sorted(outputs)}, not {output_name!r}"
    prediction = outputs[output_name]
else:
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
    export_dir: str, inputs: dict[str, np.ndarray], output: str = ""
) -> tuple[np.ndarray, list]:
    """The export's predictions for `inputs` from a clean process (its one output, or the one
    named `output`, which must exist), and the op types it ran."""
    with tempfile.TemporaryDirectory() as scratch:
        inputs_path = os.path.join(scratch, "inputs.npz")
        outputs_path = os.path.join(scratch, "outputs.npy")
        np.savez(inputs_path, **inputs)
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TF_CPP_MIN_LOG_LEVEL": "2"}
        result = subprocess.run(
            [sys.executable, "-I", "-c", _SERVE, export_dir, inputs_path, outputs_path, output],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        return np.load(outputs_path), report["ops"]


_PREDICT = r"""
import json, sys
import numpy as np
import tensorflow as tf
from tfdist_trainer.plan.gin_config import load_experiment
from tfdist_trainer.runtime.state import build_model
from tfdist_trainer.trainers import data as data_lib

args = json.loads(sys.argv[1])
experiment = load_experiment(args["gin_files"], args["gin_bindings"])
trainer = experiment.trainer_cls()
model = build_model(trainer)
status = tf.train.Checkpoint(model=model).read(args["checkpoint"])
status.assert_existing_objects_matched().expect_partial()
batches, count = [], 0
for features, _ in trainer.build_eval_dataset(data_lib.single_pipeline_context()):
    batches.append({k: v.numpy() for k, v in features.items()})
    count += len(batches[-1]["dense"])
    if count >= args["examples"]:
        break
inputs = {k: np.concatenate([b[k] for b in batches])[: args["examples"]] for k in batches[0]}
rng = np.random.default_rng(0)
ids = inputs["categorical"]
unseen = slice(len(ids) - args["unseen"], len(ids))
if ids.dtype.kind in "SUO":
    fresh = rng.integers(0, 2**63, size=ids[unseen].shape, dtype=np.int64)
    ids[unseen] = np.vectorize(lambda x: f"{x:016x}".encode())(fresh)
elif args["unseen"]:
    ids[unseen] = rng.integers(-(2**62), 2**62, size=ids[unseen].shape, dtype=np.int64)
predictions = model({k: tf.constant(v) for k, v in inputs.items()}, training=False).numpy()
# String keys come out of TensorFlow as object arrays, which np.load refuses without pickle.
np.savez(
    args["out"],
    predictions=predictions,
    **{k: v.astype(bytes) if v.dtype == object else v for k, v in inputs.items()},
)
# What an export must hold, each once: the weights, and the key -> row tables a dynamic table
# serves with (what it adds to a SavedModel: saved_model_children).
state = {id(w): int(np.prod(w.shape)) * tf.as_dtype(w.dtype).size for w in model.weights}
for layer in model.layers:
    for child in getattr(layer, "saved_model_children", dict)({}).values():
        if hasattr(child, "export"):
            state[id(child)] = sum(t.numpy().nbytes for t in child.export())
print(json.dumps({"examples": len(predictions), "state_bytes": sum(state.values())}))
"""


def checkpoint_predictions(
    gin_files: list[str], gin_bindings: list[str], checkpoint: str, *, examples: int, unseen: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(inputs, predictions) of the model the gin config builds here, outside any cluster, with
    `checkpoint`'s weights: `examples` of its evaluation data, the last `unseen` with fresh raw ids
    (keys no dynamic table has seen). The reference a served export must reproduce."""
    inputs, predictions, _ = checkpoint_reference(
        gin_files, gin_bindings, checkpoint, examples=examples, unseen=unseen
    )
    return inputs, predictions


def run_in_repo(source: str, *args: str) -> subprocess.CompletedProcess:
    """Runs `source` with `args` in a Python of the repository's environment; asserts it exits 0."""
    result = subprocess.run(
        [sys.executable, "-c", source, *args],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def checkpoint_reference(
    gin_files: list[str], gin_bindings: list[str], checkpoint: str, *, examples: int, unseen: int
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """`checkpoint_predictions`, and the bytes of that model's state (its weights, and the key ->
    row tables of its dynamic tables), which its export holds once."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "predictions.npz")
        args = {
            "gin_files": gin_files,
            "gin_bindings": gin_bindings,
            "checkpoint": checkpoint,
            "examples": examples,
            "unseen": unseen,
            "out": out,
        }
        result = run_in_repo(_PREDICT, json.dumps(args))
        saved = dict(np.load(out, allow_pickle=False))
        predictions = saved.pop("predictions")
        state_bytes = json.loads(result.stdout.strip().splitlines()[-1])["state_bytes"]
        return saved, predictions, state_bytes


def model_weight_bytes(checkpoint: str) -> int:
    """Bytes of the model's weights in `checkpoint`, each at its dtype's size: its variables, wherever
    the checkpoint keeps them (a value is named by its first place in the object graph: a model's
    weights may sit under ``optimizer/_trainable_variables/``), and its sharded tables."""
    import tensorflow as tf

    from tfdist_trainer import tf_compat

    reader = tf.train.load_checkpoint(checkpoint)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    keys = set(tf_compat.checkpoint_variable_names(checkpoint, child="model"))
    keys |= {k for k in shapes if k.startswith("model/") and k.endswith("/.ATTRIBUTES/table")}
    return sum(int(np.prod(shapes[k])) * dtypes[k].size for k in keys)


def exported_bytes(export_dir: str) -> int:
    """Bytes of a SavedModel's values: its ``variables/*.data-*`` files, less the object graph
    they also hold (a few KiB of names, a share of a small model's bytes)."""
    import tensorflow as tf

    variables_dir = os.path.join(export_dir, "variables")
    files = sum(
        os.path.getsize(os.path.join(variables_dir, name))
        for name in os.listdir(variables_dir)
        if ".data-" in name
    )
    reader = tf.train.load_checkpoint(os.path.join(variables_dir, "variables"))
    return files - len(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))


def assert_each_weight_exported_once(export_dir: str, weights: int) -> None:
    """The export's values are the size of the model's `weights` (bytes: `model_weight_bytes`, or
    `checkpoint_reference`'s state) within 2%: each weight once, where Keras' own `model.export`
    saves every weight twice (tf_compat.export_archive_of)."""
    exported = exported_bytes(export_dir)
    assert 0.98 * weights <= exported <= 1.02 * weights, (export_dir, exported, weights)
