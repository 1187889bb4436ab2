"""The serve command's shutdown deadline, in a real child process: a block that hangs ends the process with
the given exit code and the stacks of its threads; one that finishes leaves the process running."""

import subprocess
import sys

HANGS = """
import time
from agentgym_rl.actors.cluster import deadline
with deadline(1.0, "the test's shutdown", exit_code=130):
    time.sleep(120)
print("not reached")
"""

FINISHES = """
import time
from agentgym_rl.actors.cluster import deadline
with deadline(1.0, "the test's shutdown", exit_code=130):
    time.sleep(0.1)  # a shutdown that finishes well inside its deadline
time.sleep(2)  # past the deadline: the cancelled timer must not fire
print("still here")
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_a_hung_shutdown_ends_the_process_with_the_exit_code_and_the_stacks():
    done = run(HANGS)
    assert done.returncode == 130
    assert "the test's shutdown did not finish within 1 s; exiting" in done.stderr
    assert 'File "<string>", line 5 in <module>' in done.stderr  # the main thread's stuck frame: the sleep
    assert "not reached" not in done.stdout


def test_a_finished_shutdown_leaves_the_process_alone():
    done = run(FINISHES)
    assert done.returncode == 0 and done.stdout.strip() == "still here" and not done.stderr
