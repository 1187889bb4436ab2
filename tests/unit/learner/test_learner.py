"""The learner (plain object, no Ray) on tiny-random: packing, algorithms, updates, checkpoints."""

import pytest
import torch

from agentgym_rl.actors.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_MODEL, AdapterError, load_policy
from agentgym_rl.actors.model_store import load_model, load_tokenizer
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.configs.loader import apply_override
from agentgym_rl.learner.actor import LearnerActor
from tests.unit.learner.helpers import batch_of

ALGORITHMS = {
    "grpo": ["algorithm.entropy_coef=0.01"],
    "rloo": ["algorithm.kl_mode=reward"],
    "reinforce_pp": ["algorithm.gamma=0.9", "algorithm.kl_estimator=k2"],
    "ppo": ["algorithm.lam=0.9", "algorithm.dual_clip=3.0"],
    "sft": [],
    "gigpo": ["algorithm.gamma=0.9", "algorithm.entropy_coef=0.01"],
    "gspo": ["algorithm.entropy_coef=0.01"],
    "cispo": ["algorithm.entropy_coef=0.01"],
}
# Every policy-gradient option on top of an algorithm: (algorithm, overrides).
OPTIONS = [
    ("grpo", ["algorithm.credit=turn", "algorithm.turn_gamma=0.9"]),
    ("rloo", ["algorithm.credit=turn", "algorithm.turn_gamma=0.9"]),
    ("reinforce_pp", ["algorithm.gamma=1.0", "algorithm.credit=turn", "algorithm.turn_gamma=0.8"]),
    ("grpo", ["algorithm.clip_low=0.2", "algorithm.clip_high=0.28"]),
    ("grpo", ["algorithm.rollout_correction=tis"]),
    ("grpo", ["algorithm.rollout_correction=mis", "algorithm.rollout_correction_cap=1.5"]),
    ("grpo", ["algorithm.overlong_penalty=0.5"]),
    ("rloo", ["algorithm.policy_loss=gspo", "algorithm.aggregation=seq_mean"]),
    ("ppo", ["algorithm.policy_loss=cispo", "algorithm.dual_clip=null", "algorithm.clip_low=1.0"]),
]


def keyed_batch() -> list[Trajectory]:
    """``batch_of()`` with env state keys (the two turns of a group's episodes share the first state) and
    the second reply of every other episode cut by the token cap."""
    return [
        t.model_copy(update={"state_keys": ["start", f"after-{k % 2}"], "turn_capped": [False, k % 2 == 0]})
        for k, t in enumerate(batch_of())
    ]


def make_learner(algorithm: str, *overrides: str, sampler_dtype: str = "float32") -> LearnerActor:
    """A float32 learner (these tests compare gradients of equal losses to float32 tolerances)."""
    data: dict = {}
    base = ["model.name=tiny-random", f"algorithm.name={algorithm}", "learner.lr=1e-3", "learner.precision=float32"]
    for item in [*base, *ALGORITHMS[algorithm]]:
        apply_override(data, item)
    for item in overrides:
        apply_override(data, item)
    config = Config.model_validate(data)
    return LearnerActor(
        model=config.model,
        learner=config.learner,
        algorithm=config.algorithm,
        seed=0,
        sampler_dtype=sampler_dtype,
        total_updates=10,
    )


def gradients(learner: LearnerActor) -> dict[str, torch.Tensor]:
    named = dict(learner.policy.named_parameters())
    if learner.critic is not None:
        named.update({f"critic.{k}": v for k, v in learner.critic.named_parameters()})
    return {name: p.grad.clone() for name, p in named.items() if p.grad is not None}


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "sft"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_packing_gives_the_same_loss_and_gradients_as_padding(algorithm, aggregation):
    trajectories = batch_of()
    results = []
    for packing in (False, True):
        learner = make_learner(
            algorithm,
            f"learner.packing={packing}",
            "learner.micro_batch_size=2",
            f"algorithm.aggregation={aggregation}",
        )
        batch = learner.prepare(trajectories)
        metrics = learner.accumulate_gradients(batch, torch.arange(len(trajectories)))
        results.append((metrics["learner/loss"], gradients(learner)))
    (loss_pad, grads_pad), (loss_pack, grads_pack) = results
    assert loss_pack == pytest.approx(loss_pad, rel=1e-4, abs=1e-6)
    assert grads_pad.keys() == grads_pack.keys() and grads_pad
    for name in grads_pad:
        assert torch.allclose(grads_pack[name], grads_pad[name], rtol=1e-3, atol=1e-6), name


@pytest.mark.parametrize(
    ("algorithm", "overrides"),
    [("grpo", []), ("gspo", []), ("cispo", ["algorithm.rollout_correction=tis"]), ("gigpo", [])],
)
def test_micro_batching_does_not_change_the_gradient(algorithm, overrides):
    """One micro-batch of the whole batch reduces over every token (or episode) of it; micro-batches of one
    episode, each weighted by its share of the tokens (episodes), give the same gradient: the token mean
    is over the batch, never a mean of micro-batch means."""
    trajectories = keyed_batch()
    grads = []
    for size in (1, 9):
        learner = make_learner(algorithm, f"learner.micro_batch_size={size}", *overrides)
        learner.accumulate_gradients(learner.prepare(trajectories), torch.arange(len(trajectories)))
        grads.append(gradients(learner))
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], rtol=1e-3, atol=1e-6), name


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_updates_the_policy(algorithm):
    learner = make_learner(algorithm, "learner.epochs=2", "learner.minibatches=2")
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    metrics = learner.update_batch(batch_of())
    assert metrics["learner/optimizer_steps"] == 4
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert learner.version == 1
    assert any(not torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())
    if algorithm == "ppo":
        assert "learner/value_loss" in metrics and learner.critic is not None
    if algorithm in ("grpo", "reinforce_pp", "ppo", "rloo", "gigpo", "gspo", "cispo"):
        assert learner.reference is not None


@pytest.mark.parametrize(("algorithm", "overrides"), OPTIONS)
def test_policy_gradient_options_train_with_finite_losses_and_gradients(algorithm, overrides):
    learner = make_learner(algorithm, *overrides, "learner.minibatches=2")
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    metrics = learner.update_batch(keyed_batch())
    assert metrics["learner/optimizer_steps"] == 2
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert metrics["learner/grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())
    if "rollout_correction" in " ".join(overrides):
        assert 0 < metrics["learner/rollout_is_weight_mean"]


def test_sft_lowers_the_nll_of_its_data():
    learner = make_learner("sft")
    trajectories = batch_of()
    losses = [learner.update_batch(trajectories)["learner/nll"] for _ in range(4)]
    assert losses[-1] < losses[0]


def test_checkpoint_round_trip_continues_identically(tmp_path):
    trajectories = batch_of()
    straight = make_learner("ppo")
    straight.update_batch(trajectories)
    straight.save_checkpoint(str(tmp_path / "ckpt"))
    expected = straight.update_batch(batch_of(seed=1))

    resumed = make_learner("ppo")
    assert resumed.load_checkpoint(str(tmp_path / "ckpt")) == 1
    got = resumed.update_batch(batch_of(seed=1))
    for key in ("learner/loss", "learner/grad_norm", "learner/value_loss", "learner/lr"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key
    for (name, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_lr_schedule_warms_up_then_decays():
    learner = make_learner("sft", "learner.warmup_steps=2", "learner.lr_schedule=linear")
    lrs = [learner.update_batch(batch_of())["learner/lr"] for _ in range(4)]
    assert lrs[0] == pytest.approx(1e-3)  # after step 0 the warm-up factor for step 1 is 2/2
    assert lrs[1] > lrs[2] > lrs[3]


LORA = ("learner.lora.enabled=true", "learner.lora.r=4", "learner.lora.alpha=8")


def test_lora_trains_adapters_and_publishes_only_the_adapter(tmp_path):
    learner = make_learner("grpo", *LORA)
    plain = load_model("tiny-random").state_dict()
    assert learner.describe()["trainable_parameters"] < learner.describe()["parameters"] / 2
    learner.update_batch(batch_of())
    merged = learner.policy_state_dict()
    assert merged.keys() == plain.keys()
    changed = {k for k in plain if not torch.equal(merged[k], plain[k])}
    assert changed and all(any(m in k for m in ("q_proj", "k_proj", "v_proj", "o_proj")) for k in changed)
    payload = learner.weights_payload()
    assert payload.lora_scale == 2.0
    assert payload.arrays and all(".lora_A." in k or ".lora_B." in k for k in payload.arrays)
    assert set(payload.dtypes.values()) == {"float32"}
    # adapters travel in the samplers' dtype, as full weights do
    bf16 = make_learner("grpo", *LORA, sampler_dtype="bfloat16").weights_payload()
    assert set(bf16.dtypes.values()) == {"bfloat16"} and bf16.num_bytes * 2 == payload.num_bytes
    # the checkpoint's policy/ is an adapter directory naming its base: no full weights are written
    learner.save_checkpoint(str(tmp_path / "ckpt"))
    policy = tmp_path / "ckpt" / "policy"
    assert {p.name for p in policy.iterdir()} >= {ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_MODEL}
    assert not (policy / "model.safetensors").exists()
    reloaded = load_policy("tiny-random", str(policy)).state_dict()
    for key in plain:
        assert torch.allclose(reloaded[key], merged[key], atol=1e-6), key


def test_lora_checkpoint_resumes_exactly(tmp_path):
    straight = make_learner("grpo", *LORA)
    straight.update_batch(batch_of())
    straight.save_checkpoint(str(tmp_path / "ckpt"))
    expected = [straight.update_batch(batch_of(seed=s)) for s in (1, 2)]

    resumed = make_learner("grpo", *LORA)
    assert resumed.load_checkpoint(str(tmp_path / "ckpt")) == 1
    got = [resumed.update_batch(batch_of(seed=s)) for s in (1, 2)]
    for before, after in zip(expected, got, strict=True):
        for key in ("learner/loss", "learner/grad_norm", "learner/lr"):
            assert after[key] == before[key], key
    for key, value in straight.policy_state_dict().items():
        assert torch.equal(resumed.policy_state_dict()[key], value), key


def test_a_run_starts_from_a_saved_adapter(tmp_path):
    first = make_learner("sft", *LORA)
    first.update_batch(batch_of())
    first.save_checkpoint(str(tmp_path / "ckpt"))
    adapter = str(tmp_path / "ckpt" / "policy")
    second = make_learner("grpo", *LORA, f"model.adapter={adapter}")
    for key, value in first.policy_state_dict().items():
        assert torch.equal(second.policy_state_dict()[key], value), key
    with pytest.raises(AdapterError, match="rank 4 and alpha 8.*learner.lora has r=8"):
        make_learner("grpo", "learner.lora.enabled=true", "learner.lora.r=8", f"model.adapter={adapter}")
    with pytest.raises(AdapterError, match="target_modules"):
        make_learner("grpo", *LORA, "learner.lora.target_modules=all-linear", f"model.adapter={adapter}")


def test_a_checkpoint_on_another_base_model_is_refused(tmp_path):
    learner = make_learner("grpo", *LORA)
    learner.save_checkpoint(str(tmp_path / "ckpt"))
    # the same architecture with other weights: a copy of tiny-random with one weight changed
    other = tmp_path / "other-base"
    model = load_model("tiny-random")
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    model.save_pretrained(other)
    load_tokenizer("tiny-random").save_pretrained(other)
    resumed = make_learner("grpo", *LORA, f"model.name={other}")
    with pytest.raises(AdapterError, match="trained on base model .*tiny-random.* but .*other-base.* hashes to"):
        resumed.load_checkpoint(str(tmp_path / "ckpt"))


def test_gradient_checkpointing_gives_the_same_gradient():
    trajectories = batch_of()
    grads = []
    for flag in (False, True):
        learner = make_learner("grpo", f"learner.gradient_checkpointing={flag}")
        learner.accumulate_gradients(learner.prepare(trajectories), torch.arange(len(trajectories)))
        grads.append(gradients(learner))
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-7), name
