"""tfdist_trainer.launch.console.ConsoleFilter, in process: known TensorFlow chatter stays off the console, real failures never do.

The lines are copied from real task output (tfdist-launch on TF 2.21, CPU only,
and a multi_worker_mirrored job whose leader exited before its peer). quiet_stderr,
which needs a process of its own, is tested in tests/test_console.py.
"""

from __future__ import annotations

import pytest

from tfdist_trainer.launch.console import ConsoleFilter, strip_header

# -- known chatter: start-up of every TF process on a machine without a GPU
STARTUP = [
    "[chief:0] WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "[chief:0] I0000 00:00:1795420118.935840    5292 port.cc:153] oneDNN custom operations are on. "
    "You may see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "[chief:0] I0000 00:00:1795420118.936195    5292 cudart_stub.cc:31] Could not find cuda drivers "
    "on your machine, GPU will not be used.",
    "[chief:0] I0000 00:00:1795420114.866925    5292 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "[chief:0] To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI FMA, "
    "in other operations, rebuild TensorFlow with the appropriate compiler flags.",
    "[chief:0] E0000 00:00:1795420121.701737    5292 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "[worker:1] W0000 00:00:1795420130.188075    5409 dataset.cc:997] Input of "
    "GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the "
    "AsGraphDefInternal() method needed to apply optimizations.",
    "[ps:0] W0000 00:00:1795420708.170110   19184 local_rendezvous.cc:412] Local rendezvous is "
    "aborting with status: ABORTED: Cleanup -6776639436593026586 "
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
    # gin resolving an included strategy file on its search path, matplotlib's first font cache.
    "[worker:0] I1125 10:02:11.512093 139861 resource_reader.py:50] "
    "system_path_file_exists:strategies/parameter_server.gin",
    "[chief:0] I1125 10:02:09.100212 139861 font_manager.py:1848] generated new fontManager",
    "[chief:0] I1123 07:48:51.092134 140623654573760 cluster_coordinator.py:544] Waiting for all "
    "global closures to be finished.",
    "[chief:0] I1123 07:48:48.762053 140627159559040 remote.py:225] default session config: "
    "device_count {",
    '[chief:0]   key: "GPU"',
    "[chief:0]   value: 0",
    "[chief:0] }",
]


# -- known chatter after a job that succeeded: the MWMS leader exited first
SHUTDOWN = [
    "[worker:1] E0000 00:00:1795420387.880172   11161 base_collective_executor.cc:252] "
    "BaseCollectiveExecutor::StartAbort UNAVAILABLE: Failed to send RPC to coordination service. "
    "Either the leader task was preempted/died/restarted unexpectedly or this task is experiencing "
    "network issues.",
    "[worker:1] Additional GRPC error information from remote target /job:worker/replica:0/task:0 "
    "while calling /tensorflow.CoordinationService/Heartbeat:",
    '[worker:1] :UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect '
    "to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:34061: Failed to connect to remote host: "
    'Connection refused"}',
]


# -- known chatter of the evaluator: TF's checkpoint polling and SavedModel writing (BestExporter)
EVALUATOR_CHATTER = [
    "[evaluator:0] I1124 11:42:44.585896 140136287636352 checkpoint_utils.py:168] Waiting for new "
    "checkpoint at /tmp/run/model",
    "[evaluator:0] I1124 11:42:49.786939 140136287636352 signature_serialization.py:156] Function "
    "`__call__` contains input name(s) resource with unsupported characters which will be renamed "
    "to sequential_1_dense_1_2_add_readvariableop_resource in the SavedModel.",
    "[evaluator:0] I1124 11:42:49.936423 140136287636352 builder_impl.py:838] Assets written to: "
    "/tmp/run/model/export/best_eval_loss/.tmp-20-1b51af1dd90e/assets",
    "[evaluator:0] I1124 11:42:49.938138 140136287636352 fingerprinting_utils.py:49] Writing "
    "fingerprint to /tmp/run/model/export/best_eval_loss/.tmp-20-1b51af1dd90e/fingerprint.pb",
]


EVALUATOR_PROGRESS = [
    "[evaluator:0] I1124 11:42:44.585896 140136287636352 evaluator.py:84] waiting for the first "
    "checkpoint in /tmp/run/model",
    "[evaluator:0] I1124 11:42:49.951524 140136287636352 evaluator.py:244] skipping 1 checkpoint(s) "
    "saved after step 20 (steps 30) to evaluate the newest, step 40: evaluation takes longer than "
    "the interval between checkpoints",
    "[evaluator:0] I1124 11:42:50.011976 140136287636352 logs.py:162] eval at step 40: "
    "eval_loss=0.1807 eval_accuracy=0.9688 eval_examples=1024.0000",
    "[evaluator:0] I1124 11:42:50.318313 140136287636352 hooks.py:576] BestExporter: new best "
    "eval_loss=0.18069 at step 40 (was 0.38342 at step 20); exported to "
    "/tmp/run/model/export/best_eval_loss/40",
]


PROGRESS = [
    "[chief:0] I1123 07:48:48.925053 140627159559040 controller.py:258] strategy parameter_server "
    "with 1 replica(s) in sync",
    "[chief:0] I1123 07:48:51.925725 140627159559040 controller.py:91] step 25/50 loss=1.6941 "
    "accuracy=0.5219 steps/s=15.8 examples/s=1014 ETA=2s [data: MNIST (TFDS)]",
    "[chief:0] I1123 07:48:52.674726 140627159559040 controller.py:91] eval at step 50: "
    "eval_loss=0.3462 eval_accuracy=0.8802 [data: MNIST (TFDS)]",
    "[launch] job succeeded",
]


# -- real failures: every one of these lines must reach the console
TRACEBACK = [
    "[chief:0] Traceback (most recent call last):",
    '[chief:0]   File "/work/main/tfdist_trainer/cli.py", line 190, in main',
    "[chief:0]     controller.train(experiment, cluster, model_dir=FLAGS.model_dir)",
    '[chief:0]   File "/work/my_project/trainers.py", line 12, in build_model',
    "[chief:0]     return keras.Sequential([keras.layers.Dense(self.units)])",
    "[chief:0] ValueError: units must be positive, got -1",
]


INVALID_ARGUMENT = [
    "[worker:0] E1123 08:01:02.123456 140000000000000 controller.py:140] step 300 failed",
    "[worker:0] tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:",
    "[worker:0] Detected at node sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits",
    "[worker:0] Received a label value of 12 which is outside the valid range of [0, 10).  "
    "Label values: 3 12 7",
    "[worker:0] \t [[{{node sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits}}]]",
]


UNAVAILABLE_MID_RUN = [
    "[chief:0] E0000 00:00:1795420387.880172   11161 base_collective_executor.cc:252] "
    "BaseCollectiveExecutor::StartAbort UNAVAILABLE: Failed to send RPC to coordination service.",
    "[chief:0] Additional GRPC error information from remote target /job:ps/replica:0/task:0 while "
    "calling /tensorflow.CoordinationService/Heartbeat:",
    '[chief:0] :UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect '
    'to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:36051: Connection refused"}',
    "[chief:0] tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted "
    "by: Failed to send RPC to coordination service.",
]


#: The same error as Python prints it, with no absl header (e.g. an uncaught exception's last lines).
RAW_ERROR = INVALID_ARGUMENT[1:]


OOM = [
    "[worker:1] W0000 00:00:1795421000.000000    6000 bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran "
    "out of memory trying to allocate 12.00GiB (rounded to 12884901888)requested by op MatMul",
    "[worker:1] tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node "
    "__wrapped__MatMul_device_/job:worker/replica:0/task:1/device:GPU:0}} OOM when allocating tensor "
    "with shape[65536,49152] and type float on /job:worker/replica:0/task:1/device:GPU:0",
    "[worker:1] Killed",
]


EXITS = [
    "[launch] worker:1 exited with code 1; stopping the cluster because the Never policy does not "
    "retry it (its log: /tmp/run/logs/worker-1.log)",
    "[launch] job failed with exit code 1",
    "[worker:1] error: --model_dir /nonexistent cannot be used as a directory; pick another path.",
]


def _shown(lines, **kwargs):
    keep = ConsoleFilter(gpu=False, **kwargs)
    return [line for line in lines if keep(line)]


def test_known_startup_chatter_stays_off_the_console():
    assert _shown(STARTUP) == []


def test_the_evaluators_tf_chatter_stays_off_the_console_and_its_own_lines_do_not():
    """TF's "Waiting for new checkpoint" (once a second under tf.train.checkpoints_iterator) and the
    lines of writing a SavedModel go to the task's log only; the evaluator's own lines are shown."""
    lines = EVALUATOR_CHATTER[:1] + EVALUATOR_PROGRESS[:3] + EVALUATOR_CHATTER[1:]
    assert _shown(lines + EVALUATOR_PROGRESS[3:]) == EVALUATOR_PROGRESS


def test_progress_and_launcher_lines_are_shown():
    assert _shown(STARTUP + PROGRESS + STARTUP) == PROGRESS


@pytest.mark.parametrize(
    "failure",
    [TRACEBACK, INVALID_ARGUMENT, RAW_ERROR, UNAVAILABLE_MID_RUN, OOM, EXITS],
    ids=[
        "traceback",
        "invalid_argument",
        "raw_error",
        "unavailable_mid_run",
        "oom",
        "nonzero_exit",
    ],
)
@pytest.mark.parametrize("progress_only", [False, True])
def test_real_failures_always_reach_the_console(failure, progress_only):
    info_from = ("controller.py",) if progress_only else None
    # Right after chatter (whose continuation lines are hidden), and after a hidden INFO record.
    lines = STARTUP + failure + STARTUP[-4:] + failure
    assert _shown(lines, info_from=info_from) == failure + failure


def test_errors_after_the_job_finished_still_show_when_they_are_not_shutdown_chatter():
    assert _shown(TRACEBACK + OOM, job_finished=lambda: True) == TRACEBACK + OOM


def test_grpc_shutdown_errors_are_chatter_only_after_the_job_finished():
    assert _shown(SHUTDOWN) == SHUTDOWN  # mid-run they mean a lost peer
    assert _shown(SHUTDOWN, job_finished=lambda: True) == []
    # And a real failure after them is not swallowed as their continuation.
    assert _shown(SHUTDOWN + TRACEBACK, job_finished=lambda: True) == TRACEBACK


def test_cuinit_failure_is_shown_on_a_machine_with_a_gpu():
    cuinit = [line for line in STARTUP if "cuInit" in line]
    assert ConsoleFilter(gpu=True)(cuinit[0])
    assert not ConsoleFilter(gpu=False)(cuinit[0])


def test_a_multiline_record_is_shown_or_hidden_whole():
    table = [
        "[chief:0] I1123 07:48:49.350013 140627159559040 state.py:90] variable placement:",
        "[chief:0] variable                    shape      bytes  device",
        "[chief:0] --------------------------  ---------  -----  ------------------------------------",
        "[chief:0] sequential/conv2d/kernel    3x3x1x32   1,152  /job:ps/replica:0/task:0/device:CPU:0",
        "[chief:0] bytes per task:",
    ]
    assert _shown(STARTUP + table) == table  # the header with its table, never the header alone
    assert _shown(table + PROGRESS, info_from=("controller.py",)) == PROGRESS
    # Records of two tasks interleave: each keeps its own state.
    other = ["[worker:0] plain output of worker 0"]
    mixed = table[:2] + other + table[2:]
    assert _shown(mixed, info_from=("controller.py",)) == other


def test_plain_output_after_chatter_is_shown():
    lines = STARTUP[:3] + ["[worker:0] hello from the user's module"]
    assert _shown(lines) == lines[-1:]


def test_strip_header():
    assert strip_header(PROGRESS[1]).startswith("[chief:0] step 25/50 loss=1.6941")
    assert strip_header("[launch] job succeeded") == "[launch] job succeeded"
    assert strip_header(STARTUP[1]).startswith("[chief:0] oneDNN custom operations")


SERVING_ROUTINE_LINES = [
    "[ps:0] I1202 12:21:50.100000 1400 cli.py:257] serve as ps:0 under parameter_server",
    "[ps:0] I1202 12:21:50.200000 1400 serve.py:84] serving at grpc://127.0.0.1:5001",
    "[ps:0] I1202 12:21:51.300000 1400 serve.py:103] chief 127.0.0.1:5000 is up",
    "[ps:0] I1202 12:21:57.400000 1400 serve.py:111] the chief marked training done: exiting after it",
    "[ps:0] I1202 12:21:57.500000 1400 shutdown.py:118] the chief exited (0.0s)",
    "[ps:0] I1202 12:21:57.600000 1400 shutdown.py:135] the other tasks exited (0.1s): exiting "
    "last, as the coordination leader",
]
SERVING_NEWS = [
    "[ps:0] I1202 12:21:52.000000 1400 serve.py:151] waiting for the chief at 127.0.0.1:5000",
    "[ps:0] W1202 12:21:58.000000 1400 shutdown.py:93] training finished, but not every task "
    "reached the final barrier (UnavailableError: gone); exiting anyway",
    "[ps:0] I1202 12:21:57.500000 1400 shutdown.py:116] exiting although the chief still listens "
    "after 30s",
]


def test_serving_tasks_routine_lines_are_the_launchers_to_hide_and_news_is_shown():
    """Under a launcher (serving_routine=False) 16 tasks' 'serve as', 'serving at', 'chief is up'
    stay in their logs; a task started by hand keeps them; what is news is shown either way."""
    lines = SERVING_ROUTINE_LINES + SERVING_NEWS
    assert _shown(lines, serving_routine=False) == SERVING_NEWS
    assert _shown(lines) == lines
