"""Scale beyond one compiled program: the actor-learner split (`run_split`)."""

from jaxrl_engine.distributed.split import run_split

__all__ = ["run_split"]
