"""model.toml: every field, every version_policy spelling, and each kind of mistake."""

from __future__ import annotations

import re

import pytest

from corral._base.errors import ModelConfigError, ModelLoadError
from corral._models.config import ModelConfig, VersionPolicy

SOURCE = "models/fraud/model.toml"


def parse(text: str) -> ModelConfig:
    return ModelConfig.from_toml(text, source=SOURCE)


def parse_error(text: str) -> str:
    with pytest.raises(ModelConfigError) as info:
        parse(text)
    message = str(info.value)
    assert message.startswith(SOURCE + ": "), message
    return message


# -- the fields --------------------------------------------------------------------------------


def test_an_empty_file_gives_the_defaults():
    config = parse("")
    assert config == ModelConfig()
    assert config.max_batch_size is None
    assert config.batch_window_us is None
    assert config.concurrency == "auto"
    assert config.providers is None
    assert config.pinned is False
    assert config.warmup is False
    assert config.version_policy == VersionPolicy("latest", 1)


def test_every_field_is_read():
    config = parse(
        """
        max_batch_size = 32
        batch_window_us = 500
        concurrency = "pool:3"
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        pinned = true
        warmup = true
        version_policy = { latest = 2 }
        response_cache = true
        """
    )
    assert config == ModelConfig(
        max_batch_size=32,
        batch_window_us=500,
        concurrency="pool:3",
        providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        pinned=True,
        warmup=True,
        version_policy=VersionPolicy("latest", 2),
        response_cache=True,
    )
    assert isinstance(config.providers, tuple)
    hash(config)  # frozen all the way down: usable as a key


def test_zero_is_a_valid_batch_size_and_window():
    config = parse("max_batch_size = 0\nbatch_window_us = 0")
    assert config.max_batch_size == 0
    assert config.batch_window_us == 0


@pytest.mark.parametrize(
    ("written", "stored"),
    [("auto", "auto"), ("shared", "shared"), ("exclusive", "exclusive"), (" Pool:2 ", "pool:2")],
)
def test_concurrency_is_stored_in_its_canonical_spelling(written, stored):
    assert parse(f'concurrency = "{written}"').concurrency == stored


def test_the_config_is_frozen():
    config = parse("pinned = true")
    with pytest.raises(AttributeError):
        config.pinned = False  # type: ignore[misc]


# -- version_policy spellings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "policy"),
    [
        ('"latest"', VersionPolicy("latest", 1)),
        ('"all"', VersionPolicy("all")),
        ("{ latest = 2 }", VersionPolicy("latest", 2)),
        ("{ specific = [1, 3] }", VersionPolicy("specific", versions=(1, 3))),
        ("{ specific = [3, 1, 3] }", VersionPolicy("specific", versions=(1, 3))),
        ("{ latest = { num_versions = 2 } }", VersionPolicy("latest", 2)),
        ("{ specific = { versions = [1, 3] } }", VersionPolicy("specific", versions=(1, 3))),
        ("{ all = {} }", VersionPolicy("all")),
    ],
)
def test_version_policy_spellings(written, policy):
    assert parse(f"version_policy = {written}").version_policy == policy


def test_version_policy_as_a_toml_table_section():
    config = parse("[version_policy.specific]\nversions = [2]\n")
    assert config.version_policy == VersionPolicy("specific", versions=(2,))


@pytest.mark.parametrize(
    ("written", "field"),
    [
        ('"newest"', "version_policy"),
        ("3", "version_policy"),
        ("{}", "version_policy"),
        ("{ latest = 1, all = {} }", "version_policy"),
        ("{ oldest = 1 }", "version_policy"),
        ("{ latest = 0 }", "version_policy.latest"),
        ("{ latest = -1 }", "version_policy.latest"),
        ("{ latest = true }", "version_policy.latest"),
        ('{ latest = "2" }', "version_policy.latest"),
        ("{ latest = 1.5 }", "version_policy.latest"),
        ("{ latest = { num_versions = 0 } }", "version_policy.latest.num_versions"),
        ("{ latest = { count = 2 } }", "version_policy.latest"),
        ("{ latest = { num_versions = 2, extra = 1 } }", "version_policy.latest"),
        ("{ specific = [] }", "version_policy.specific"),
        ("{ specific = 1 }", "version_policy.specific"),
        ("{ specific = [1, 0] }", "version_policy.specific[1]"),
        ("{ specific = [1, -2] }", "version_policy.specific[1]"),
        ("{ specific = [true] }", "version_policy.specific[0]"),
        ('{ specific = ["1"] }', "version_policy.specific[0]"),
        ("{ specific = { versions = [] } }", "version_policy.specific.versions"),
        ("{ specific = { version = [1] } }", "version_policy.specific"),
        ("{ all = { x = 1 } }", "version_policy.all"),
        ("{ all = true }", "version_policy.all"),
    ],
)
def test_malformed_version_policy_names_the_field(written, field):
    message = parse_error(f"version_policy = {written}")
    assert f": {field} " in message, message


# -- mistakes ----------------------------------------------------------------------------------


def test_a_toml_syntax_error_carries_tomllib_message():
    message = parse_error("max_batch_size = = 3")
    assert "invalid TOML" in message
    assert "line 1" in message  # tomllib's own position


def test_the_error_chains_the_toml_exception():
    import tomllib

    with pytest.raises(ModelConfigError) as info:
        parse("[unclosed")
    assert isinstance(info.value.__cause__, tomllib.TOMLDecodeError)
    assert isinstance(info.value, ModelLoadError)


def test_an_unknown_key_is_an_error_that_lists_the_known_ones():
    message = parse_error("max_batch_sise = 8")
    assert "unknown key 'max_batch_sise'" in message
    assert "did you mean 'max_batch_size'?" in message
    for known in (
        "batch_window_us",
        "concurrency",
        "max_batch_size",
        "pinned",
        "providers",
        "version_policy",
        "warmup",
    ):
        assert known in message


def test_several_unknown_keys_are_all_named():
    message = parse_error("colour = 1\n[parameters]\nx = 1")
    assert "unknown keys 'colour', 'parameters'" in message


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        ("max_batch_size = true", "max_batch_size", "the boolean true"),
        ("max_batch_size = -1", "max_batch_size", "the integer -1"),
        ("max_batch_size = 1.5", "max_batch_size", "the float 1.5"),
        ('max_batch_size = "8"', "max_batch_size", "the string '8'"),
        ("batch_window_us = false", "batch_window_us", "the boolean false"),
        ("batch_window_us = -5", "batch_window_us", "the integer -5"),
        ("concurrency = 2", "concurrency", "must be a string"),
        ('concurrency = "pool:0"', "concurrency", "pool:N"),
        ('concurrency = "pool:65"', "concurrency", "larger than the maximum, pool:64"),
        (f'concurrency = "pool:{"9" * 5000}"', "concurrency", "(5000 digits)"),
        ('concurrency = "pool:\u00b2"', "concurrency", "1 <= N <= 64"),
        ('concurrency = "threads"', "concurrency", "'threads'"),
        ("providers = []", "providers", "non-empty"),
        ('providers = "CPUExecutionProvider"', "providers", "the string"),
        ("providers = [1]", "providers[0]", "the integer 1"),
        ('providers = ["CPUExecutionProvider", ""]', "providers[1]", "the string ''"),
        (
            'providers = ["CPUExecutionProvider", "CPUExecutionProvider"]',
            "providers",
            "twice",
        ),
        ("pinned = 1", "pinned", "the integer 1"),
        ('pinned = "yes"', "pinned", "the string 'yes'"),
        ("warmup = 0", "warmup", "the integer 0"),
    ],
)
def test_a_wrong_value_names_the_field_and_what_is_wrong(text, field, why):
    message = parse_error(text)
    assert f"{SOURCE}: {field} " in message, message
    assert why in message, message


def test_bool_is_not_an_int_even_when_constructed_directly():
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 0"):
        ModelConfig(max_batch_size=True)
    with pytest.raises(ValueError, match=r"concurrency must be .auto., .shared."):
        ModelConfig(concurrency="pool:x")


def test_providers_given_as_a_list_are_kept_as_a_tuple():
    config = ModelConfig(providers=["CPUExecutionProvider"])  # type: ignore[arg-type]
    assert config.providers == ("CPUExecutionProvider",)
    hash(config)


# -- VersionPolicy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "available", "served"),
    [
        (VersionPolicy("latest", 1), [1, 2, 3], (3,)),
        (VersionPolicy("latest", 2), [3, 1, 10, 2], (3, 10)),
        (VersionPolicy("latest", 5), [2, 1], (1, 2)),
        (VersionPolicy("latest", 1), [], ()),
        (VersionPolicy("all"), [3, 1, 2], (1, 2, 3)),
        (VersionPolicy("all"), [], ()),
        (VersionPolicy("specific", versions=(1, 3)), [1, 2, 3, 4], (1, 3)),
        (VersionPolicy("specific", versions=(1, 7)), [1, 2], (1,)),
        (VersionPolicy("specific", versions=(7,)), [1, 2], ()),
    ],
)
def test_select(policy, available, served):
    assert policy.select(available) == served
    assert policy.select(iter(available)) == served  # any iterable, once


def test_select_takes_a_mapping_of_versions():
    assert VersionPolicy("latest", 1).select({1: "a", 4: "b", 2: "c"}) == (4,)


@pytest.mark.parametrize(
    ("policy", "text"),
    [
        (VersionPolicy("latest", 1), "latest:1"),
        (VersionPolicy("latest", 3), "latest:3"),
        (VersionPolicy("all"), "all"),
        (VersionPolicy("specific", versions=(3, 1)), "specific:1,3"),
    ],
)
def test_str(policy, text):
    assert str(policy) == text


@pytest.mark.parametrize(
    "make",
    [
        lambda: VersionPolicy("newest"),  # type: ignore[arg-type]
        lambda: VersionPolicy("latest", 0),
        lambda: VersionPolicy("latest", True),
        lambda: VersionPolicy("specific"),
        lambda: VersionPolicy("specific", versions=(0,)),
        lambda: VersionPolicy("all", 2),
        lambda: VersionPolicy("latest", versions=(1,)),
    ],
)
def test_an_impossible_policy_cannot_be_built(make):
    with pytest.raises(ValueError, match=re.compile(r"\S")):
        make()


def test_pool_is_bounded_by_max_pool_size_and_auto_stays_under_it():
    from corral._onnx.providers import MAX_POOL_SIZE, ConcurrencyPolicy, resolve_policy

    assert MAX_POOL_SIZE == 64
    assert ModelConfig(concurrency=f"pool:{MAX_POOL_SIZE}").concurrency == "pool:64"
    with pytest.raises(ValueError, match=r"'pool:65' is larger than the maximum, pool:64"):
        ConcurrencyPolicy("pool", MAX_POOL_SIZE + 1)

    class PoolProviders:
        run_policy = "pool"
        lane_devices = ()

    policy = resolve_policy("auto", PoolProviders(), pool_size=1000)  # type: ignore[arg-type]
    assert policy == ConcurrencyPolicy("pool", MAX_POOL_SIZE)


# -- a declared size (issue 49) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [('"64MiB"', 64 * 2**20), ("4096", 4096), ('"2Gi"', 2 * 2**30), ('"512MB"', 512 * 10**6)],
)
def test_memory_bytes_takes_the_sizes_the_budget_takes(text, expected):
    config = ModelConfig.from_toml(f"memory_bytes = {text}", source="m/model.toml")
    assert config.memory_bytes == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('"64M"', "memory_bytes '64M' is ambiguous"),
        ('"x"', "memory_bytes 'x' is not a size"),
        ("0", "memory_bytes must be positive"),
        ("-1", "memory_bytes must be positive"),
        ("true", "memory_bytes must be bytes or a size like '64MiB', got True"),
        ("1.5", "memory_bytes must be bytes or a size like '64MiB', got 1.5"),
    ],
)
def test_a_memory_bytes_that_is_not_a_size_is_refused_naming_the_field(text, problem):
    with pytest.raises(ModelConfigError) as caught:
        ModelConfig.from_toml(f"memory_bytes = {text}", source="m/model.toml")
    assert str(caught.value).startswith(f"m/model.toml: {problem}")
