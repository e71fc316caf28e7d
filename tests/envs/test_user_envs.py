"""A gymnasium env of the user's own, named from the CLI in gymnasium's `module:EnvName-v0`
form: the module is found next to the user (the console script does not put the current
directory on `sys.path`); a run directory that names such a module is data, so resume and
eval import it only when the user says `--import MODULE`."""

from __future__ import annotations

import importlib
import itertools
import json
import sys

import numpy as np
import pytest

from jaxrl_engine import cli
from tests.conftest import SMALL

CORRIDOR = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Corridor(gym.Env):
    """Five cells; action 1 walks right, 0 left; reward 1 on reaching the last cell."""

    observation_space = spaces.Box(0.0, 1.0, (5,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def _obs(self):
        obs = np.zeros(5, np.float32)
        obs[self.pos] = 1.0
        return obs

    def step(self, action):
        self.pos = max(0, min(4, self.pos + (1 if int(action) == 1 else -1)))
        done = self.pos == 4
        return self._obs(), float(done), done, False, {}


gym.register("{env}", entry_point=Corridor, max_episode_steps=20)
'''

_names = itertools.count()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """(module name, env name): a module in the test's working directory registering the
    env; forgotten again (as by a new process) when the test ends."""
    k = next(_names)
    name, env = f"my_corridor_{k}", f"MyCorridor{k}-v0"  # gymnasium warns on a re-registration
    (tmp_path / f"{name}.py").write_text(CORRIDOR.replace("{env}", env))
    monkeypatch.chdir(tmp_path)
    yield name, env
    sys.modules.pop(name, None)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.filterwarnings("ignore:.*Overriding environment")  # --import registers it again
def test_a_users_env_trains_resumes_and_evaluates_with_its_module_imported(
    user_module, tmp_path, capsys
):
    module, env = user_module
    run = tmp_path / "runs" / "corridor"
    status, out, err = run_cli(
        capsys,
        "train",
        *SMALL,
        "env.suite=gymnasium",
        f"env.id={module}:{env}",
        f"run_dir={tmp_path / 'runs'}",
        "name=corridor",
    )
    assert status == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["env_steps"] >= 256 and (run / "checkpoints").is_dir()

    sys.modules.pop(module)  # a new process: nothing has imported the module
    for argv in (["train", "--resume", str(run)], ["eval", str(run), "--episodes", "4"]):
        status, out, err = run_cli(capsys, *argv)
        assert status == cli.EXIT_BAD_INPUT, err
        assert f"registered by the module '{module}'" in err and f"--import {module}" in err
        assert module not in sys.modules  # refused before anything imported it

    status, out, err = run_cli(capsys, "train", "--resume", str(run), "--import", module)
    assert status == 0, err  # a finished run: its summary, unchanged
    assert json.loads(out.strip().splitlines()[-1])["env_steps"] == summary["env_steps"]
    status, out, err = run_cli(capsys, "eval", str(run), "--episodes", "4", "--import", module)
    assert status == 0, err
    assert json.loads(out.strip().splitlines()[-1])["episodes"] == 4

    # The module edited since training (15 cells): eval names both shapes, no XLA message.
    sys.modules.pop(module)
    source = tmp_path / f"{module}.py"
    source.write_text(source.read_text().replace("(5,)", "(15,)").replace("zeros(5", "zeros(15"))
    importlib.invalidate_caches()
    status, out, err = run_cli(capsys, "eval", str(run), "--episodes", "4", "--import", module)
    assert status == cli.EXIT_BAD_INPUT, err
    assert "now gives observations of shape [15] float32" in err, err
    assert "exported policy takes [5] float32" in err and "Traceback" not in err


def test_async_workers_find_the_users_module_in_the_current_directory(user_module, capsys):
    """Spawned workers import the env's module again, from a copy of the path the engine had
    while they started: the directory it found the module in is on it then (and only then)."""
    module, env = user_module
    before = list(sys.path)
    status, out, err = run_cli(
        capsys,
        "train",
        *SMALL,
        "env.suite=gymnasium",
        f"env.id={module}:{env}",
        "env.vectorization=async",
        "run_dir=runs",
        "name=corridor_async",
    )
    assert status == 0, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"
    assert sys.path == before


BAD_IDS = {
    "no such module": (
        "no_such_module_xyz:MyCorridor-v0",
        ["no module named 'no_such_module_xyz'"],
    ),
    "module registers another name": (
        "{module}:Elsewhere-v0",
        ["'Elsewhere-v0' is not a registered gymnasium id (after importing '{module}')"],
    ),
    "no module before the colon": (":MyCorridor-v0", ["the form is 'module:EnvName-v0'"]),
}


@pytest.mark.parametrize("env_id, fragments", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_a_bad_user_env_id_is_refused_naming_the_key(
    env_id, fragments, user_module, tmp_path, capsys
):
    module, _ = user_module
    status, out, err = run_cli(
        capsys,
        "train",
        *SMALL,
        "env.suite=gymnasium",
        f"env.id={env_id.format(module=module)}",
        f"run_dir={tmp_path / 'runs'}",
    )
    assert status == cli.EXIT_BAD_INPUT and out == ""
    assert "'env.id'" in err
    for fragment in fragments:
        assert fragment.format(module=module) in err, err
    assert not (tmp_path / "runs").exists()


def test_a_user_module_that_fails_on_import_is_named_with_its_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_envs_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    status, out, err = run_cli(
        capsys, "train", *SMALL, "env.suite=gymnasium", "env.id=broken_envs_mod:X-v0"
    )
    assert status == cli.EXIT_BAD_INPUT and out == ""
    assert "importing 'broken_envs_mod' raised RuntimeError: boom at import" in err
    status, _, err = run_cli(capsys, "eval", str(tmp_path), "--import", "broken_envs_mod")
    assert status == cli.EXIT_BAD_INPUT
    assert "--import broken_envs_mod: RuntimeError: boom at import" in err
    sys.modules.pop("broken_envs_mod", None)


BREAKING = '''
import os

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Breaks(gym.Env):
    """Steps fine until step 3, then breaks as `how` says."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, how="raise"):
        self.how, self.n = how, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.n += 1
        if self.n >= 3:
            if self.how == "raise":
                raise RuntimeError("broke at step %d (100%% sure)" % self.n)
            if self.how == "exit":
                os._exit(3)
            return np.zeros(3, np.float32), 1.0, False, False, {}  # "shape"
        return np.zeros(2, np.float32), 1.0, False, False, {}


gym.register("{env}", entry_point=Breaks)
'''


@pytest.mark.parametrize(
    "how, vectorization, error, message",
    [
        # gymnasium's async env logged the worker's traceback through `%` formatting: a `%`
        # in it raised "TypeError: not enough arguments for format string" instead.
        ("raise", "async", RuntimeError, r"broke at step 3 \(100% sure\)"),
        ("exit", "async", RuntimeError, r"a worker process died during step\(\) \(worker 0: exit"),
        ("shape", "sync", ValueError, r"step\(\) returned observations that do not fit its obs"),
        ("shape", "async", ValueError, r"step\(\) returned observations that do not fit its obs"),
    ],
)
def test_an_env_that_breaks_while_stepping_is_named(
    tmp_path, monkeypatch, how, vectorization, error, message
):
    from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv

    k = next(_names)
    name, env_id = f"breaking_{k}", f"Breaks{k}-v0"
    (tmp_path / f"{name}.py").write_text(BREAKING.replace("{env}", env_id))
    monkeypatch.chdir(tmp_path)
    env = GymnasiumEnv(f"{name}:{env_id}", 1, 1, {"how": how}, vectorization)
    try:
        env._host_reset(env.params, np.zeros(2, np.uint32))
        with pytest.raises(error, match=message):
            for _ in range(3):
                env._host_step(env.params, np.zeros(1, np.int32))
    finally:
        env.close()
