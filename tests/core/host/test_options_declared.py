"""Each Host and Runtime option is declared once, and every edge is made from that declaration.

The declaration is the option's field in HostOptions or RuntimeOptions (``corral._base.declare``).
For each one this walks every surface: ``corral serve``'s flag, its ``CORRAL_*`` variable as
ServerSettings reads it, ``corral ray-serve``'s flag and variable, RayServeConfig's field,
and checks that a value given there reaches the Host's or the Runtime's options. A new option
is a new field; a surface that misses it fails here, with no sample to add: the values are
made from the option's type.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import typing
from pathlib import Path
from typing import Any

import pytest

from corral import HostOptions, Runtime, RuntimeOptions
from corral._host.options import HostOptionArgs, edge_options
from corral.cli.commands import command_parser, main
from corral.server.settings import SERVER_DEFAULTS, ServerSettings

OFFERED = [option for option in edge_options() if option.not_offered is None]
KEPT = [option for option in edge_options() if option.not_offered is not None]
HOST_FIELDS = {field.name for field in dataclasses.fields(HostOptions)}


def sample(option: Any) -> tuple[str, Any]:
    """A value other than the default, as the command line and a variable spell it, and as
    the options then hold it."""
    kinds = set(typing.get_args(option.annotation)) or {option.annotation}
    kinds.discard(type(None))
    if kinds == {bool}:
        return str(not option.default).lower(), not option.default
    if {int, str} <= kinds:  # a size: bytes, or text like 2GiB
        return "2GiB", 2 * 2**30
    if kinds == {int}:
        number = 4 if option.default == 3 else 3
        return str(number), number
    if kinds == {float}:
        return "2.5", 2.5
    if kinds == {str}:  # a folder's path
        return "/var/cache/corral", "/var/cache/corral"
    words = [word for word in kinds if isinstance(word, str) and word != option.default]
    if typing.get_origin(option.annotation) is typing.Literal and words:
        return words[0], words[0]
    raise AssertionError(f"no sample for {option.name}: {option.annotation}; add one here")


def reached(options: HostOptions | RuntimeOptions, name: str) -> Any:
    # A size may be held as its text (the server's settings) or as bytes (Ray's flags).
    if name == "memory_budget" and isinstance(options, HostOptions):
        return options.budget_bytes
    return getattr(options, name)


def flags_of(command: str) -> dict[str, argparse.Action]:
    commands = next(
        action
        for action in command_parser(command)._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return {action.dest: action for action in commands.choices[command]._actions}


@pytest.fixture
def no_corral_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in edge_options():
        monkeypatch.delenv(option.variable, raising=False)


# -- the declaration ----------------------------------------------------------------------------


@pytest.mark.parametrize("options", [HostOptions, RuntimeOptions])
def test_every_option_is_declared_with_its_help(options: type):
    declared = {option.name: option for option in edge_options()}
    for field in dataclasses.fields(options):
        if field.init:
            assert field.name in declared, f"{options.__name__}.{field.name}: use option()"
            assert declared[field.name].help, field.name


def test_kept_options_say_why():
    assert {option.name for option in KEPT} == {"failure_backoff_s", "arena"}
    for option in KEPT:
        assert option.not_offered
        assert option.name not in ServerSettings.model_fields
        assert option.name not in flags_of("serve")


def test_the_keyword_copies_for_type_checkers_match_the_declaration():
    # Host(**options) and Runtime(...) are typed by hand: a type checker cannot read the
    # declaration. Each option added there must be added to them.
    hints = typing.get_type_hints(HostOptions)
    host_fields = {f.name: hints[f.name] for f in dataclasses.fields(HostOptions) if f.init}
    assert typing.get_type_hints(HostOptionArgs) == host_fields
    parameters = set(inspect.signature(Runtime).parameters)
    assert parameters == {field.name for field in dataclasses.fields(RuntimeOptions)}


# -- corral serve: its flags, its variables, ServerSettings -------------------------------------


def the_options(settings: Any, name: str) -> HostOptions | RuntimeOptions:
    """The Host's or the Runtime's options ``settings`` (the server's, or Ray's) makes."""
    options: HostOptions | RuntimeOptions = (
        settings.host_options() if name in HOST_FIELDS else settings.runtime_options()
    )
    return options


@pytest.mark.parametrize("option", OFFERED, ids=lambda option: option.name)
def test_serve_makes_a_setting_a_flag_and_a_variable_of_it(
    option: Any,
    tmp_path: Path,
    served: list[ServerSettings],
    monkeypatch: pytest.MonkeyPatch,
):
    # The server's own defaults where it has them (a budget that follows the machine).
    default = SERVER_DEFAULTS.get(option.name, option.default)
    assert ServerSettings.model_fields[option.name].default == default
    flag = flags_of("serve")[option.name]
    assert flag.option_strings[0] == "--" + option.name.replace("_", "-")
    assert option.variable in (flag.help or "")
    assert option.help in (flag.help or "")

    text, expected = sample(option)
    if isinstance(expected, bool):  # a switch: --x or --no-x
        given = flag.option_strings[0 if expected else 1]
        assert main(["serve", str(tmp_path), given]) == 0
    else:
        assert main(["serve", str(tmp_path), f"{flag.option_strings[0]}={text}"]) == 0
    monkeypatch.setenv(option.variable, text)
    assert main(["serve", str(tmp_path)]) == 0

    by_flag, by_variable = served
    assert reached(the_options(by_flag, option.name), option.name) == expected
    assert reached(the_options(by_variable, option.name), option.name) == expected


# -- corral ray-serve: its flags, its variables, RayServeConfig ---------------------------------


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch, no_corral_variables: None) -> list[Any]:
    pytest.importorskip("ray.serve", reason="the ray extra is not installed")
    import corral.ray

    configs: list[Any] = []

    def serve_on_ray(repository: str, config: Any, **options: Any) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(corral.ray, "serve_on_ray", serve_on_ray)
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)  # the command's, not ours
    # The command sets these for a local Ray node; restore them after.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    return configs


@pytest.mark.timeout(30)
@pytest.mark.parametrize("option", OFFERED, ids=lambda option: option.name)
def test_ray_serve_makes_a_config_field_a_flag_and_a_variable_of_it(
    option: Any,
    tmp_path: Path,
    launched: list[Any],
    monkeypatch: pytest.MonkeyPatch,
):
    from corral.ray import RayServeConfig

    fields = {field.name: field for field in dataclasses.fields(RayServeConfig)}
    assert fields[option.name].default == option.default
    flag = flags_of("ray-serve")[option.name]
    assert flag.option_strings == ["--" + option.name.replace("_", "-")]
    assert option.variable in (flag.help or "")

    text, expected = sample(option)
    # The cache options apply only to a repository in object storage, and are refused beside
    # a folder: they are given with a URL (nothing is read from it before Ray starts).
    repository = "s3://fleet/models" if option.name.startswith("cache_") else str(tmp_path)
    assert main(["ray-serve", repository, f"{flag.option_strings[0]}={text}"]) == 0
    monkeypatch.setenv(option.variable, text)
    assert main(["ray-serve", repository]) == 0

    by_flag, by_variable = launched
    assert reached(the_options(by_flag, option.name), option.name) == expected
    assert reached(the_options(by_variable, option.name), option.name) == expected
