"""A checkpoint's manifest (each file's size and sha256, written with the checkpoint) and the check that a resume
runs on a checkpoint before anything loads it, so a damaged part is named instead of failing inside a loader."""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentgym_rl.configs.errors import AgentGymError

MANIFEST = "manifest.json"
# Files hashed at once: hashlib releases the GIL while it hashes, so a checkpoint's shards (learner state, model
# files, DeepSpeed's per-rank files) are read and hashed in parallel.
HASH_THREADS = 8
# The parts a checkpoint written before manifests existed is checked for (the names ``RunDir`` and the learner
# write; ``deepspeed/`` is the backend's own format and is checked through the manifest only).
TRAINER_STATE = "trainer.json"
LEARNER_STATE = "learner.pt"
POLICY_DIR = "policy"


class CheckpointError(AgentGymError):
    """A checkpoint that cannot be resumed from; the message names the damaged part and what to do."""


def file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def sha256s(paths: list[Path]) -> list[str]:
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        return list(pool.map(file_sha256, paths))


def written_files(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` as this process sees it: its path relative to ``folder`` and its bytes (none
    when ``folder`` does not exist)."""
    return {path.relative_to(folder).as_posix(): path.stat().st_size for path in folder.rglob("*") if path.is_file()}


def unseen_files(folder: Path, written: dict[str, int]) -> list[str]:
    """The files of ``written`` (``written_files`` of the same folder in another process, maybe on another node)
    that ``folder`` here lacks or holds with another size, sorted."""
    return sorted(
        name
        for name, size in written.items()
        if not (folder / name).is_file() or (folder / name).stat().st_size != size
    )


def write_manifest(folder: Path) -> Path:
    """Record every file under ``folder`` (path relative to it, bytes, sha256) in ``folder/manifest.json``;
    returns the manifest's path. Called last, on the complete checkpoint, before it is published."""
    paths = [path for path in sorted(folder.rglob("*")) if path.is_file() and path.name != MANIFEST]
    files = {
        path.relative_to(folder).as_posix(): {"bytes": path.stat().st_size, "sha256": digest}
        for path, digest in zip(paths, sha256s(paths), strict=True)
    }
    target = folder / MANIFEST
    target.write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
    return target


def checkpoint_damage(folder: Path) -> str | None:
    """What is wrong with checkpoint ``folder``, or None when it is whole.

    With a manifest, every file it lists must be there with its size and sha256 (sizes first: a truncated file
    is found without hashing the rest). A checkpoint written before manifests existed is checked for what can
    be checked without loading it: ``trainer.json`` parses, ``learner.pt`` is a whole torch archive, ``policy/``
    exists and each of its safetensors files is as long as its header says.
    """
    if (folder / MANIFEST).exists():
        return damage_against_manifest(folder)
    return damage_without_manifest(folder)


def policy_damage_of(folder: Path) -> str | None:
    """What is wrong with the policy of checkpoint ``folder`` (what eval, serve and export read), or None: its
    files' sizes against the manifest (no hashing: a start that loads the policy anyway should not read it
    twice), or without a manifest the checks of ``policy/`` that ``checkpoint_damage`` runs."""
    if not (folder / MANIFEST).exists():
        return policy_damage(folder / POLICY_DIR)
    try:
        files = read_manifest(folder)
    except ValueError as exc:
        return str(exc)
    policy = {name: entry for name, entry in files.items() if name.startswith(f"{POLICY_DIR}/")}
    missing = [name for name in policy if not (folder / name).is_file()]
    if missing:
        return missing_parts(folder, missing)
    return next(size_mismatches(folder, policy), None)


def read_manifest(folder: Path) -> dict[str, dict]:
    """The ``files`` of ``folder``'s manifest.

    Raises:
        ValueError: the manifest is not one ``write_manifest`` wrote (truncated, emptied, not JSON).
    """
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        entries = {str(name): (int(entry["bytes"]), str(entry["sha256"])) for name, entry in files.items()}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise ValueError(f"{MANIFEST} is not readable (truncated or overwritten)") from None
    return {name: {"bytes": size, "sha256": digest} for name, (size, digest) in entries.items()}


def damage_against_manifest(folder: Path) -> str | None:
    try:
        files = read_manifest(folder)
    except ValueError as exc:
        return str(exc)
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        return missing_parts(folder, missing)
    mismatch = next(size_mismatches(folder, files), None)
    if mismatch:
        return mismatch
    digests = sha256s([folder / name for name in files])
    for (name, entry), digest in zip(files.items(), digests, strict=True):
        if digest != entry["sha256"]:
            return f"{name} differs from what was written (its sha256 does not match {MANIFEST})"
    return None


def size_mismatches(folder: Path, files: dict[str, dict]) -> Iterator[str]:
    for name, entry in files.items():
        size = (folder / name).stat().st_size
        if size != entry["bytes"]:
            yield f"{name} has {size} bytes, {entry['bytes']} were written (truncated or overwritten)"


def missing_parts(folder: Path, missing: list[str]) -> str:
    """Name the missing files, or the missing folder when a whole folder is gone."""
    first = missing[0]
    top = first.split("/", 1)[0]
    if "/" in first and not (folder / top).is_dir():
        return f"the folder {top}/ is missing"
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return f"{first} is missing{more}"


def damage_without_manifest(folder: Path) -> str | None:
    return (
        trainer_state_damage(folder / TRAINER_STATE)
        or learner_state_damage(folder / LEARNER_STATE)
        or (policy_damage(folder / POLICY_DIR))
    )


def trainer_state_damage(path: Path) -> str | None:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"{TRAINER_STATE} is not readable JSON (truncated or emptied)"
    if not (isinstance(state, dict) and isinstance(state.get("iterations_done"), int)):
        return f"{TRAINER_STATE} lacks the iterations done (not a trainer state)"
    if not isinstance(state.get("envs"), dict):
        return f"{TRAINER_STATE} lacks the envs' task draw and curriculum (not a trainer state)"
    return None


def learner_state_damage(path: Path) -> str | None:
    if not path.is_file():
        return f"{LEARNER_STATE} is missing"
    # torch.save writes a zip archive; its directory is at the end, so a truncated file does not open.
    if not zipfile.is_zipfile(path):
        return f"{LEARNER_STATE} is not a whole torch archive ({path.stat().st_size} bytes; truncated or emptied)"
    return None


def policy_damage(policy: Path) -> str | None:
    if not policy.is_dir():
        return f"the folder {POLICY_DIR}/ is missing"
    weights = sorted(policy.glob("*.safetensors"))
    if not weights and not any(policy.glob("*.bin")):
        return f"{POLICY_DIR}/ holds no weights (no *.safetensors)"
    for path in weights:
        problem = safetensors_damage(path)
        if problem:
            return f"{POLICY_DIR}/{path.name} {problem}"
    for path in sorted(policy.glob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return f"{POLICY_DIR}/{path.name} is not readable JSON (truncated or emptied)"
    return None


def safetensors_damage(path: Path) -> str | None:
    """Whether a safetensors file is as long as its header says (8 bytes of header length, the JSON header, then
    the tensors' bytes up to the largest end offset)."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"is truncated ({size} bytes)"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            return f"is truncated ({size} bytes; its header alone is {header_len})"
        try:
            header = json.loads(handle.read(header_len))
            end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError):
            return "has an unreadable header (not a safetensors file)"
    expected = 8 + header_len + end
    if size != expected:
        return f"has {size} bytes, its header describes {expected} (truncated or overwritten)"
    return None
