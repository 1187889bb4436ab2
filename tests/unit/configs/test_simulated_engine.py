"""A simulated engine (``modelled``) can be configured for scale runs but never yields a held-out result."""

import pytest

from agentgym_rl.configs import ConfigError, load_config
from agentgym_rl.configs.engines import SimulatedEngineError, refuse_simulated


def test_a_run_with_the_modelled_engine_plays_no_heldout_tasks():
    # the quickstart plays 16 held-out tasks
    with pytest.raises(ConfigError, match="set trainer.heldout_tasks=0 \\(got 16\\)"):
        load_config(None, ["sampler.engine=modelled", "model.adapter=null"])
    config = load_config(None, ["sampler.engine=modelled", "model.adapter=null", "trainer.heldout_tasks=0"])
    assert config.sampler.engine == "modelled"


@pytest.mark.parametrize("engine", ["modelled", "agentgym_rl.actors.engines.modelled:ModelledEngine"])
def test_refuse_simulated_names_the_refuser_and_what_to_use(engine):
    with pytest.raises(SimulatedEngineError, match="a stage refuses engine .*use engine transformers or vllm"):
        refuse_simulated(engine, "a stage")
    refuse_simulated("transformers", "a stage")
