"""The training task (the `train` Action): `controller` drives what `setup` builds; `task_hooks`
are its own protocols; `run_context` is what hooks may touch; `stall` ends a stalled cluster."""
