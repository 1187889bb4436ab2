"""An MCP server's tools as an environment (``env.name: mcp``): the env in ``env``, the client session in
``session``. Importing this package imports neither the ``mcp`` SDK nor a server."""
