"""What a user subclasses or names: `Trainer`, `KerasTrainer`, what a Trainer takes from a compiled model, input helpers.

Its modules: what a user subclasses or names: `trainer` (`Trainer`: `compute_gradients`,
`apply_gradients`, `train_step`), `clipping` (gradient clipping over the global batch, not per
replica), `sparse_reduce` (all sparse gradients of a step in one all-gather between replicas),
`compiled` (what a Trainer takes from a compiled Keras model), `keras_trainer` (`KerasTrainer`),
`data` (input contexts, `shard()`, `SyncInput`)
"""
