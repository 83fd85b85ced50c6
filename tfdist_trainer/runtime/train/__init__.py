"""The training task (the `train` Action): `controller` drives what `setup` builds; `task_hooks`
are its own protocols; `run_context` is what hooks may touch. What depends on the strategy
(the eval pass, a stalled cluster, the job's end...) is a `StrategyRuntime` method."""
