"""``python -m agentgym_rl.envs.http ENV [--host H] [--port P] [--max-envs N] [--options JSON] [--protocol P] [--token T]``.

The same server as ``agentgym-rl env-server``, started without importing the training stack
(torch, transformers), so it is up in well under a second.
"""

import argparse
import sys

from agentgym_rl.configs.loader import ConfigError, one_line
from agentgym_rl.envs.http.cli import add_server_arguments, run_server

parser = argparse.ArgumentParser(prog="python -m agentgym_rl.envs.http", description="AgentGym-compatible env server.")
add_server_arguments(parser)
try:
    sys.exit(run_server(parser.parse_args()))
except ConfigError as exc:
    print(f"env-server: error: {one_line(str(exc))}", file=sys.stderr)
    sys.exit(2)
