"""The budget's rules on their own: sizes, what fits, what is evicted. No onnxruntime, no disk."""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass

import pytest

import corral._host.budget as budget
from corral import HostOptions, InvalidOption
from corral._base import parse_bytes
from corral._host.budget import (
    FILE_BYTES_FACTOR,
    SESSION_OVERHEAD_BYTES,
    Limits,
    Usage,
    choose_victims,
    estimate_model_bytes,
    fits,
)


@dataclass
class Version:
    size_bytes: int
    pinned: bool = False
    busy: bool = False


def test_the_module_imports_neither_onnxruntime_nor_the_filesystem():
    tree = ast.parse(inspect.getsource(budget))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
        if alias.name
    }
    # fractions: sizes such as "1.5GiB" are computed exactly, not through floats.
    allowed = {"__future__", "re", "collections", "dataclasses", "fractions", "typing", "corral"}
    assert imported <= allowed


def test_estimate_is_overhead_plus_a_multiple_of_the_file_per_replica():
    assert estimate_model_bytes(0) == SESSION_OVERHEAD_BYTES
    assert estimate_model_bytes(1000, replicas=3) == 3 * (
        SESSION_OVERHEAD_BYTES + FILE_BYTES_FACTOR * 1000
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (1, 1),
        ("1048576", 1048576),
        ("2KB", 2000),
        ("2 kib", 2048),
        ("1.5GiB", 3 * 2**29),
        ("3TB", 3 * 10**12),
        ("7B", 7),
        # Kubernetes' binary suffixes.
        ("2Ki", 2 * 2**10),
        ("2Mi", 2 * 2**20),
        ("2Gi", 2 * 2**30),
        ("2Ti", 2 * 2**40),
        ("1.5Gi", 3 * 2**29),
        # Docker's lowercase letters: binary, as `docker run --memory 2g` reads them.
        ("2k", 2 * 2**10),
        ("2m", 2 * 2**20),
        ("2g", 2 * 2**30),
        ("0.5g", 2**29),
        (" 2 g ", 2 * 2**30),
    ],
)
def test_sizes_are_read_in_decimal_and_binary_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "lots", "2 GiBs", "-1", "0", 0, -5, 2.5, True, None, "2t", "2x", "1.5", "0.1k"]
)
def test_a_bad_size_names_the_option(bad):
    with pytest.raises(InvalidOption, match="max_size") as refused:
        parse_bytes(bad, option="max_size")
    assert refused.value.option == "max_size"


@pytest.mark.parametrize(
    ("text", "decimal", "binary"),
    [
        ("2K", "2KB", "2KiB (or 2Ki)"),
        ("2M", "2MB", "2MiB (or 2Mi)"),
        ("2G", "2GB", "2GiB (or 2Gi)"),
        ("1.5T", "1.5TB", "1.5TiB (or 1.5Ti)"),
    ],
)
def test_a_single_capital_is_refused_as_ambiguous_with_both_spellings(text, decimal, binary):
    # Kubernetes reads 2G as 2 x 10^9 bytes and Docker as 2 GiB: neither reading is guessed.
    with pytest.raises(InvalidOption, match="is ambiguous") as refused:
        parse_bytes(text, option="--memory-budget")

    message = str(refused.value)
    assert message.startswith(f"--memory-budget {text!r} is ambiguous")
    assert f"write {decimal} for 10^" in message
    assert f"or {binary} for 2^" in message
    # Each suggestion is itself a size, of the amount named in the message.
    assert parse_bytes(decimal) < parse_bytes(binary.split()[0])


def test_a_fraction_is_exact_and_must_come_out_whole():
    assert parse_bytes("0.001KB") == 1
    assert parse_bytes("1.25KiB") == 1280
    with pytest.raises(InvalidOption, match="not a whole number of bytes"):
        parse_bytes("0.0001KB")


def test_fits_counts_bytes_reserved_and_versions_loading():
    limits = Limits(budget=100, max_loaded=3)
    assert fits(limits, Usage(bytes_used=60, bytes_reserved=0, loaded=1), 40)
    assert not fits(limits, Usage(bytes_used=60, bytes_reserved=1, loaded=1), 40)
    assert not fits(limits, Usage(loaded=2, loads_reserved=1), 1)
    assert fits(limits, Usage(loaded=2, loads_reserved=1), 1, freed=1)
    assert fits(Limits(), Usage(bytes_used=10**15, loaded=10**6), 10**15)


def test_nothing_is_evicted_when_it_fits_and_the_order_is_not_even_read():
    def never_read():
        raise AssertionError("sorted the loaded versions although nothing needed to go")
        yield  # pragma: no cover

    assert choose_victims(Limits(budget=100), Usage(bytes_used=10), 50, never_read()) == ([], False)


def test_least_recently_used_idle_versions_go_first_and_only_as_many_as_needed():
    by_last_use = [("a", Version(30)), ("b", Version(30)), ("c", Version(30))]
    usage = Usage(bytes_used=90, loaded=3)
    assert choose_victims(Limits(budget=100), usage, 20, by_last_use) == (["a"], False)
    assert choose_victims(Limits(budget=100), usage, 50, by_last_use) == (["a", "b"], False)
    assert choose_victims(Limits(max_loaded=3), usage, 1, by_last_use) == (["a"], False)


def test_busy_and_pinned_versions_stay_and_busy_ones_are_worth_waiting_for():
    limits = Limits(budget=100)
    usage = Usage(bytes_used=90, loaded=3)
    busy = [("a", Version(30, busy=True)), ("b", Version(30, pinned=True))]
    # Only "c" may go; it alone is not enough, but "a" will be once its requests end.
    chosen = choose_victims(limits, usage, 50, [*busy, ("c", Version(30))])
    assert chosen == (None, True)
    assert choose_victims(limits, usage, 20, [*busy, ("c", Version(30))]) == (["c"], False)


def test_what_pinned_versions_hold_is_never_worth_waiting_for():
    usage = Usage(bytes_used=90, loaded=2)
    pinned = [("a", Version(60, pinned=True)), ("b", Version(30, busy=True))]
    assert choose_victims(Limits(budget=100), usage, 50, pinned) == (None, False)
    assert choose_victims(Limits(max_loaded=1), Usage(loaded=1), 1, pinned[:1]) == (None, False)


def test_host_options_check_every_field_and_name_it():
    assert HostOptions(memory_budget="1KiB").budget_bytes == 1024
    assert HostOptions().budget_bytes is None
    cases = {
        "memory_budget": "2 parsecs",
        "max_loaded_models": 0,
        "load_concurrency": -1,
        "poll_interval_s": 0,
        "failure_backoff_s": (5.0, 1.0),
        "batching": "yes",
        "max_queue_per_model": 1.5,
    }
    for option, value in cases.items():
        with pytest.raises(InvalidOption, match=option):
            HostOptions(**{option: value})
    with pytest.raises(ValueError, match="max_loaded_models"):  # also a ValueError
        HostOptions(max_loaded_models=True)
