"""Every shell command that README.md and the results pages (docs/results/*.md) show, checked against two lists:
``RUN``, the commands that take under a minute, which run here as shown; ``SKIP``, the others, each with why. A
command in neither list fails the test until it is put in one, so the docs cannot drift from what is run.

Commands are read from the pages' ``bash``/``sh``/``shell``/``console`` code blocks: a line ending in ``\\``
continues on the next, ``#`` starts a comment. ``agentgym-rl`` commands run through the console script's ``main``
in this process (the same argument parsing, without a Python start-up per command), in a copy of docs/results
so that what they write lands in the copy, never in the repository.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest

from agentgym_rl.driver.cli import main

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "results").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)
# A command of the form `... <row>/eval.json` stands for each BabyAI results row but the SFT one it is compared with.
ROWS = sorted(
    p.parent.name for p in (REPO / "docs" / "results" / "babyai").glob("*/eval.json") if p.parent.name != "sft"
)

# Command -> a line its output must hold.
RUN = {
    "agentgym-rl compare docs/results/babyai/sft/eval.json docs/results/gateway/eval.json": "success B - A",
    "agentgym-rl compare docs/results/babyai/sft/eval.json docs/results/babyai/<row>/eval.json": "success B - A",
    'agentgym-rl compare SFT=docs/results/babyai/sft/eval.json "GRPO stepwise=docs/results/babyai/grpo_stepwise/'
    'eval.json" "GRPO fixed 4=docs/results/babyai/grpo_fixed_short/eval.json" "GRPO fixed 10=docs/results/babyai/'
    'grpo_fixed_long/eval.json" "GRPO gateway=docs/results/gateway/eval.json" "GiGPO stepwise=docs/results/babyai/'
    'gigpo_stepwise/eval.json" base=docs/results/babyai/base/eval.json': "| GRPO gateway |",
    'agentgym-rl compare "GRPO stepwise=docs/results/babyai/grpo_stepwise/eval.json" "GRPO fixed 4=docs/results/'
    'babyai/grpo_fixed_short/eval.json" "GRPO fixed 10=docs/results/babyai/grpo_fixed_long/eval.json"': "| GRPO fixed 10 |",
    "agentgym-rl compare docs/results/babyai/sft/eval.json docs/results/babyai/grpo_stepwise/eval.json": "success B - A",
    "agentgym-rl compare docs/results/babyai/sft/eval.json docs/results/babyai/grpo_fixed_short/eval.json": (
        "success B - A"
    ),
    "agentgym-rl compare docs/results/babyai/grpo_fixed_short/eval.json docs/results/babyai/grpo_stepwise/eval.json": (
        "success B - A"
    ),
    "agentgym-rl compare docs/results/babyai/sft/eval.json docs/results/babyai/grpo_fixed_long/eval.json": (
        "success B - A"
    ),
    "agentgym-rl compare docs/results/babyai_tools/sft/eval.json docs/results/babyai_tools/grpo_fixed_short/eval.json": (
        "success B - A"
    ),
    "agentgym-rl compare docs/results/babyai_tools/sft/eval.json docs/results/babyai_tools/gateway/eval.json": (
        "success B - A"
    ),
    'agentgym-rl compare SFT=docs/results/textcraft/sft/eval.json "GRPO fixed 15=docs/results/textcraft/grpo_fixed/'
    'eval.json" base=docs/results/textcraft/base/eval.json': "| GRPO fixed 15 |",
    'agentgym-rl compare SFT=docs/results/search/sft/eval.json "GRPO fixed 10=docs/results/search/grpo_fixed_long/'
    'eval.json" "GiGPO stepwise=docs/results/search/gigpo_stepwise/eval.json" "GRPO stepwise=docs/results/search/'
    'grpo_stepwise/eval.json" "GRPO fixed 4=docs/results/search/grpo_fixed_short/eval.json" base=docs/results/search/'
    "base/eval.json": "| GiGPO stepwise |",
    "agentgym-rl compare GRPO=docs/results/search/grpo_stepwise/eval.json GiGPO=docs/results/search/gigpo_stepwise/"
    "eval.json": "success B - A",
    "agentgym-rl compare docs/results/search/sft/eval.json docs/results/search/grpo_fixed_long/eval.json": (
        "success B - A"
    ),
    'agentgym-rl compare "GRPO stepwise=docs/results/search/grpo_stepwise/eval.json" "GRPO fixed 4=docs/results/'
    'search/grpo_fixed_short/eval.json" "GRPO fixed 10=docs/results/search/grpo_fixed_long/eval.json"': (
        "| GRPO fixed 10 |"
    ),
    'agentgym-rl plot "GRPO stepwise=docs/results/search/grpo_stepwise" "GRPO fixed 4=docs/results/search/'
    'grpo_fixed_short" "GRPO fixed 10=docs/results/search/grpo_fixed_long" "GiGPO stepwise=docs/results/search/'
    'gigpo_stepwise" --smooth 4 --title "Deep Search, SmolLM2-135M + LoRA from SFT: training success (trailing '
    'mean of 4)" --output docs/results/search/curves.png': "docs/results/search/curves.png",
    'agentgym-rl plot "GRPO stepwise=docs/results/babyai/grpo_stepwise" "GRPO fixed 4=docs/results/babyai/'
    'grpo_fixed_short" "GRPO fixed 10=docs/results/babyai/grpo_fixed_long" "GiGPO stepwise=docs/results/babyai/'
    'gigpo_stepwise" --smooth 4 --title "BabyAI, SmolLM2-135M + LoRA from SFT: training success (trailing mean of '
    '4)" --output docs/results/babyai/curves.png': "docs/results/babyai/curves.png",
}

TRAINING = "a training run: minutes on the quickstart, hours for a results row"
EVALUATION = "an evaluation of 200 held-out tasks: tens of minutes"
AFTER_RUNS = "reads $R, the run folder the training commands above it write"
SKIP = {
    "./install.sh && .venv/bin/agentgym-rl train": "the install (minutes) and the quickstart's training run",
    './install.sh --dev && .venv/bin/ruff check . && .venv/bin/mkdocs build --strict && .venv/bin/python -m pytest -m "not '
    'slow or ci or shard" -n 3 --dist loadfile': "the CI command (.ci/run), which runs this test among the others",
    ".venv/bin/agentgym-rl train configs/quickstart.yaml --set trainer.iterations=8 --set curriculum.horizons=[3,6]": (
        TRAINING
    ),
    "docs/results/gateway/run.sh": "the gateway results row: an env server, a training run and an agent, hours",
    "docs/results/run_stage.sh babyai gateway runs": EVALUATION,
    "docs/results/run_stage.sh babyai sft": "a results row: its training run and evaluation, hours",
    "docs/results/run_stage.sh babyai_tools sft": "a results row: its training run and evaluation, hours",
    "docs/results/gateway/run.sh babyai_tools": "the Agents SDK gateway row: an env server, a training run and an agent",
    "docs/results/run_stage.sh babyai_tools gateway runs": EVALUATION,
    "docs/results/run_stage.sh textcraft base": "a results row: the base model on 200 held-out goals, 21 minutes",
    "STAGE_SECONDS=5400 docs/results/run_stage.sh textcraft grpo_fixed": "a results row's training, 90 minutes a part",
    "docs/results/run_stage.sh search base": EVALUATION,
    "STAGE_SECONDS=6000 docs/results/run_stage.sh search grpo_stepwise": "a results row's training, 100 minutes a part",
    "STAGE_SECONDS=6000 docs/results/run_stage.sh babyai grpo_stepwise": "a results row's training, 100 minutes a part",
    "python docs/results/restore_adapter.py babyai/grpo_fixed_long": (
        "tests/unit/docs/test_restore_adapter.py runs it on a clone that has the git history it reads"
    ),
    "agentgym-rl eval --checkpoint docs/results/babyai/sft/adapter --env babyai --split test --max-turns 10 --config "
    "configs/babyai/grpo_stepwise.yaml --set sampler.envs_per_sampler=16 --set sampler.max_batch_size=16 --set "
    "sampler.start_timeout_s=900 --output docs/results/babyai/sft/eval.json": EVALUATION,
    "agentgym-rl train configs/quickstart.yaml --set run.dir=$R --set run.name=stepwise --set warm_start.iterations=5 "
    "--set trainer.iterations=15 --set trainer.checkpoint_every=15 --set curriculum.advance_every=5 --set "
    "learner.lr=1e-5": TRAINING,
    "agentgym-rl train configs/quickstart.yaml --set run.dir=$R --set run.name=fixed$H --set warm_start.iterations=0 "
    "--set model.name=$R/stepwise/warm_start/checkpoints/iter_000005/policy --set curriculum.schedule=fixed --set "
    "curriculum.horizon=$H --set trainer.iterations=15 --set trainer.checkpoint_every=15 --set learner.lr=1e-5": TRAINING,
    "agentgym-rl eval --checkpoint $R/stepwise --env babyai --split test --max-turns 10 --set "
    "'env.options.levels=[GoToRedBallGrey,GoToRedBall,GoToRedBallNoDists,GoToObjS6]' --set env.options.test_seeds=50 "
    "--set sampler.envs_per_sampler=16 --set sampler.max_batch_size=16 --set sampler.start_timeout_s=900": EVALUATION,
    "agentgym-rl plot stepwise=$R/stepwise fixed3=$R/fixed3 fixed10=$R/fixed10 --output docs/babyai_smollm2_curves.png": (
        AFTER_RUNS
    ),
    "agentgym-rl train configs/quickstart.yaml --set run.dir=$R --set run.name=stepwise --set warm_start.iterations=24 "
    "--set trainer.tasks_per_iteration=6 --set learner.lr=2e-5 --set 'curriculum.horizons=[4,7,10]' --set "
    "curriculum.advance_every=8 --set trainer.dynamic_sampling.enabled=true --set "
    "trainer.dynamic_sampling.max_extra_tasks=6 --set sampler.envs_per_sampler=12 --set trainer.iterations=24 --set "
    "trainer.checkpoint_every=1": TRAINING,
    "agentgym-rl train <the same> --set run.name=fixed$H --set warm_start.iterations=0 --set "
    "model.name=$R/stepwise/warm_start/checkpoints/iter_000024/policy --set curriculum.schedule=fixed --set "
    "curriculum.horizon=$H": TRAINING,
    "agentgym-rl compare $R/eval/sft.json $R/eval/stepwise.json": AFTER_RUNS,
    "agentgym-rl train configs/quickstart.yaml --set algorithm.name=gspo --set algorithm.rollout_correction=tis --set "
    "trainer.dynamic_sampling.enabled=true --set warm_start.iterations=1 --set trainer.iterations=2 --set "
    "run.name=gspo": TRAINING,
    "agentgym-rl train configs/quickstart.yaml --set algorithm.name=gigpo --set trainer.dynamic_sampling.enabled=true "
    "--set warm_start.iterations=1 --set trainer.iterations=2 --set run.name=gigpo": TRAINING,
    "agentgym-rl train configs/quickstart.yaml --set algorithm.name=grpo --set algorithm.credit=turn --set "
    "algorithm.turn_gamma=0.9 --set algorithm.clip_high=0.28 --set algorithm.overlong_penalty=0.1 --set "
    "trainer.dynamic_sampling.enabled=true --set warm_start.iterations=1 --set trainer.iterations=2 --set "
    "run.name=grpo_turn": TRAINING,
    ".venv/bin/python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu_check.json": (
        "tests/e2e/test_gpu_check.py runs this check (--device cpu --quick) in the CI tier"
    ),
    "python benchmarks/serve.py --quick": "a serving benchmark: about a minute by its --help, not under one",
    "python benchmarks/scale.py --quick": "tests/e2e/test_scale_benchmark.py runs it (slow tier, in CI)",
    "python benchmarks/scale.py --points 1x8x1 2x32x4 4x128x16 --iterations 3": "the scale sweep: many minutes",
    "python benchmarks/scale.py --points 4x128x16 --envs-per-actor 8": "the sweep's largest point: over 2 minutes",
    "python benchmarks/scale.py --floor": "a CPU measurement (about a minute) whose numbers the page quotes from one run",
    "python benchmarks/serve.py --quick --model smollm2-135m-instruct": "a serving benchmark: minutes",
}


def without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a shell comment (at the start or after a blank, outside quotes)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def shell_commands(markdown: str) -> list[str]:
    """The commands of ``markdown``'s shell code blocks, continuations joined, comments dropped, blanks collapsed."""
    commands = []
    for block in SHELL_BLOCK.findall(markdown):
        pending = ""
        for line in block.splitlines():
            text = without_comment(line).rstrip()
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            command = " ".join((pending + text).split())
            pending = ""
            if command:
                commands.append(command)
    return commands


def documented() -> dict[str, list[str]]:
    """Every command the pages show -> the pages (relative paths) that show it."""
    shown: dict[str, list[str]] = {}
    for page in PAGES:
        for command in shell_commands(page.read_text()):
            shown.setdefault(command, []).append(str(page.relative_to(REPO)))
    return shown


def test_every_documented_command_is_run_or_skipped_with_a_reason():
    shown = documented()
    unlisted = {command: pages for command, pages in shown.items() if command not in RUN and command not in SKIP}
    assert not unlisted, (
        f"commands the docs show that {Path(__file__).name} neither runs nor skips: {unlisted}; add each to RUN (under a "
        "minute) or to SKIP with the reason"
    )
    stale = sorted((set(RUN) | set(SKIP)) - set(shown))
    assert not stale, f"listed commands no page shows any more (remove them from RUN or SKIP): {stale}"
    assert not set(RUN) & set(SKIP)


def test_shell_commands_are_read_as_the_shell_reads_them():
    page = "```bash\nagentgym-rl a \\\n  --set 'x=[1, 2]'   # a comment\n# a line of comment\nrun.sh \"#1\" x#y\n```\n"
    assert shell_commands(page) == ["agentgym-rl a --set 'x=[1, 2]'", 'run.sh "#1" x#y']


@pytest.fixture(scope="module")
def results_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a copy of docs/results: the commands run there."""
    root = tmp_path_factory.mktemp("docs-commands")
    shutil.copytree(REPO / "docs" / "results", root / "docs" / "results")
    return root


def expanded(command: str) -> list[str]:
    return [command.replace("<row>", row) for row in ROWS] if "<row>" in command else [command]


@pytest.mark.parametrize("command", list(RUN), ids=[f"{command.split()[1]}{i}" for i, command in enumerate(RUN)])
def test_a_documented_command_runs_as_shown(command: str, results_copy: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(results_copy)
    concretes = expanded(command)
    assert concretes, f"no results row to put in {command}"
    for concrete in concretes:
        program, *argv = shlex.split(concrete)
        assert program == "agentgym-rl", f"RUN holds only agentgym-rl commands: {concrete}"
        printed, errors = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            code = main(argv)
        assert code == 0, f"{concrete}: exit {code}: {errors.getvalue()}"
        assert RUN[command] in printed.getvalue(), f"{concrete} printed: {printed.getvalue()}"
