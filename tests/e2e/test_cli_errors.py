"""Every error path of the command line: one line on stderr naming the problem, exit status 2, no traceback; a
damaged checkpoint is named before anything loads it, and ``--from`` goes on from an earlier one."""

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agentgym_rl.actors.checkpoints import MANIFEST, checkpoint_damage
from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.driver.cli import main
from tests.e2e.helpers import run_cli
from tests.integration.broken_env import MESSAGE

DEEP = "[" * 10_000 + "]" * 10_000


def model_without_chat_template(root: Path) -> Path:
    """tiny-random with its chat template removed: turns cannot be rendered token-exactly."""
    target = root / "no-template"
    shutil.copytree(model_dir("tiny-random"), target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


CASES = {
    "misspelt config key": (["train", "--set", "trainer.iteratons=2"], "trainer.iteratons: unknown key"),
    "resume of no run": (["train", "--resume", "{tmp}/nowhere"], "no config.yaml there"),
    "time limit not positive": (["train", "--time-limit", "0"], "--time-limit 0"),
    "bad chat template": (
        ["train", "--set", "model.name={template}", "--set", "model.adapter=null", "--set", "run.dir={tmp}"],
        "chat template",
    ),
    "adapter of another base": (["train", "--set", "model.name=tiny-random"], "set model.adapter=null"),
    "unknown env": (["eval", "--model", "tiny-random", "--env", "nonesuch"], "nonesuch"),
    "eval options": (["eval", "--model", "tiny-random", "--env", "babyai", "--samples", "0"], "samples"),
    "missing report": (["compare", "{tmp}/a.json", "{tmp}/b.json"], "a.json"),
    "missing run to plot": (["plot", "{tmp}/none", "--output", "{tmp}/p.png"], "none"),
    "missing run to export": (["data", "export", "{tmp}/none"], "none"),
    "missing run to view": (["view", "{tmp}/none"], "none"),
    "env without what to show": (["envs", "babyai"], "--instruction or --tasks"),
    "unknown env to show": (["envs", "nonesuch", "--instruction"], "nonesuch"),
    "tool prompt of a text-only env": (["envs", "target-word", "--instruction", "--action-format", "tools"], "text"),
    "env options not an object": (["envs", "babyai", "--tasks", "test", "--options", "[1]"], "JSON object"),
    "unknown env option": (["envs", "babyai", "--tasks", "test", "--options", '{{"colour": 1}}'], "colour"),
    "unknown split": (["envs", "babyai", "--tasks", "dev"], "'dev'"),
    "serve setting": (["serve", "--model", "tiny-random", "--set", "serve.max_batch_sise=4"], "max_batch_sise"),
    # config files that cannot be read as YAML (issue 49)
    "binary config": (["train", "{tmp}/binary.yaml"], "binary.yaml: not a text file"),
    "unreadable config": (["plan", "{unreadable}"], "cannot be read"),
    "config nested 10,000 deep": (["train", "{tmp}/deep.yaml"], "deep.yaml: nested too deeply"),
    "override nested 10,000 deep": (["train", "--set", f"env.options.levels={DEEP}"], "nested too deeply"),
    # booleans where numbers belong: refused by every config section, naming the key
    "iterations true": (["train", "--set", "trainer.iterations=true"], "trainer.iterations: takes a number"),
    "sampler count true": (["train", "--set", "sampler.count=true"], "sampler.count: takes a number"),
    "serve port true in train": (["train", "--set", "serve.port=true"], "serve.port: takes a number"),
    "serve port true": (["serve", "--model", "tiny-random", "--set", "serve.port=true"], "serve.port: takes a number"),
    "horizon true": (["plan", "--set", "curriculum.horizons=[true, 3]"], "curriculum.horizons: takes a number"),
    "hyperparameter true": (["train", "--set", "algorithm.clip_eps=true"], "algorithm.clip_eps"),
    # ports: 1..65535 on every command
    "env-server port too high": (["env-server", "babyai", "--port", "99999"], "--port: 99999 is not a port"),
    "env-server port 0": (["env-server", "babyai", "--port", "0"], "--port: 0 is not a port"),
    "serve port too high": (["serve", "--model", "tiny-random", "--port", "65536"], "--port: 65536 is not a port"),
    "view port not a number": (["view", "{tmp}", "--port", "http"], "--port: 'http' is not a port number"),
    "serve.port key out of range": (["train", "--set", "serve.port=70000"], "serve.port"),
    # the env server's own settings
    "env-server option unknown": (["env-server", "babyai", "--options", '{{"colour": 1}}'], "colour: unknown key"),
    "env-server max envs 0": (["env-server", "babyai", "--max-envs", "0"], "max_envs"),
    "env-server unknown env": (["env-server", "nonesuch"], "unknown env 'nonesuch'"),
    # what argparse refuses takes the same path
    "unknown option": (["train", "--iterations", "2"], "unrecognized arguments: --iterations"),
    "unknown command": (["trian"], "invalid choice: 'trian'"),
    "--from without --resume": (["train", "--from", "iter_1"], "--resume RUN_DIR --from iter_N"),
    "--from of no run": (["train", "--resume", "{tmp}/nowhere", "--from", "iter_1"], "holds no checkpoints/"),
    # the oracle asked for where the env's oracle is off: refused before any actor starts, naming the fix
    "oracle turned off": (["train", "--set", "sampler.policy=oracle"], "set env.options.oracle=true"),
    "oracle turned off in eval": (
        ["eval", "--model", "tiny-random", "--env", "babyai", "--set", "sampler.policy=oracle"]
        + ["--set", "env.options.oracle=false"],
        "set env.options.oracle=true",
    ),
}


def unreadable_file(root: Path) -> Path:
    """A file that exists but cannot be read: without read permission, or (as root, who reads anything) one
    whose read fails."""
    if os.geteuid() == 0:
        return Path("/proc/self/mem")
    path = root / "unreadable.yaml"
    path.write_text("trainer: {}\n")
    path.chmod(0)
    return path


def is_log_record(line: str) -> bool:
    """A structlog line (JSON when stderr is not a terminal), e.g. the run directory logged before a later check."""
    try:
        return "event" in json.loads(line)
    except (json.JSONDecodeError, TypeError):
        return False


def one_error_line(err: str, named: str) -> None:
    """Besides log records, ``err`` is one line, the CLI's error, naming ``named``."""
    lines = [line for line in err.splitlines() if line.strip() and not is_log_record(line)]
    assert len(lines) == 1, err
    assert lines[0].startswith("agentgym-rl: error:"), err
    assert named in lines[0], err


@pytest.mark.parametrize("case", list(CASES))
def test_an_error_is_one_line_and_exit_2(case: str, tmp_path: Path, capsys):
    argv, named = CASES[case]
    template = model_without_chat_template(tmp_path) if case == "bad chat template" else None
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)) * 16)
    (tmp_path / "deep.yaml").write_text(f"env:\n  options:\n    levels: {DEEP}\n")
    argv = [arg.format(tmp=tmp_path, template=template, unreadable=unreadable_file(tmp_path)) for arg in argv]
    assert main(argv) == 2
    one_error_line(capsys.readouterr().err, named)


def test_envs_prints_an_envs_instruction_and_task_ids(capsys):
    """What an agent written outside this project needs: the system prompt the env's episodes open with, and
    the ids of a split restricted by the env's options."""
    from agentgym_rl.envs import make

    assert main(["envs", "babyai", "--instruction"]) == 0
    assert capsys.readouterr().out.strip() == make("babyai").instruction.strip()
    assert main(["envs", "babyai", "--instruction", "--action-format", "tools"]) == 0
    tool_prompt = capsys.readouterr().out.strip()
    assert tool_prompt == make("babyai").tool_instruction.strip() and "go_to" in tool_prompt
    options = '{"levels": ["GoToRedBall", "GoToObjS6"], "test_seeds": 2}'
    assert main(["envs", "babyai", "--tasks", "test", "--options", options]) == 0
    # level i of BabyAI's 40 with seed s is task 40 s + i; GoToRedBall is level 1, GoToObjS6 level 3
    assert capsys.readouterr().out.split() == ["1", "3", "41", "43"]


# One real run per module: LoRA on tiny-random (so its policy is an adapter), 2 iterations, a checkpoint after
# each; float32 so that a resumed iteration can be compared with the original exactly.
TINY_RUN = [
    "model.name=tiny-random",
    "model.adapter=null",
    "sampler.dtype=float32",
    "learner.precision=float32",
    "algorithm.group_size=2",
    "algorithm.skip_uniform_groups=false",  # tiny-random never succeeds: update on uniform groups anyway
    "algorithm.entropy_coef=0.01",
    "sampler.sampling.max_new_tokens=8",
    "curriculum.horizons=[2]",
    "trainer.tasks_per_iteration=2",
    "trainer.iterations=2",
    "trainer.checkpoint_every=1",
    "logging.progress=false",
]
LATEST, EARLIER = "checkpoints/iter_000002", "checkpoints/iter_000001"
ADAPTER = "policy/adapter_model.safetensors"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    settings = [*TINY_RUN, f"run.dir={root}", "run.name=run"]
    done = run_cli("train", "quickstart.yaml", *(item for s in settings for item in ("--set", s)), cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    run = root / "run"
    assert checkpoint_damage(run / LATEST) is None and (run / LATEST / MANIFEST).is_file()
    return run


def truncate(part: str, keep: float = 0.5) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        data = (run / part).read_bytes()
        (run / part).write_bytes(data[: int(len(data) * keep)])

    return damage


def without_manifests(then: Callable[[Path], None]) -> Callable[[Path], None]:
    """A run written before checkpoints had manifests, then damaged."""

    def damage(run: Path) -> None:
        for manifest in run.glob(f"checkpoints/*/{MANIFEST}"):
            manifest.unlink()
        then(run)

    return damage


# damage, extra arguments, what the one line names
CHECKPOINT_CASES: dict[str, tuple[Callable[[Path], None], list[str], str]] = {
    "learner.pt emptied": (truncate(f"{LATEST}/learner.pt", 0), [], "learner.pt has 0 bytes"),
    "learner.pt truncated": (truncate(f"{LATEST}/learner.pt"), [], "learner.pt has"),
    "adapter truncated": (truncate(f"{LATEST}/{ADAPTER}"), [], f"{ADAPTER} has"),
    "adapter emptied": (truncate(f"{LATEST}/{ADAPTER}", 0), [], f"{ADAPTER} has 0 bytes"),
    "trainer.json truncated": (truncate(f"{LATEST}/trainer.json"), [], "trainer.json has"),
    "trainer.json emptied": (truncate(f"{LATEST}/trainer.json", 0), [], "trainer.json has 0 bytes"),
    "policy folder missing": (lambda run: shutil.rmtree(run / LATEST / "policy"), [], "the folder policy/ is missing"),
    "manifest truncated": (truncate(f"{LATEST}/{MANIFEST}"), [], "manifest.json is not readable"),
    "config.yaml binary": (
        lambda run: (run / "config.yaml").write_bytes(bytes(range(256))),
        [],
        "config.yaml: not a text file",
    ),
    "no manifest, learner.pt truncated": (
        without_manifests(truncate(f"{LATEST}/learner.pt")),
        [],
        "learner.pt is not a whole torch archive",
    ),
    "no manifest, adapter truncated": (without_manifests(truncate(f"{LATEST}/{ADAPTER}")), [], f"{ADAPTER} has"),
    "no manifest, trainer.json emptied": (
        without_manifests(truncate(f"{LATEST}/trainer.json", 0)),
        [],
        "trainer.json is not readable JSON",
    ),
    "--from a damaged checkpoint": (
        truncate(f"{EARLIER}/learner.pt"),
        ["--from", "iter_000001"],
        "iter_000001 is damaged: learner.pt has",
    ),
    "--from no such checkpoint": (lambda run: None, ["--from", "iter_7"], "--from iter_7: not a complete checkpoint"),
}


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.slow  # the module's one real run; each case exits before the config is rewritten or Ray starts
@pytest.mark.ci
@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_damaged_checkpoint_is_named_in_one_line(case: str, tiny_run: Path, tmp_path: Path, capsys):
    damage, extra, named = CHECKPOINT_CASES[case]
    run = shutil.copytree(tiny_run, tmp_path / "run")
    damage(run)
    before = snapshot(run)
    assert main(["train", "--resume", str(run), *extra]) == 2
    one_error_line(capsys.readouterr().err, named)
    assert snapshot(run) == before  # nothing written, moved or set aside


@pytest.mark.slow
@pytest.mark.ci
def test_a_damaged_latest_checkpoint_is_named_and_the_run_goes_on_from_the_one_before(
    tiny_run: Path, tmp_path: Path, capsys
):
    run = shutil.copytree(tiny_run, tmp_path / "run")
    truncate(f"{LATEST}/learner.pt")(run)
    assert main(["train", "--resume", str(run)]) == 2
    one_error_line(capsys.readouterr().err, f"resume from the one before with --resume {run} --from iter_000001")

    # iter_000001 as written before checkpoints had manifests: checked for what can be checked, and resumed
    (run / EARLIER / MANIFEST).unlink()
    resumed = run_cli("train", "--resume", str(run), "--from", "iter_000001", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # iteration 1 was played and trained again from iter_000001, as the original run did
    original = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    again = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in again] == [0, 1]
    assert again[0] == original[0]
    for key, value in original[1].items():
        if not key.startswith("time/"):
            assert again[1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert checkpoint_damage(run / LATEST) is None
    superseded = run / "checkpoints" / "superseded" / "iter_000002"
    assert "learner.pt has" in checkpoint_damage(superseded)  # the damaged one, kept aside


# commands that read a checkpoint's policy: argv after the damage, with {run} the damaged copy
POLICY_READERS = {
    "eval of a run": ["eval", "--checkpoint", "{run}", "--env", "babyai", "--episodes", "1"],
    "serve of a checkpoint": ["serve", "--checkpoint", "{run}/" + LATEST],
    "export of a checkpoint": ["export", "--checkpoint", "{run}/" + LATEST, "--output", "{run}/merged"],
}


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("command", list(POLICY_READERS))
def test_a_damaged_policy_is_named_by_what_reads_it(command: str, tiny_run: Path, tmp_path: Path, capsys):
    run = shutil.copytree(tiny_run, tmp_path / "run")
    truncate(f"{LATEST}/{ADAPTER}")(run)
    assert main([arg.format(run=run) for arg in POLICY_READERS[command]]) == 2
    one_error_line(capsys.readouterr().err, f"iter_000002 is damaged: {ADAPTER} has")


def test_an_env_error_that_ends_an_eval_reaches_the_user_as_one_line(tmp_path: Path, capsys):
    # The env raises inside a sampler's episode; the user reads that error, not Ray's traceback of the sampler.
    argv = ["eval", "--model", "tiny-random", "--env", "tests.integration.broken_env:BrokenEnv", "--episodes", "1"]
    argv += [
        "--output",
        str(tmp_path / "report.json"),
        "--set",
        "sampler.count=1",
        "--set",
        "sampler.envs_per_sampler=1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    one_error_line(err, f"failed: EnvError: {MESSAGE} (task 0)")
    assert "ray::" not in err and "Traceback" not in err
