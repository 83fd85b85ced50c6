"""A Keras user's `model.save("m.keras")` of a model with the library's tables loads back with a
plain `keras.models.load_model`: no `custom_objects`, the same predictions, the tables' contents
(a DynamicEmbedding's keys included) and the optimizer's class."""

from __future__ import annotations

import keras
import numpy as np
import saved_tables_model
import tensorflow as tf

from tfdist_trainer import sharding


def _predict(model, probe):
    return model({k: tf.constant(probe[k]) for k in ("item", "user")}).numpy()


def test_a_file_saved_by_an_earlier_version_loads_and_predicts_the_same():
    """The committed file keeps loading after the library's modules move: classes are found by
    their registered names (tfdist_trainer>ShardedEmbedding), not by module path."""
    probe = np.load(saved_tables_model.PROBE)
    model = keras.models.load_model(saved_tables_model.FIXTURE)
    np.testing.assert_allclose(_predict(model, probe), probe["outputs"], rtol=0, atol=1e-6)
    assert isinstance(model.optimizer, sharding.SparseAdagrad)


def test_a_trained_model_saves_and_loads_with_its_keys(tmp_path):
    keras.utils.set_random_seed(1)
    model = saved_tables_model.trained()
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    probe = saved_tables_model.probe_inputs()  # users 20-39 unseen: default rows both sides
    np.testing.assert_allclose(_predict(loaded, probe), _predict(model, probe), rtol=0, atol=1e-6)
    before, after = sharding.dynamic_table_stats(model), sharding.dynamic_table_stats(loaded)
    assert before["users/rows_in_use"] > 0 and after == before, (before, after)
