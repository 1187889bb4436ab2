"""Writes the site's reference pages from the code, at every `mkdocs build` (mkdocs-gen-files runs it).

* reference/configuration.md: every key of `configs/schema.py` (read from the tree being built, so the
  page describes exactly that schema) and every registered algorithm's own keys, with type, default
  and description. A field without a description stops the build, naming it.
* reference/cli.md: every `agentgym-rl` command from its argument parser.
* reference/policy-api.md and reference/env-server-api.md: the two HTTP surfaces from their OpenAPI
  schemas (the policy endpoint's FastAPI app, one env server app per protocol).

The functions take what they describe as arguments, so the tests call them on schemas of their own.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
import typing
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


class MissingDescription(Exception):
    """A config field has no description: the reference would be incomplete."""


# ---------------------------------------------------------------- configuration


def load_schema(path: Path) -> types.ModuleType:
    """The schema module at ``path``, loaded under a private name (not the installed package's)."""
    name = "_agentgym_rl_docs_schema"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the postponed annotations through it
    spec.loader.exec_module(module)
    return module


def cell(text: str) -> str:
    """``text`` made safe for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "" if isinstance(value, BaseModel) else f"`{json.dumps(value)}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{json.dumps(field.default)}`"


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The config models a field holds: itself, or inside a list / an optional."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in nested_models(a)]


def model_tables(model: type[BaseModel], key: str, level: int = 2) -> list[str]:
    """A heading and table for ``model`` at dotted ``key``, then one for each model nested in it."""
    lines = [f"{'#' * level} {key}", ""]
    if model.__doc__ and level > 2:
        lines += [" ".join(model.__doc__.split()), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    below: list[tuple[type[BaseModel], str]] = []
    for name, field in model.model_fields.items():
        if not (field.description or "").strip():
            raise MissingDescription(
                f"config field {key}.{name} ({model.__name__}.{name}) has no description: give it "
                f"Field(..., description=...) so the configuration reference can describe it"
            )
        nested = nested_models(field.annotation)
        for sub in nested:
            sub_key = f"{key}.{name}" + ("[]" if typing.get_origin(field.annotation) is list else "")
            below.append((sub, sub_key))
        kind = type_name(field.annotation)
        lines.append(f"| `{name}` | {cell(kind)} | {cell(default_text(field))} | {cell(field.description)} |")
    lines.append("")
    for sub, sub_key in below:
        lines += model_tables(sub, sub_key, min(level + 1, 4))
    return lines


def config_reference(schema: types.ModuleType, algorithms: dict[str, type]) -> str:
    """The configuration reference page: every section of ``schema.Config`` and each algorithm's keys.

    Raises:
        MissingDescription: a field of either has no description.
    """
    root = schema.Config
    intro = (
        "A run is configured by one YAML file whose top-level keys are the sections below; "
        "`--set section.key=value` overrides any key from the command line (values are YAML). "
        "Unknown keys and contradictory settings are rejected before anything starts, naming the key. "
        "A relative path a run reads (`model.adapter`, a `model.name` directory, `data.files`) resolves against the "
        "repository root in a config file inside the repository, against the file's own folder in any other, and "
        "against the working directory in `--set`; the paths a run writes (`run.dir`, `logging.wandb.dir`) are taken "
        "from the working directory. "
        "This page is generated from `configs/schema.py` and the registered algorithms at every build of the site."
    )
    lines = ["# Configuration", "", intro, ""]
    for name, field in root.model_fields.items():
        if not (field.description or "").strip():
            raise MissingDescription(f"config section {name} (Config.{name}) has no description")
        (model,) = nested_models(field.annotation)
        suffix = "[]" if typing.get_origin(field.annotation) is list else ""
        tables = model_tables(model, name + suffix)
        lines += [tables[0], "", " ".join(field.description.split()), ""] + tables[2:]
        if name == "algorithm":
            lines += algorithm_tables(algorithms)
    return "\n".join(lines)


def algorithm_tables(algorithms: dict[str, type]) -> list[str]:
    intro = (
        "Besides `name` and `group_size`, the `algorithm` section takes the chosen algorithm's own keys, "
        "checked when the run starts."
    )
    lines = ["### Keys of each algorithm", "", intro, ""]
    for name in sorted(algorithms):
        params = algorithms[name].Config
        lines += [f"#### {name}", "", "| key | type | default | description |", "|---|---|---|---|"]
        for key, field in params.model_fields.items():
            if not (field.description or "").strip():
                raise MissingDescription(f"algorithm {name}: key {key} ({params.__name__}.{key}) has no description")
            lines.append(
                f"| `{key}` | {cell(type_name(field.annotation))} | {cell(default_text(field))} | "
                f"{cell(field.description)} |"
            )
        lines.append("")
    return lines


# ---------------------------------------------------------------- command line


def cli_reference(parser: argparse.ArgumentParser) -> str:
    intro = (
        "Every command is a subcommand of `agentgym-rl`. A command that fails reports one line on stderr "
        "and exits with status 2. This page is generated from the argument parsers."
    )
    lines = ["# Command line", "", intro, ""]
    return "\n".join(lines + command_sections(parser, parser.prog))


def command_sections(parser: argparse.ArgumentParser, prog: str) -> list[str]:
    lines: list[str] = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            command = f"{prog} {name}"
            lines += [f"## {command}", "", cell(helps.get(name) or sub.description or ""), ""]
            lines += ["```", sub.format_usage().replace(sub.prog, command, 1).strip(), "```", ""]
            rows = [
                argument_row(a)
                for a in sub._actions
                if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
            ]
            if rows:
                lines += ["| argument | default | description |", "|---|---|---|", *rows, ""]
            lines += command_sections(sub, command)
    return lines


def argument_row(action: argparse.Action) -> str:
    name = ", ".join(action.option_strings) or (action.metavar or action.dest)
    if action.option_strings and action.nargs != 0:
        name += f" {action.metavar or action.dest.upper()}"
    if isinstance(action.default, bool) or action.default in (None, argparse.SUPPRESS):
        default = ""
    else:
        default = f"`{action.default}`"
    return f"| `{cell(name)}` | {cell(default)} | {cell(action.help or '')} |"


# ---------------------------------------------------------------- HTTP APIs


def openapi_reference(title: str, intro: str, apis: list[tuple[str, dict[str, Any]]]) -> str:
    """One page for OpenAPI schemas: each (heading, schema) gets its routes and its component schemas."""
    lines = [f"# {title}", "", intro, ""]
    for heading, schema in apis:
        prefix = f"{heading} " if len(apis) > 1 else ""
        if len(apis) > 1:
            lines += [f"## {heading}", ""]
        level = "###" if len(apis) > 1 else "##"
        lines += [f"{level} {prefix}routes", ""]
        for path, methods in schema.get("paths", {}).items():
            for method, op in methods.items():
                lines += operation(method, path, op, level + "#", prefix)
        components = schema.get("components", {}).get("schemas", {})
        if components:
            lines += [f"{level} {prefix}schemas", ""]
            for name, component in components.items():
                lines += schema_table(name, component, level + "#", prefix)
    return "\n".join(lines)


def ref_link(ref: str, prefix: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    return f"[{name}](#{anchor(prefix + name)})"


def anchor(heading: str) -> str:
    """The id MkDocs' toc gives a heading made of words, spaces and dashes."""
    return "".join(c for c in heading.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def json_type(schema: dict[str, Any], prefix: str) -> str:
    if "$ref" in schema:
        return ref_link(schema["$ref"], prefix)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(json_type(s, prefix) for s in schema[key])
    if "enum" in schema:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in schema["enum"])
    if "const" in schema:
        return f'"{schema["const"]}"' if isinstance(schema["const"], str) else str(schema["const"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {json_type(schema.get('items', {}), prefix)}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {json_type(schema['additionalProperties'], prefix)}"
    return kind


def operation(method: str, path: str, op: dict[str, Any], level: str, prefix: str) -> list[str]:
    lines = [f"{level} {prefix}{method.upper()} {path}", ""]
    text = op.get("description") or op.get("summary")
    if text:
        lines += [" ".join(text.split()), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            lines.append(
                f"| `{p['name']}` | {p['in']} | {cell(json_type(p.get('schema', {}), prefix))} | "
                f"{'yes' if p.get('required') else 'no'} | {cell(p.get('description', ''))} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body (`{media}`): {json_type(content.get('schema', {}), prefix)}", ""]
    lines += ["| status | description | body |", "|---|---|---|"]
    for status, response in op.get("responses", {}).items():
        bodies = [
            f"`{media}` {json_type(content.get('schema', {}), prefix)}"
            for media, content in response.get("content", {}).items()
        ]
        lines.append(f"| {status} | {cell(response.get('description', ''))} | {cell(', '.join(bodies))} |")
    return lines + [""]


def schema_table(name: str, schema: dict[str, Any], level: str, prefix: str) -> list[str]:
    lines = [f"{level} {prefix}{name}", ""]
    if schema.get("description"):
        lines += [" ".join(schema["description"].split()), ""]
    properties = schema.get("properties")
    if not properties:
        return lines + [f"Type: {cell(json_type(schema, prefix))}", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | description |", "|---|---|---|---|"]
    for field, sub in properties.items():
        lines.append(
            f"| `{field}` | {cell(json_type(sub, prefix))} | {'yes' if field in required else 'no'} | "
            f"{cell(sub.get('description', ''))} |"
        )
    return lines + [""]


def policy_openapi() -> dict[str, Any]:
    """The policy endpoint's schema, from the app one serve replica runs (tiny-random's tokenizer)."""
    from agentgym_rl.configs.schema import ServeConfig
    from agentgym_rl.serve.policy_api import PolicyAPI
    from agentgym_rl.serve.routes import build_api

    async def never() -> bool:
        return False

    api = PolicyAPI(None, model_id="policy", source="tiny-random", limits=ServeConfig(), model_ready=never)
    return build_api(api).openapi()


def env_server_openapis() -> list[tuple[str, dict[str, Any]]]:
    """One schema per protocol, from the env-server app of an env that speaks it; OpenEnv's last."""
    from agentgym_rl.envs.http.models import default_protocol
    from agentgym_rl.envs.http.server import build_app
    from agentgym_rl.envs.openenv.server import build_openenv_app

    apis = []
    for env in ("babyai", "textcraft", "sciworld", "search", "web"):
        apis.append((f"{default_protocol(env)} (env {env})", build_app(env).openapi()))
    apis.append(("openenv (env babyai)", build_openenv_app("babyai").openapi()))
    return apis


def main() -> None:
    import mkdocs_gen_files

    # Importing Ray Serve warns of pydantic deprecations inside Ray; they say nothing about these pages.
    warnings.simplefilter("ignore", DeprecationWarning)

    from agentgym_rl.driver.cli import build_parser
    from agentgym_rl.learner.algorithms import algorithm_names, resolve_algorithm

    root = Path(mkdocs_gen_files.config.config_file_path).parent
    schema = load_schema(root / "configs" / "schema.py")
    pages = {
        "reference/configuration.md": config_reference(
            schema, {name: resolve_algorithm(name) for name in algorithm_names()}
        ),
        "reference/cli.md": cli_reference(build_parser()),
        "reference/policy-api.md": openapi_reference(
            "Policy HTTP API",
            "The routes of `agentgym-rl serve` and of the endpoint a training run serves (`serve.enabled`): "
            "OpenAI-compatible chat completions plus this project's own routes. Generated from the app's "
            "OpenAPI schema (also served at `/openapi.json`).",
            [("policy", policy_openapi())],
        ),
        "reference/env-server-api.md": openapi_reference(
            "Env server HTTP API",
            "The routes of `agentgym-rl env-server ENV`, in the shapes of the AgentGym server that mirrors "
            "each env, so AgentGym's own clients work unmodified, and with `--protocol openenv` OpenEnv's "
            "(its WebSocket session at `/ws` and the per-env models of `/schema` are in the how-to "
            "[Serve an env over OpenEnv](../how-to/openenv-server.md)). Each protocol is listed with an env "
            "that speaks it. Generated from the apps' OpenAPI schemas (also served at `/openapi.json`).",
            env_server_openapis(),
        ),
    }
    for path, text in pages.items():
        with mkdocs_gen_files.open(path, "w") as page:
            page.write(text + "\n")


if __name__ == "<run_path>":  # how mkdocs-gen-files runs a script
    main()
