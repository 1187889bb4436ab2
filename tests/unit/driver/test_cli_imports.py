"""The command line loads torch and transformers only for the commands that compute with them."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm")


def modules_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{name.split('.')[0] for name in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(done.stdout.split())


def test_help_and_the_parser_do_not_import_torch():
    code = (
        "from agentgym_rl.driver.cli import build_parser, main\n"
        "build_parser().parse_args(['train', 'configs/quickstart.yaml'])\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert not modules_after(code) & set(HEAVY)
