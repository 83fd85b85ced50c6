"""The compiled loops: the synchronous training step loop, its size, the eval pass.

`body` is the one step-loop body; `synchronous` runs it in the task (parameter_server's
scheduled loop, which hands it to the workers, lives in its strategy's home,
`runtime/strategies/parameter_server/scheduled_loop.py`); `size` picks steps per call;
`evaluation` is one pass over the eval data.
"""

from tfdist_trainer.runtime.loops.body import LoopResult, never
from tfdist_trainer.runtime.loops.evaluation import EvalLoop, metric_values
from tfdist_trainer.runtime.loops.size import FixedStepsPerLoop, StepsPerLoopTuner, search_maximum
from tfdist_trainer.runtime.loops.synchronous import TrainLoop

__all__ = [
    "EvalLoop",
    "FixedStepsPerLoop",
    "LoopResult",
    "StepsPerLoopTuner",
    "search_maximum",
    "TrainLoop",
    "metric_values",
    "never",
]
