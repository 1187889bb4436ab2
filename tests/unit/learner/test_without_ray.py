"""The learner runs as a plain class where Ray is not installed (a bare GPU machine: torch, transformers, peft,
safetensors, and pydantic and structlog brought as wheels)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# A None entry in sys.modules makes `import ray` raise ImportError and importlib.util.find_spec("ray") return
# None, as in an environment without the package; so transformers' optional checks see no DeepSpeed either.
LEARNER_WITHOUT_RAY = """
import sys
for name in ("ray", "vllm", "deepspeed"):
    sys.modules[name] = None

from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor
from tests.unit.learner.helpers import batch_of

config = Config.model_validate(
    {"model": {"name": "tiny-random"}, "learner": {"precision": "float32", "device": "cpu"}}
)
learner = LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)
metrics = learner.update_batch(batch_of())
assert learner.version == 1 and metrics["learner/optimizer_steps"] == 1, metrics
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("ray", "vllm", "deepspeed"))
assert all(sys.modules[name] is None for name in loaded), loaded
print("updated without ray")
"""


def test_the_learner_imports_and_updates_without_ray():
    result = subprocess.run(
        [sys.executable, "-c", LEARNER_WITHOUT_RAY], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "updated without ray" in result.stdout
