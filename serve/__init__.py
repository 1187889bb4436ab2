"""Ray Serve policy endpoint (OpenAI-compatible chat, /v1/act). Not built yet: see README "Status"."""
