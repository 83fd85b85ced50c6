"""Reproducible throughput comparisons, each run side by side in one process and reported as ratios.

    python -m benchmarks.run_all                 # both, one combined table (`make bench`)
    python -m benchmarks.trainer_vs_baselines    # Trainer loop vs hand-written loop vs Keras fit
    python -m benchmarks.ps_steps_per_loop       # parameter_server.steps_per_loop in {1, 10, 100}

Every script takes ``--smoke`` (tiny sizes, one repetition; what the tests run)
and ``--out`` (default ``bench_out/``), where it writes its JSON.
"""
