"""Ray Serve policy endpoint: OpenAI-compatible chat, /v1/act, weight hot-swap while training.

Build it with ``serve.app.build_app(ServeArgs(...))`` or run ``agentgym-rl serve``; the model
deployment is ``serve.deployment``, the HTTP routes ``serve.routes``, the bodies ``serve.bodies``.

The trajectory viewer (`agentgym-rl view RUN_DIR`) is `serve.viewer`, its page `serve/static/`.
"""
