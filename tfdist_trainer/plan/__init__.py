"""What to run, decided before TensorFlow starts (TF-free): the experiment, strategies, the cluster, plans.

Its modules: what to run: `experiment` (`train.*` in gin, held as the frozen groups of
`options`: loop, checkpoints, evaluation, logging), `strategies/` (one module per strategy,
named as its gin name: settings, accepted clusters, what each task does; `base`
(`StrategyConfig`, `Action`; `StrategyConfig.shrinks`: may `tfdist-launch --min_workers` run the
job on fewer workers); `registry` (`NAMES`, the one list of strategies)), `cluster` (TF_CONFIG
and the classic flags; the one TF_CONFIG writer), `network` (port and peer checks before TF),
`task_layout` (which tasks a job has), `gin_config` (gin files, bindings, `--module`),
`preflight` (`prepare(entry, model_dir, gin...)`: the one preflight of `tfdist-train`,
`tfdist_trainer.train/evaluate/export`, `tfdist-launch` and `--emit`), `trainer_bindings` (a
binding of the user's Trainer checked against its `__init__` chain before any task starts),
`warm_start` (`WarmStart` settings), `model_parallel_plan` (plans parsed before TF), `task`
(`TaskContext` on `Trainer.context`)
"""
