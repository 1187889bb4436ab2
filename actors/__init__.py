"""Rollout side of the system: engines, episodes, sampler and curriculum actors, the trainer driver, the CLI."""
