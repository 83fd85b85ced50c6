"""The library's layers and optimizers under stable names in Keras' serialization registry.

A `.keras` file names each custom class by its registered name
(``tfdist_trainer>ShardedEmbedding``), and `keras.models.load_model` finds the class by
that name alone once `tfdist_trainer` is imported: no `custom_objects`, and a file saved
before a module moved still loads. Keras imports an unregistered class's module only for
its own packages (keras, keras_hub...), so without the registration a plain load fails
with "Could not locate class".
"""

from __future__ import annotations

import keras

#: Decorates a public layer or optimizer class; its name in files is ``tfdist_trainer>Class``.
#: Renaming a registered class breaks the files saved under its old name: keep the name.
serializable = keras.saving.register_keras_serializable(package="tfdist_trainer")
