"""The `model_parallel` strategy's machinery: the layer tree and its placement, the pipelined step."""
