"""The compiled loops: training step loops (synchronous or scheduled), their size, the eval pass.

`body` is the one step-loop body; `synchronous` runs it in the task, `scheduled`
hands it to parameter_server workers; `size` picks steps per call; `evaluation`
is one pass over the eval data.
"""

from tfdist_trainer.runtime.loops.body import LoopResult, never
from tfdist_trainer.runtime.loops.evaluation import EvalLoop, metric_values
from tfdist_trainer.runtime.loops.scheduled import EMPTY_ROUNDS_AT_END, ScheduledTrainLoop
from tfdist_trainer.runtime.loops.size import FixedStepsPerLoop, StepsPerLoopTuner, search_maximum
from tfdist_trainer.runtime.loops.synchronous import TrainLoop

__all__ = [
    "EMPTY_ROUNDS_AT_END",
    "EvalLoop",
    "FixedStepsPerLoop",
    "LoopResult",
    "ScheduledTrainLoop",
    "StepsPerLoopTuner",
    "search_maximum",
    "TrainLoop",
    "metric_values",
    "never",
]
