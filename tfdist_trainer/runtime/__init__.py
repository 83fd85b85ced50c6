"""What a task does once TensorFlow runs: the training task (`train/`), serving (`serve`), evaluating (`evaluate`), and the machinery they share.

Its modules: a task at run time, by role (import-linter `runtime-roles`: the roles on top, the
shared machinery below): **`train/`** (`controller`: the outer loop, under 40 lines; `setup`:
`build_run`, everything the loop drives; `task_hooks`: the task's own protocols after the user's
hooks; `run_context`: what hooks may touch, `hooks.Run`), `evaluate` (the side-car), `peers`
(TF's lost-peer errors as one `PeerLost`), `config_checks` (an in-graph check of a setting
against data, failed: a `ConfigError`), `checkpoint_actions` (`--mode=evaluate/export`: one
checkpoint, no training); below them `apply_warm_start`, `export` (the one SavedModel export),
`ema` (the optimizer's averages swapped in for evaluation and export), `statistics`
(BatchNormalization statistics averaged over replicas; workers compare fingerprints), `state`
(model, optimizer, metrics, global step under the strategy's scope), `strategies/` (one module
or package per strategy, named as its plan module, holding its `<Name>Runtime`: the strategy,
the placed model, the step and its loop, and every decision a task takes from its strategy, one
`StrategyRuntime` method each with its default in `base` (`eval_loop`, `run_loop`,
`answers_ps_save_requests`, `metrics_built`, `keeps_checkpoints`, `spans_tasks`,
`averages_statistics`, `max_over_workers`, `finish_job`, `serve`): nothing outside
`plan/strategies` and `runtime/strategies` asks which strategy runs (`sharding/` asks
`placement.strategy_kind`); and what only that strategy uses: **`parameter_server/`**
`scheduled_loop` (whole step loops scheduled onto the workers), `watchdog` (the stall deadline),
`data_service` (input through the tf.data service), `serve` (the ps / worker / tf.data
dispatcher tasks), `stall` (a stalled cluster's last save, then exit 200); **`model_parallel/`**
`placement` (each layer of the model, at any depth, placed by a plan), `layer_tree` (the model's
layers as a tree, in call order), `devices` (a layer's ops and variables on its device),
`placement_report` (the placement's console lines, log table, placement.json), `step` (the
pipelined step); `base` (`StrategyRuntime`), `registry` (a strategy's runtime by its name in
`plan/strategies` `NAMES`)), `loops/` (`body`: the one step-loop body; `synchronous`, `size`
(the `'auto'` tuner), `accumulate` (gradient accumulation), `evaluation`), `checkpoints/`
(`checkpointer`: `save(step)` / `wait()` / `restore()`, called only through
`RunContext.save_checkpoint`, handed out by `StrategyRuntime.checkpointer`; `writer` (write,
list, sweep), `background_writer` (`train.async_checkpoint`: the same write on a thread after
`snapshot`, a copy of the small state at the step; `table_parts`: the tables written a part at a
time, each part copied, written and let go before the next), `restore` (sharded tables apart, a
slice at a time), `listing` (a checkpoint is listed only once its files are complete), `pins`,
`failures`), `preemption` (SIGTERM: a preempted ps asks the chief to save before it exits),
`shutdown` (the orderly end, asked through `StrategyRuntime.finish_job`), `logs/` (role prefix,
summaries, eval reports; `layer_table`: the placement tables, for the task's log only), `memory`
(peak RSS / GPU), `whole_tables` (a large table placed or read whole: one warning)
"""
