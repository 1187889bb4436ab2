"""The rollout side and the records it shares with the learner and the driver: engines, episodes, the sampler,
env-pool and curriculum actors, elastic pools, weight transport, and the run directory, models and trajectories."""
