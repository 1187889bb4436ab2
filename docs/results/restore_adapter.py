#!/usr/bin/env python3
"""Bring a stage's LoRA adapter weights back from git history, byte for byte.

    python docs/results/restore_adapter.py EXPERIMENT/STAGE    # e.g. babyai/grpo_fixed_long; or gateway
    python docs/results/restore_adapter.py STAGE               # a stage name only one experiment has
    python docs/results/restore_adapter.py --files docs/results/EXPERIMENT/STAGE/part/checkpoint.sha256

The tracked tree holds one stage adapter's weights, the BabyAI SFT stage's (the quickstart loads it); every other
stage's ``adapter_model.safetensors`` was committed with its results and then removed from the tree, to keep the
tree small. This writes the last committed version of the stage's file back in place, in the repository of the
working directory, after checking it against the SHA-256 that ``docs/results/adapters.sha256`` records. A stage is
named by the folders that hold its ``adapter/`` under docs/results (``babyai/sft``, ``textcraft/grpo_fixed``, the
BabyAI gateway run's ``gateway``). With ``--files``, it restores every file of a ``sha256sum`` listing instead: the
checkpoint of a stage part (``run_stage.sh`` writes the listing beside it; the checkpoint is committed once and then
removed from the tree, as an adapter is). A restored file is ignored by git (``docs/results/.gitignore``). It needs the
repository's history: in a shallow clone, ``git fetch --unshallow`` first. Only the standard library and ``git`` are
used, so any Python 3.11 runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
from pathlib import Path

MANIFEST = "docs/results/adapters.sha256"


def git(root: Path | None, *args: str) -> bytes:
    """``git args`` in ``root`` (the working directory when None); its stdout, or exit with git's message."""
    where = ["-C", str(root)] if root else []
    done = subprocess.run(["git", *where, *args], check=False, capture_output=True)
    if done.returncode:
        raise SystemExit(f"restore_adapter.py: git {' '.join(args)}: {done.stderr.decode().strip()}")
    return done.stdout


def recorded(root: Path) -> dict[str, tuple[str, str]]:
    """Each stage in the manifest -> (its adapter weights' path from the repository root, their SHA-256)."""
    stages = {}
    if not (root / MANIFEST).is_file():  # a repository without committed adapters (``--files`` needs none)
        return stages
    for line in (root / MANIFEST).read_text().splitlines():
        digest, path = line.split(maxsplit=1)
        # docs/results/<experiment>/<stage>/adapter/adapter_model.safetensors, or docs/results/<stage>/adapter/...
        stages[Path(path).parent.parent.relative_to("docs/results").as_posix()] = (path, digest)
    return stages


def resolve(stages: dict[str, tuple[str, str]], name: str) -> str:
    """The recorded stage ``name`` stands for: itself, or the one stage whose last folder is ``name``.

    Raises:
        LookupError: none or several stages (the message lists them).
    """
    if name in stages:
        return name
    matches = [stage for stage in stages if stage.rsplit("/", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    what = f"several stages are called {name!r}: {', '.join(matches)}" if matches else f"no stage {name!r}"
    raise LookupError(f"{what}; the recorded stages: {', '.join(sorted(stages))}")


def restore(root: Path, path: str, digest: str, manifest: str = MANIFEST) -> str:
    """Write the last committed version of ``path`` in place, if its bytes have the SHA-256 ``digest`` (that
    ``manifest`` records).

    Returns:
        The commit the bytes come from.
    Raises:
        SystemExit: no commit in this clone has ``path`` (a shallow clone, say), or its bytes are not the recorded ones.
    """
    # the last commit that added or changed the file holds its last version (a later one only deleted it)
    commit = git(root, "log", "-1", "--format=%H", "--no-renames", "--diff-filter=AM", "--", path).decode().strip()
    if not commit:
        shallow = git(root, "rev-parse", "--is-shallow-repository").decode().strip() == "true"
        hint = "this is a shallow clone: run `git fetch --unshallow` and try again" if shallow else "was it committed?"
        raise SystemExit(f"restore_adapter.py: no commit in this repository's history has {path}; {hint}")
    data = git(root, "cat-file", "blob", f"{commit}:{path}")
    found = hashlib.sha256(data).hexdigest()
    if found != digest:
        raise SystemExit(
            f"restore_adapter.py: {path} at commit {commit[:10]} has SHA-256 {found}, but {manifest} records {digest}; "
            "nothing written (a stage trained again updates the manifest: commit its adapter before removing it)"
        )
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return commit


def restore_listed(root: Path, manifest: str) -> None:
    """Restore every file the ``sha256sum`` listing ``manifest`` names (paths from the repository root): a stage
    part's checkpoint, committed once and then removed from the tree."""
    for line in (root / manifest).read_text().splitlines():
        digest, path = line.split(maxsplit=1)
        commit = restore(root, path, digest, manifest)
        print(f"restored {path} from commit {commit[:10]}")


def main() -> None:
    root = Path(git(None, "rev-parse", "--show-toplevel").decode().strip())
    stages = recorded(root)
    parser = argparse.ArgumentParser(description="Bring a stage's LoRA adapter weights back from git history.")
    parser.add_argument(
        "stage",
        metavar="EXPERIMENT/STAGE",
        nargs="?",
        help=f"the stage, or a stage name only one experiment has: {', '.join(sorted(stages))}",
    )
    parser.add_argument(
        "--files",
        metavar="LISTING",
        help="instead, every file of a sha256sum listing (a stage part's checkpoint.sha256, which run_stage.sh writes)",
    )
    args = parser.parse_args()
    if (args.stage is None) == (args.files is None):
        parser.error("give a stage or --files LISTING")
    if args.files is not None:
        restore_listed(root, Path(args.files).resolve().relative_to(root).as_posix())
        return
    try:
        stage = resolve(stages, args.stage)
    except LookupError as exc:
        parser.error(str(exc))
    path, digest = stages[stage]
    commit = restore(root, path, digest)
    print(f"restored {path} from commit {commit[:10]} (SHA-256 {digest})")


if __name__ == "__main__":
    main()
