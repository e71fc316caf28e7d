"""Scale beyond one compiled program: multi-process jobs (`join`, `jax.distributed`) and the
actor-learner split (`run_split`)."""

from jaxrl_engine.distributed.multihost import join
from jaxrl_engine.distributed.split import run_split

__all__ = ["join", "run_split"]
