"""The cause in the launcher's failure line, from real TensorFlow errors, and the console lines of a
failed step: tfdist_trainer.launch.failure_cause.TracebackHold and console.ConsoleFilter, in process.

Every fixture was captured on TF 2.21 (CPU): the first five from a small script that runs the op in
a tf.function (or eagerly) and dies of it; PSS_CHIEF and the follow-on lines from `tfdist-launch`
under parameter_server (chief, 1 worker, 1 ps) with the tiny sharded-embedding recipe fed ids past
table_3's 24 rows. A graph error prints "Graph execution error:" first and the op's message last;
the failure line must carry the message.
"""

from __future__ import annotations

from tfdist_trainer.launch.console import ConsoleFilter
from tfdist_trainer.launch.failure_cause import TracebackHold

#: A tf.debugging.assert_less in a tf.function on ids [1, 2, 3, 33], its message the one of ShardedEmbedding.
ASSERT_IN_FUNCTION = [
    "Traceback (most recent call last):",
    '  File "/tmp/cap/trig.py", line 20, in <module>',
    "    assert_fn(tf.constant([1, 2, 3, 33], tf.int64))",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/util/traceback_utils.py", line 167, in error_handler',
    "    raise e.with_traceback(filtered_tb) from None",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53, in quick_execute',
    "    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,",
    "  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:",
    "",
    "Detected at node assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '  File "/tmp/cap/trig.py", line 20, in <module>',
    "",
    '  File "/tmp/cap/trig.py", line 8, in assert_fn',
    "",
    "assertion failed: [table_5/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (x:0) = ] [1 2 3...] [y (Const:0) = ] [24]",
    "\t [[{{node assert_less/Assert/AssertGuard/Assert}}]] [Op:__inference_assert_fn_36]",
]

#: tf.gather of row 33 from a [24, 4] tensor in a tf.function (CPU).
GATHER_IN_FUNCTION = [
    "Traceback (most recent call last):",
    '  File "/tmp/cap/trig.py", line 22, in <module>',
    "    gather_fn(tf.constant([1, 2, 3, 33]))",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/util/traceback_utils.py", line 167, in error_handler',
    "    raise e.with_traceback(filtered_tb) from None",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53, in quick_execute',
    "    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,",
    "  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:",
    "",
    "Detected at node GatherV2 defined at (most recent call last):",
    '  File "/tmp/cap/trig.py", line 22, in <module>',
    "",
    '  File "/tmp/cap/trig.py", line 13, in gather_fn',
    "",
    "indices[3] = 33 is not in [0, 24)",
    "\t [[{{node GatherV2}}]] [Op:__inference_gather_fn_8]",
]

#: The same gather, eagerly: one exception line, no graph stack.
GATHER_EAGER = [
    "Traceback (most recent call last):",
    '  File "/tmp/cap/eager.py", line 2, in <module>',
    "    tf.gather(tf.zeros([24, 4]), tf.constant([1, 33]))",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/util/traceback_utils.py", line 167, in error_handler',
    "    raise e.with_traceback(filtered_tb) from None",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/framework/ops.py", line 6027, in raise_from_not_ok_status',
    "    raise core._status_to_exception(e) from None  # pylint: disable=protected-access",
    "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "tensorflow.python.framework.errors_impl.InvalidArgumentError: {{function_node __wrapped__GatherV2_device_/job:localhost/replica:0/task:0/device:CPU:0}} indices[1] = 33 is not in [0, 24) [Op:GatherV2] name: ",
]

#: tf.ones of 2**60 floats in a tf.function (CPU).
OOM_IN_FUNCTION = [
    "Traceback (most recent call last):",
    '  File "/tmp/cap/trig.py", line 24, in <module>',
    "    oom_fn(tf.constant(1 << 20))",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/util/traceback_utils.py", line 167, in error_handler',
    "    raise e.with_traceback(filtered_tb) from None",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53, in quick_execute',
    "    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,",
    "  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:",
    "",
    "Detected at node ones defined at (most recent call last):",
    '  File "/tmp/cap/trig.py", line 24, in <module>',
    "",
    '  File "/tmp/cap/trig.py", line 17, in oom_fn',
    "",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/dtensor/python/api.py", line 64, in call_with_layout',
    "",
    "OOM when allocating tensor with shape[1048576,1048576,1048576] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
    "\t [[{{node ones}}]]",
    "Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_upon_oom to RunOptions for current allocation info. This isn't available when running in Eager mode.",
    " [Op:__inference_oom_fn_12]",
]

#: The assertion under MirroredStrategy on two logical CPUs: both replicas failed.
TWO_ROOT_ERRORS = [
    "Traceback (most recent call last):",
    '  File "/tmp/cap/roots.py", line 13, in <module>',
    "    step(tf.constant([1, 2, 3, 33], tf.int64))",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/util/traceback_utils.py", line 167, in error_handler',
    "    raise e.with_traceback(filtered_tb) from None",
    '  File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53, in quick_execute',
    "    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,",
    "  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:",
    "",
    "Detected at node assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "",
    '  File "/tmp/__autograph_generated_file5el9osn2.py", line 16, in fn',
    "",
    "Detected at node assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "",
    '  File "/tmp/__autograph_generated_file5el9osn2.py", line 16, in fn',
    "",
    "2 root error(s) found.",
    "  (0) INVALID_ARGUMENT:  assertion failed: [table_5/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (x:0) = ] [1 2 3...] [y (Const:0) = ] [24]",
    "\t [[{{node assert_less/Assert/AssertGuard/Assert}}]]",
    "\t [[Func/replica_1/assert_less/Assert/AssertGuard/else/_11/input/_40/_14]]",
    "  (1) INVALID_ARGUMENT:  assertion failed: [table_5/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (x:0) = ] [1 2 3...] [y (Const:0) = ] [24]",
    "\t [[{{node assert_less/Assert/AssertGuard/Assert}}]]",
    "0 successful operations.",
    "0 derived errors ignored. [Op:__inference_step_77]",
]

#: What the launcher fed the chief's TracebackHold when a worker's batch had an id past table_3's 24 rows (tfdist-launch, parameter_server, the tiny sharded-embedding recipe; File frames trimmed).
PSS_CHIEF = [
    "[chief:0] E1125 23:48:11.703355 140272062908096 cluster_coordinator.py:1129]  /job:worker/task:0 encountered the following error when processing closure: InvalidArgumentError():Graph execution error:",
    "[chief:0] ",
    "[chief:0] Detected at node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "[chief:0] ",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/embedding.py", line 83, in call',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/weight.py", line 116, in gather',
    "[chief:0] ",
    "[chief:0] Detected at node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "[chief:0] ",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/embedding.py", line 83, in call',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/weight.py", line 116, in gather',
    "[chief:0] ",
    "[chief:0] assertion failed: [table_3/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (while/click_model_1/table_3_1/Reshape:0) = ] [45 37 47...] [y (while/click_model_1/table_3_1/Const:0) = ] [24]",
    "[chief:0] \t [[{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]",
    "[chief:0] Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.eager.EagerService/Enqueue:",
    '[chief:0] :UNKNOWN:Error received from peer  {grpc_message:" assertion failed: [table_3/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (while/click_model_1/table_3_1/Reshape:0) = ] [45 37 47...] [y (while/click_model_1/table_3_1/Const:0) = ] [24]\\n\\t [[{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]", grpc_status:3} [Op:__inference_train_loop_2400]',
    "[chief:0] E1125 23:48:11.705308 140272046122688 cluster_coordinator.py:439] Start cancelling closures due to error InvalidArgumentError(): Graph execution error:",
    "[chief:0] ",
    "[chief:0] Detected at node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "[chief:0] ",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/embedding.py", line 83, in call',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/weight.py", line 116, in gather',
    "[chief:0] ",
    "[chief:0] Detected at node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "[chief:0] ",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/embedding.py", line 83, in call',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/weight.py", line 116, in gather',
    "[chief:0] ",
    "[chief:0] assertion failed: [table_3/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (while/click_model_1/table_3_1/Reshape:0) = ] [45 37 47...] [y (while/click_model_1/table_3_1/Const:0) = ] [24]",
    "[chief:0] \t [[{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]",
    "[chief:0] Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.eager.EagerService/Enqueue:",
    '[chief:0] :UNKNOWN:Error received from peer  {grpc_message:" assertion failed: [table_3/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (while/click_model_1/table_3_1/Reshape:0) = ] [45 37 47...] [y (while/click_model_1/table_3_1/Const:0) = ] [24]\\n\\t [[{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]", grpc_status:3} [Op:__inference_train_loop_2400]',
    "[chief:0] Traceback (most recent call last):",
    '[chief:0]   File "<frozen runpy>", line 198, in _run_module_as_main',
    '[chief:0]   File "<frozen runpy>", line 88, in _run_code',
    '[chief:0]   File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/eager/context.py", line 1696, in call_function',
    "[chief:0]     outputs = execute.execute_with_cancellation(",
    "[chief:0]               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '[chief:0]   File "/work/main/.venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 103, in execute_with_cancellation',
    "[chief:0]     tensors = pywrap_tfe.TFE_Py_ExecuteCancelable(ctx._handle, device_name,",
    "[chief:0]               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "[chief:0] tensorflow.python.framework.errors_impl.InvalidArgumentError: Graph execution error:",
    "[chief:0] ",
    "[chief:0] Detected at node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "[chief:0] ",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/embedding.py", line 83, in call',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/weight.py", line 116, in gather',
    "[chief:0] ",
    "[chief:0] Detected at node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert defined at (most recent call last):",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1002, in _bootstrap',
    "[chief:0] ",
    '[chief:0]   File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/embedding.py", line 83, in call',
    "[chief:0] ",
    '[chief:0]   File "/work/main/tfdist_trainer/sharding/weight.py", line 116, in gather',
    "[chief:0] ",
    "[chief:0] assertion failed: [table_3/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (while/click_model_1/table_3_1/Reshape:0) = ] [45 37 47...] [y (while/click_model_1/table_3_1/Const:0) = ] [24]",
    "[chief:0] \t [[{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]",
    "[chief:0] Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling /tensorflow.eager.EagerService/Enqueue:",
    '[chief:0] :UNKNOWN:Error received from peer  {grpc_message:" assertion failed: [table_3/embeddings: ids must be < 24 (the rows)] [Condition x < y did not hold element-wise:] [x (while/click_model_1/table_3_1/Reshape:0) = ] [45 37 47...] [y (while/click_model_1/table_3_1/Const:0) = ] [24]\\n\\t [[{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]", grpc_status:3} [Op:__inference_train_loop_2400]',
]


# -- what the other tasks (and the coordinator) print once a step failed; each record with its
# continuation lines, prefixed as the launcher feeds them
FOLLOW_ON = [
    "[ps:0] W0000 00:00:1795650275.539956    3292 grpc_worker_service.cc:536] RecvTensor cancelled "
    "for -3600443148380910146",
    "[ps:0] W0000 00:00:1795650275.540042    3292 grpc_worker_service.cc:536] RecvTensor cancelled "
    "for -3600443148380910146",
    "[ps:0] W0000 00:00:1795650276.545754    3687 local_rendezvous.cc:412] Local rendezvous is "
    "aborting with status: ABORTED: Step -3600443148380910146 cancelled.  Cancelling rendezvous. "
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
    "[worker:0] W0000 00:00:1795650491.707129    7450 local_rendezvous.cc:412] Local rendezvous is "
    "aborting with status: CANCELLED: Loop execution was cancelled.",
    "[worker:0] \t [[{{node while/LoopCond/_53}}]] [type.googleapis.com/tensorflow.DerivedStatus='']",
    "[chief:0] W0000 00:00:1795650491.702698    7445 destroy_tensor_handle_node.h:59] Ignoring an "
    "error encountered when deleting remote tensors handles: INVALID_ARGUMENT: Unable to find the "
    "relevant tensor remote_handle: Op ID: 275, Output num: 0",
    "[chief:0] Additional GRPC error information from remote target /job:worker/replica:0/task:0 "
    "while calling /tensorflow.eager.EagerService/Enqueue:",
    '[chief:0] :UNKNOWN:Error received from peer  {grpc_message:"Unable to find the relevant tensor '
    'remote_handle: Op ID: 275, Output num: 0", grpc_status:3} '
    "[type.googleapis.com/tensorflow.core.platform.ErrorSourceProto='\\x08\\x05']",
    "[chief:0] E1125 23:48:11.712572 140272062908096 cluster_coordinator.py:935] Remote function on "
    "worker /job:worker/replica:0/task:0 failed with CancelledError():CANCELLED",
    "[chief:0] Additional GRPC error information from remote target /job:worker/replica:0/task:0 "
    "while calling /tensorflow.eager.EagerService/Enqueue:",
    '[chief:0] :UNKNOWN:Error received from peer  {grpc_message:"CANCELLED", grpc_status:1} '
    "[Op:__inference_train_loop_2400]",
    "[chief:0] This derived error is ignored and not reported to users.",
]

#: The failing worker's own notice of the error: a repetition of what the task that ran the step
#: reports (its traceback, or its one sentence), so it is folded with the other follow-on lines.
ROOT_NOTICE = [
    "[worker:0] W0000 00:00:1795650491.690285    7450 local_rendezvous.cc:412] Local rendezvous is "
    "aborting with status: INVALID_ARGUMENT: assertion failed: [table_3/embeddings: ids must be < 24 "
    "(the rows)] [Condition x < y did not hold element-wise:] [x "
    "(while/click_model_1/table_3_1/Reshape:0) = ] [45 37 47...] [y "
    "(while/click_model_1/table_3_1/Const:0) = ] [24]",
    "[worker:0] \t [[{{function_node while_click_model_1_table_3_1_assert_less_Assert_AssertGuard_"
    "false_1390}}{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]",
]

TABLE_3_BOUND = (
    "InvalidArgumentError: assertion failed: [table_3/embeddings: ids must be < 24 (the rows)]"
)


def _cause(lines: list[str]) -> str | None:
    hold = TracebackHold()
    for line in lines:
        assert hold.feed(line) == [], line  # held: the task's fate is not known yet
    return hold.cause()


def test_the_cause_of_a_failed_assertion_is_its_message_without_the_data():
    assert _cause(ASSERT_IN_FUNCTION) == (
        "InvalidArgumentError: assertion failed: [table_5/embeddings: ids must be < 24 (the rows)]"
    )


def test_the_cause_of_several_root_errors_is_the_first():
    assert _cause(TWO_ROOT_ERRORS) == (
        "InvalidArgumentError: assertion failed: [table_5/embeddings: ids must be < 24 (the rows)]"
    )


def test_the_cause_of_an_out_of_range_gather_names_the_index_the_bound_and_the_node():
    assert _cause(GATHER_IN_FUNCTION) == (
        "InvalidArgumentError: indices[3] = 33 is not in [0, 24) (node GatherV2)"
    )
    # Eagerly, without the function TF wrapped the op in.
    assert (
        _cause(GATHER_EAGER)
        == "InvalidArgumentError: indices[1] = 33 is not in [0, 24) [Op:GatherV2]"
    )


def test_the_cause_of_an_oom_is_the_allocation_that_failed():
    assert _cause(OOM_IN_FUNCTION) == (
        "ResourceExhaustedError: OOM when allocating tensor with shape[1048576,1048576,1048576] and "
        "type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu (node ones)"
    )


def test_the_parameter_server_chief_prints_its_graph_traceback_once_with_the_table_and_bound():
    """The coordinator's two error records are held with the traceback and left out of what the
    launcher prints for the failure; a task that goes on would get them back whole."""
    hold = TracebackHold()
    assert [out for line in PSS_CHIEF for out in hold.feed(line)] == []
    assert hold.cause() == TABLE_3_BOUND
    printed = hold.traceback()
    first = PSS_CHIEF.index("[chief:0] Traceback (most recent call last):")
    assert printed == PSS_CHIEF[first:]
    assert sum("Graph execution error" in line for line in printed) == 1
    assert hold.release() == PSS_CHIEF


def test_a_coordinator_error_record_without_a_traceback_is_printed_whole():
    hold = TracebackHold()
    record = PSS_CHIEF[: PSS_CHIEF.index("[chief:0] Traceback (most recent call last):")]
    for line in record:
        hold.feed(line)
    assert hold.traceback() == record  # the task died of something else: keep what it said


def test_python_errors_keep_their_own_line():
    python = [
        "[chief:0] Traceback (most recent call last):",
        '[chief:0]   File "/work/my_project/trainers.py", line 12, in build_model',
        "[chief:0]     return keras.Sequential([keras.layers.Dense(self.units)])",
        "[chief:0] ValueError: units must be positive, got -1",
    ]
    assert _cause(python) == "ValueError: units must be positive, got -1"
    hold = TracebackHold()
    for line in python:
        hold.feed(line)
    assert hold.traceback() == python


def test_follow_on_lines_of_a_failed_step_are_hidden_and_counted():
    keep = ConsoleFilter(gpu=False)
    lines = ROOT_NOTICE + FOLLOW_ON + ["[chief:0] plain output after them"]
    assert [line for line in lines if keep(line)] == lines[-1:]
    assert keep.follow_on == 7  # records, not their continuation lines


def test_follow_on_lines_never_hide_a_traceback_after_them():
    keep = ConsoleFilter(gpu=False)
    tail = PSS_CHIEF[PSS_CHIEF.index("[chief:0] Traceback (most recent call last):") :]
    assert [line for line in FOLLOW_ON + tail if keep(line)] == tail


def test_a_failed_config_check_repeated_by_every_task_s_aborted_transfers_is_follow_on():
    # A capacity check that failed on ps:1, as ps:1 and worker:1 repeat it (tfdist-launch of
    # dynamic_tiny.gin with capacity 8 under parameter_server): the chief says the sentence once.
    check = (
        "assertion failed: [table_5 shard 0: one batch brought ] [11] [ distinct keys that need "
        "a row to this shard, which holds 4 rows; raise capacity to at least ] [22] [ (2 shard(s) "
        "x the keys this shard got)]"
    )
    node = (
        "\t [[{{function_node while_click_model_1_table_5_1_critical_section_execute_tfdist_"
        "config_check_AssertGuard_false_7898}}]]"
    )
    repeated = [
        "[ps:1] W1128 21:46:39.123 140 local_rendezvous.cc:412] Local rendezvous is aborting with "
        f"status: INVALID_ARGUMENT: {check}",
        f"[ps:1] {node}",
        "[worker:1] W1128 21:46:39.125 141 local_rendezvous.cc:412] Local rendezvous is aborting "
        f"with status: INVALID_ARGUMENT: {check}",
        f"[worker:1] {node}",
        "[worker:1] Additional GRPC error information from remote target /job:ps/replica:0/task:1 "
        "while calling /tensorflow.WorkerService/RecvTensor:",
        f'[worker:1] :UNKNOWN:Error received from peer  {{grpc_message:"{check}"}}',
        "[worker:1] \t [[while/body/_1/while/click_model_1/table_3_1/Tile/ReadVariableOp/_225]]",
    ]
    sentence = "[chief:0] error: table_5 shard 0: one batch brought 11 distinct keys ..."
    keep = ConsoleFilter(gpu=False)
    assert [line for line in [*repeated, sentence] if keep(line)] == [sentence]
    assert keep.follow_on == 2


def test_a_lost_workers_function_notices_on_the_chief_are_follow_on():
    # SIGKILL of worker:1 of a parameter_server job (tfdist-launch, MNIST, 3 workers): the chief's
    # coordinator then (un)registers each function on the dead worker, one notice a function.
    lost = "Worker /job:worker/replica:0/task:1 failed with UnavailableError():Socket closed"
    notices = []
    for verb, line in (("register", 873), ("remove", 911)):
        notices += [
            f"[chief:0] E0000 00:00:1795903576.460121    3748 context.cc:{line}] Failed to {verb} "
            "function remotely due to failed to connect to all addresses; last error: UNKNOWN: "
            "ipv4:127.0.0.1:30211: Failed to connect to remote host: Connection refused",
            "[chief:0] Additional GRPC error information from remote target "
            "/job:worker/replica:0/task:1 while calling /tensorflow.eager.EagerService/Enqueue:",
            '[chief:0] :UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all '
            'addresses", grpc_status:14}',
            "[chief:0] This could happen if the remote target has been disconnected from the "
            "client.",
        ]
    notices.append(
        "[chief:0] W0000 00:00:1795903574.482203    4310 context_distributed_manager.cc:968] "
        "Device filters can only be specified when initializing the cluster. Any changes in "
        "device filters are ignored when updating the server def."
    )
    first = f"[chief:0] E1128 22:06:14.478752 1404 cluster_coordinator.py:949] {lost}"
    step = "[chief:0] I1128 22:06:15.1 1404 run_context.py:91] step 250/400 loss=0.15"
    keep = ConsoleFilter(gpu=False)
    assert [line for line in [first, *notices, step] if keep(line)] == [first, step]
    assert keep.follow_on == 3
