"""Online tuning of router weights: a (1+1)-ES driven by windows of finished requests.

Generic over any router exposing ``get_weights`` / ``set_weights``.
"""

from longroute.tuning.es import OnePlusOneES
from longroute.tuning.objectives import OBJECTIVES, Objective, get_objective
from longroute.tuning.online import OnlineTuner, TunerStep
from longroute.tuning.tunable import UNBOUNDED, TunableRouter, WeightBound, as_tunable
from longroute.tuning.weights_file import (
    FrozenWeights,
    WeightsFileError,
    load_weights,
    save_weights,
)

__all__ = [
    "OBJECTIVES",
    "UNBOUNDED",
    "FrozenWeights",
    "Objective",
    "OnePlusOneES",
    "OnlineTuner",
    "TunableRouter",
    "TunerStep",
    "WeightBound",
    "WeightsFileError",
    "as_tunable",
    "get_objective",
    "load_weights",
    "save_weights",
]
