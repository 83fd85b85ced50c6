"""Throughput comparisons, each variant in its own process, each figure a ratio to a baseline
measured in the same run: ``python -m benchmarks.run_all`` (`make bench`), or one benchmark,
``python -m benchmarks.<name> [--smoke] [--out=bench_out]`` (see BUILD.md, Benchmarks).
"""
