"""A small decoder-only Transformer language model, laid out for the model_parallel strategy."""
