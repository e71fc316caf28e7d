#!/usr/bin/env bash
# One prepared accelerator session for issues 14 and 16 (run where a GPU is lent), in parts
# that each fit the device tool's 10-minute calls:
#   brax        a smoke run of the default config on the GPU, then the Brax halfcheetah run:
#               configs/ppo_brax_halfcheetah.yaml, then Brax's own PPO trainer with its published
#               settings (benchmarks/brax_reference.py), each cut at $HC_LIMIT seconds (SIGTERM:
#               the engine checkpoints and stops with exit 75, its curve kept); ~7 minutes;
#   throughput  benchmarks/ppo_throughput.py (engine vs the hand-fused loop, lever rows) at the
#               default size (16 envs) and at 2048 envs, then benchmarks/offpolicy_throughput.py
#               (DQN and SAC epochs), then benchmarks/cnn_epoch.py (is `algo.cnn.impl: auto`'s
#               choice of xla right on a GPU?); ~6 minutes.
#   minatar     the MinAtar games not shipped yet (Asterix, Freeway, Seaquest): seeds 0-4 of the
#               Breakout settings (lr 1e-3, 10M env steps) as one sweep per game, each cut at
#               $MINATAR_LIMIT seconds (Asterix ran at ~0.66M env steps/s over five members in
#               session 14: ~80 s of training); ~8 minutes.
# Everything it prints goes to $OUT/log.txt; run dirs and the reference curve to $OUT.
#
#   OUT=/tmp/gpu bash benchmarks/gpu_session.sh brax|throughput|minatar|all
#
# Packages the machine lacks travel as wheels in .whl/ (git-ignored; installed into /tmp/site
# first). Session 14 fetched them for the device's Python 3.12 with (versions: this project's venv)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     brax==0.14.2 gymnax==1.0.1 gymnasium==1.3.0 farama-notifications glfw==2.11.0 \
#     jaxopt==0.8.5 ml_collections==1.1.0 mujoco==3.17.0 mujoco-mjx==3.17.0 trimesh==5.2.0 \
#     pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     tensorboardX==2.6.5
# (38 MB; jax, flax, optax, chex, orbax, rich, matplotlib are the machine's own).
set -uo pipefail
PART=${1:-all}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
PY=${PY:-python3}
HC_LIMIT=${HC_LIMIT:-170}
MINATAR_LIMIT=${MINATAR_LIMIT:-150}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site ] && compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T=$(mktemp -d)
exec > >(tee -a "$OUT/log.txt") 2>&1

step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
step "machine"
nvidia-smi -L || true
$PY -c "import jax, flax, optax, chex; print('jax', jax.__version__, 'flax', flax.__version__, \
'optax', optax.__version__, 'chex', chex.__version__, jax.devices())"
git rev-parse --short HEAD 2>/dev/null || true

if [ "$PART" = brax ] || [ "$PART" = all ]; then
step "smoke: default config, 204,800 env steps"
timeout 120 $PY -m jaxrl_engine.cli train total_env_steps=204800 run_dir="$T" | tail -1

step "Brax halfcheetah: the engine (limit ${HC_LIMIT} s)"
timeout -s TERM "$HC_LIMIT" $PY -m jaxrl_engine.cli train configs/ppo_brax_halfcheetah.yaml \
  run_dir="$T" | tail -1
echo "exit $?"
$PY - "$T/ppo_brax_halfcheetah" <<'PY'
import json, sys, pathlib
for line in (pathlib.Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines():
    m = json.loads(line)
    if "evaluate/episode_return" in m:
        print(m["env_steps"], round(m["evaluate/episode_return"], 1), round(m["wall_s"], 1))
PY

step "Brax halfcheetah: Brax's own PPO trainer (limit ${HC_LIMIT} s)"
timeout -s TERM "$HC_LIMIT" $PY benchmarks/brax_reference.py --env halfcheetah \
  --steps 50000000 --evals 11 --out "$OUT/brax_reference_halfcheetah.json"

fi

if [ "$PART" = throughput ] || [ "$PART" = all ]; then
step "ppo_throughput, default size (16 envs x 128 steps)"
timeout 150 $PY benchmarks/ppo_throughput.py --epochs 100 --repeats 5

step "ppo_throughput, 2048 envs x 128 steps (no lever rows)"
timeout 100 $PY benchmarks/ppo_throughput.py --epochs 20 --repeats 5 --no-lever-rows \
  --no-guard-row --override env.num_envs=2048

step "offpolicy_throughput"
timeout 90 $PY benchmarks/offpolicy_throughput.py --repeats 10

step "cnn_epoch (algo.cnn.impl matmul vs xla; exits 1 where matmul is not 2x faster)"
timeout 90 $PY benchmarks/cnn_epoch.py --repeats 3

fi

if [ "$PART" = minatar ] || [ "$PART" = all ]; then
for game in Asterix Freeway Seaquest; do
  step "$game-MinAtar: seeds 0-4, the Breakout settings (limit ${MINATAR_LIMIT} s)"
  timeout -s TERM "$MINATAR_LIMIT" $PY -m jaxrl_engine.cli sweep configs/ppo_minatar_breakout.yaml \
    'seeds=0..4' env.id="$game-MinAtar" name="ppo_minatar_$game" run_dir="$T" | tail -1
  cp "$T/ppo_minatar_$game/sweep.csv" "$OUT/minatar_$game.csv" 2>/dev/null || true
done
fi

step "done"
(cd "$T" && tar czf "$OUT/runs-$PART.tar.gz" --exclude='checkpoints' --exclude='events.out.tfevents*' . ) || true
