"""keras-rs 0.4.0's own tests of `DistributedEmbedding` and `EmbedReduce`, run against the bridge.

A package so that the vendored files import their helpers by one stable name
(`keras_rs_upstream.testing`, `keras_rs_upstream.bridge`); README.md says what was vendored.
"""
