"""Custom operator libraries: model.toml's ``custom_op_libraries``, config.pbtxt's
``model_operations``, onnxruntime-extensions' library by name, and what is refused.

The model is built here with one onnxruntime-extensions operator (``StringUpper`` of the
``ai.onnx.contrib`` domain): onnxruntime alone cannot load it. A library file inside a model
folder is a copy of onnxruntime-extensions' own library.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import corral
from corral._base.problems import ProblemKind
from corral._host.check import find_problems
from corral._onnx import ort as _ort
from corral.testing import build_linear
from tests.helpers import add_model
from tests.processes import ServerProcess, start_server, stop_server

# tritonclient's HTTP client is gevent-based: collected on another thread, it fails there.
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

WORDS = np.array([b"corral", b"Onnx", b"", "\u00e9t\u00e9".encode()], dtype=np.object_)
# StringUpper changes ASCII letters only; the other bytes of UTF-8 text pass through.
UPPER = np.array([b"CORRAL", b"ONNX", b"", "\u00e9T\u00e9".encode()], dtype=np.object_)
# What a session in this process gives back: onnxruntime's strings are str.
UPPER_TEXT = np.array([word.decode() for word in UPPER], dtype=np.object_)
LIBRARY_COPY = "libortextensions.so"
NAMED_TOML = 'custom_op_libraries = ["onnxruntime_extensions"]\n'

PBTXT = """\
name: "{name}"
backend: "onnxruntime"
max_batch_size: 0
input [{{ name: "X", data_type: TYPE_STRING, dims: [-1] }}]
output [{{ name: "Y", data_type: TYPE_STRING, dims: [-1] }}]
model_operations {{ op_library_filename: "{library}" }}
"""


def build_upper() -> bytes:
    """A model whose one node is onnxruntime-extensions' StringUpper: strings in, upper out."""
    graph = helper.make_graph(
        [helper.make_node("StringUpper", ["X"], ["Y"], domain="ai.onnx.contrib")],
        "upper",
        [helper.make_tensor_value_info("X", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("Y", TensorProto.STRING, ["N"])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def copy_library(folder: Path, name: str = LIBRARY_COPY) -> Path:
    """onnxruntime-extensions' library, copied into a model's folder."""
    target = folder / name
    # Found as corral finds it: importing the package would change this process's environment.
    shutil.copyfile(_ort.extensions_library_path("test"), target)
    return target


def add_pbtxt_model(root: Path, name: str, library: str) -> Path:
    model = add_model(root, name, build_upper())
    (root / name / "config.pbtxt").write_text(PBTXT.format(name=name, library=library))
    return model


# -- served over HTTP and gRPC ---------------------------------------------------------------


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository of two models that need the extensions: one by name, one by a file."""
    root = tmp_path_factory.mktemp("custom_ops")
    add_model(root, "named", build_upper(), toml=NAMED_TOML)
    add_pbtxt_model(root, "file", LIBRARY_COPY)
    copy_library(root / "file")
    return root


@pytest.fixture(scope="module")
def server(served_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    served = start_server(served_root, tmp_path_factory.mktemp("log") / "serve.log")
    yield served
    stop_server(served)


@pytest.mark.parametrize("model", ["named", "file"])
def test_a_model_with_extension_operators_is_served_over_http_and_grpc(
    server: ServerProcess, served_root: Path, model: str
):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(server.http) as client:
        for binary in (True, False):
            tensor = httpclient.InferInput("X", list(WORDS.shape), "BYTES")
            tensor.set_data_from_numpy(WORDS, binary_data=binary)
            wanted = httpclient.InferRequestedOutput("Y", binary_data=binary)
            result = client.infer(model, [tensor], outputs=[wanted])
            expected = UPPER if binary else UPPER_TEXT  # JSON carries BYTES as text
            np.testing.assert_array_equal(result.as_numpy("Y"), expected, err_msg=str(binary))
    with grpcclient.InferenceServerClient(server.grpc) as client:
        tensor = grpcclient.InferInput("X", list(WORDS.shape), "BYTES")
        tensor.set_data_from_numpy(WORDS)
        np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("Y"), UPPER)
        grpc_config = client.get_model_config(model, as_json=True)["config"]
    with httpclient.InferenceServerClient(server.http) as client:
        http_config = client.get_model_config(model)
    # Reported as Triton reports it: a library file by its real path, the package's by name.
    wanted = (
        ["onnxruntime_extensions"]
        if model == "named"
        else [str((served_root / "file" / LIBRARY_COPY).resolve())]
    )
    assert http_config["model_operations"] == {"op_library_filename": wanted}
    assert grpc_config["model_operations"] == {"op_library_filename": wanted}


# -- construction from many threads ----------------------------------------------------------


def test_sixteen_sessions_built_from_sixteen_threads_at_once_all_run():
    model = build_upper()
    barrier = threading.Barrier(16)
    answers: list[np.ndarray] = []
    errors: list[BaseException] = []
    answers_lock = threading.Lock()  # guards answers and errors

    def build() -> None:
        try:
            barrier.wait(timeout=30)
            with corral.Session(model, custom_op_libraries=["onnxruntime_extensions"]) as session:
                out = session.run({"X": WORDS})["Y"]
            with answers_lock:
                answers.append(out)
        except BaseException as exc:
            with answers_lock:
                errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(answers) == 16
    for out in answers:
        np.testing.assert_array_equal(out, UPPER_TEXT)


def test_registration_and_construction_wait_for_the_construction_lock():
    model = build_upper()
    built = threading.Event()

    def build() -> None:
        with corral.Session(model, custom_op_libraries=["onnxruntime_extensions"]):
            built.set()

    with _ort.CONSTRUCTION_LOCK:
        thread = threading.Thread(target=build)
        thread.start()
        # Held here, the lock keeps the build from registering: it cannot finish.
        assert not built.wait(0.5)
    assert built.wait(30)
    thread.join(timeout=30)


# -- refused by name -------------------------------------------------------------------------


def outside_cases(root: Path, outside: Path) -> dict[str, str]:
    """Library paths that lead out of a model's folder, each with what to write in model.toml."""
    copy_library(outside)
    os.symlink(outside / LIBRARY_COPY, root / "linked" / "liblinked.so")
    return {
        "relative": f"../../{outside.name}/{LIBRARY_COPY}",
        "absolute": str(outside / LIBRARY_COPY),
        "linked": "liblinked.so",
    }


@pytest.mark.parametrize("case", ["relative", "absolute", "linked"])
def test_a_library_outside_the_models_folder_is_refused_by_name(tmp_path: Path, case: str):
    root = tmp_path / "repo"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    add_model(root, "linked", build_upper())
    library = outside_cases(root, outside)[case]
    (root / "linked" / "model.toml").write_text(f"custom_op_libraries = [{json.dumps(library)}]\n")
    with corral.Host(root) as host:
        with pytest.raises(corral.ModelConfigError) as refused:
            host.infer("linked", {"X": WORDS})
        assert host.stats().loads == 0
    message = str(refused.value)
    assert f"custom op library {library!r} resolves outside the model's folder" in message
    problems, _ = find_problems(corral.Repository(root), memory_budget=None, pool_size=1)
    assert [p.kind for p in problems] == [ProblemKind.BAD_MODEL_TOML], problems
    assert "resolves outside the model's folder" in problems[0].message


def test_an_absolute_path_in_a_local_config_pbtxt_is_loaded_as_triton_loads_it(tmp_path: Path):
    # Triton's usual op_library_filename: an absolute path the operator installed.
    root = tmp_path / "repo"
    root.mkdir()
    installed = copy_library(tmp_path)
    add_pbtxt_model(root, "absolute", str(installed))
    repository = corral.Repository(root)
    entry = repository.entry("absolute")
    assert entry.error is None, entry.error
    assert entry.config.custom_op_libraries == (str(installed.resolve()),)
    with corral.Host(root) as host:
        np.testing.assert_array_equal(host.infer("absolute", {"X": WORDS})["Y"], UPPER_TEXT)
    # Stamped as a library inside the folder is: a new file there is a changed model.
    before = entry.version_fingerprint(1)
    replacement = tmp_path / "new.so"
    shutil.copyfile(installed, replacement)
    with replacement.open("ab") as extended:
        extended.write(b"\0" * 64)
    os.replace(replacement, installed)
    assert corral.Repository(root).entry("absolute").version_fingerprint(1) != before
    # A relative path out of the folder stays refused, as in model.toml.
    add_pbtxt_model(root, "relative", f"../../{installed.name}")
    error = corral.Repository(root).entry("relative").error
    assert isinstance(error, corral.ModelConfigError)
    assert "resolves outside the model's folder" in str(error), error


def test_a_library_that_fails_to_load_is_refused_naming_it_and_why(tmp_path: Path):
    add_pbtxt_model(tmp_path, "junk", "libjunk.so")
    (tmp_path / "junk" / "libjunk.so").write_bytes(b"not a shared library, " * 16)
    with corral.Host(tmp_path) as host, pytest.raises(corral.ModelLoadError) as refused:
        host.infer("junk", {"X": WORDS})
    message = str(refused.value)
    assert "custom op library" in message, message
    assert "libjunk.so' failed to load" in message, message
    assert "invalid ELF header" in message, message
    problems, _ = find_problems(
        corral.Repository(tmp_path), memory_budget=None, pool_size=1, read_model_files=True
    )
    assert [p.kind for p in problems] == [ProblemKind.BAD_CUSTOM_OP_LIBRARY], problems
    assert "invalid ELF header" in problems[0].message
    assert problems[0].path.endswith("config.pbtxt")


def test_a_missing_library_file_is_refused_naming_it(tmp_path: Path):
    add_pbtxt_model(tmp_path, "missing", "libnone.so")
    with corral.Host(tmp_path) as host, pytest.raises(corral.ModelConfigError) as refused:
        host.infer("missing", {"X": WORDS})
    assert "custom op library 'libnone.so': no such file in the model's folder" in str(
        refused.value
    )


def test_without_its_library_the_model_does_not_load(tmp_path: Path):
    add_model(tmp_path, "plain", build_upper())
    with corral.Host(tmp_path) as host, pytest.raises(corral.ModelLoadError, match="StringUpper"):
        host.infer("plain", {"X": WORDS})


def test_a_loads_config_may_name_the_extensions_library_but_no_library_file(tmp_path: Path):
    add_model(tmp_path, "up", build_upper())
    library = copy_library(tmp_path / "up")

    def config(op_library: str) -> str:
        return json.dumps(
            {
                "name": "up",
                "backend": "onnxruntime",
                "model_operations": {"op_library_filename": [op_library]},
            }
        )

    with corral.Host(tmp_path) as host:
        with pytest.raises(corral.ModelConfigError, match=r"a load's config may name only"):
            host.load("up", config=config(library.name))
        # Not an absolute path either, which a local repository's config.pbtxt may name.
        with pytest.raises(corral.ModelConfigError, match=r"a load's config may name only"):
            host.load("up", config=config(str(library.resolve())))
        upload = {"1/model.onnx": build_upper(), "libmine.so": library.read_bytes()}
        with pytest.raises(corral.ModelConfigError, match=r"'libmine\.so': a load's config"):
            host.load("up", config=config("libmine.so"), files=upload)
        host.load("up", config=config("onnxruntime_extensions"))
        np.testing.assert_array_equal(host.infer("up", {"X": WORDS})["Y"], UPPER_TEXT)


# -- settings --------------------------------------------------------------------------------


def test_model_toml_and_config_pbtxt_read_the_libraries(tmp_path: Path):
    add_model(tmp_path, "toml", build_upper(), toml=NAMED_TOML)
    add_pbtxt_model(tmp_path, "pbtxt", f"ops/{LIBRARY_COPY}")
    (tmp_path / "pbtxt" / "ops").mkdir()
    real = copy_library(tmp_path / "pbtxt" / "ops")
    repository = corral.Repository(tmp_path)
    assert repository.entry("toml").config.custom_op_libraries == ("onnxruntime_extensions",)
    assert repository.entry("pbtxt").config.custom_op_libraries == (str(real.resolve()),)
    with corral.Host(tmp_path) as host:
        for name in ("toml", "pbtxt"):
            np.testing.assert_array_equal(host.infer(name, {"X": WORDS})["Y"], UPPER_TEXT)


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ('"onnxruntime_extensions"', "must be an array of library paths"),
        ("[1]", "custom_op_libraries[0] must be a path inside the model's folder"),
        ('[""]', "custom_op_libraries[0] must be a path"),
        ('["a.so", "a.so"]', "lists a library twice"),
    ],
)
def test_model_toml_refuses_a_malformed_list(value: str, phrase: str):
    with pytest.raises(corral.ModelConfigError, match=re.escape(phrase)):
        corral.ModelConfig.from_toml(f"custom_op_libraries = {value}\n", source="m/model.toml")


@pytest.mark.parametrize("value", ["libx.so", [1], [""]])
def test_session_refuses_malformed_libraries(value: Any):
    with pytest.raises(corral.ModelConfigError, match="custom_op_libraries must"):
        corral.Session(build_upper(), custom_op_libraries=value)


def test_without_the_package_the_named_library_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(_ort, "_EXTENSIONS_PACKAGE", "corral_no_such_package")
    with pytest.raises(
        corral.ModelLoadError, match=r"not installed: pip install 'onnxruntime-extensions>=0.15'"
    ):
        corral.Session(build_upper(), custom_op_libraries=["onnxruntime_extensions"])
    monkeypatch.setattr(_ort, "_EXTENSIONS_PACKAGE", "corral")  # a package without the module
    with pytest.raises(corral.ModelLoadError, match=r"has no _extensions_pydll in"):
        corral.Session(build_upper(), custom_op_libraries=["onnxruntime_extensions"])


def test_finding_the_extensions_library_leaves_the_environment_alone(tmp_path: Path):
    # Importing onnxruntime-extensions (with onnx installed) sets PROTOCOL_BUFFERS_PYTHON_
    # IMPLEMENTATION=python for the process and its children; corral does not import it.
    model = tmp_path / "upper.onnx"
    model.write_bytes(build_upper())
    script = (
        "import os, sys, corral\n"
        "before = dict(os.environ)\n"
        "s = corral.Session(sys.argv[1], custom_op_libraries=['onnxruntime_extensions'])\n"
        "s.close()\n"
        "print(sorted(k for k in os.environ if before.get(k) != os.environ[k]))\n"
        "print('onnxruntime_extensions' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(model)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split("\n")[:2] == ["[]", "False"], done.stdout


def test_the_check_loads_a_library_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    add_model(tmp_path, "named", build_upper(), toml=NAMED_TOML)
    add_pbtxt_model(tmp_path, "file", LIBRARY_COPY)
    library = copy_library(tmp_path / "file")
    loaded: list[str] = []
    check = _ort.check_custom_op_libraries

    def counted(libraries: Any, source: str) -> None:
        loaded.extend(libraries)
        check(libraries, source)

    monkeypatch.setattr(_ort, "check_custom_op_libraries", counted)
    repository = corral.Repository(tmp_path)
    problems, files = find_problems(
        repository, memory_budget=None, pool_size=1, read_model_files=True
    )
    assert problems == []
    assert loaded == [str(library.resolve()), "onnxruntime_extensions"]
    again, files = find_problems(
        repository, memory_budget=None, pool_size=1, read_model_files=True, files=files
    )
    assert again == []
    assert len(loaded) == 2  # nothing loaded again
    # Replaced, not rewritten in place: the first file may still be mapped into this process.
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a shared library, " * 16)
    junk.replace(library)
    changed, _ = find_problems(
        repository, memory_budget=None, pool_size=1, read_model_files=True, files=files
    )
    assert [p.kind for p in changed] == [ProblemKind.BAD_CUSTOM_OP_LIBRARY]
    assert len(loaded) == 3


@pytest.mark.parametrize(
    ("case", "phrase"),
    [("folder", "not a regular file"), ("loop", "cannot read it")],
)
def test_a_library_that_is_no_file_is_refused_naming_it(tmp_path: Path, case: str, phrase: str):
    add_pbtxt_model(tmp_path, "odd", "libodd.so")
    target = tmp_path / "odd" / "libodd.so"
    if case == "folder":
        target.mkdir()
    else:
        os.symlink(target, target)  # a link to itself: stat fails with ELOOP
    with corral.Host(tmp_path) as host, pytest.raises(corral.ModelConfigError) as refused:
        host.infer("odd", {"X": WORDS})
    assert f"custom op library 'libodd.so': {phrase}" in str(refused.value)


def test_a_library_gone_before_the_check_is_reported_as_failing_to_load(tmp_path: Path):
    from corral._host.check import _library_key

    gone = str(tmp_path / "gone.so")
    assert _library_key(gone) == (gone, -1, -1)
    with pytest.raises(corral.ModelLoadError, match=r"custom op library .*gone\.so' failed"):
        _ort.check_custom_op_libraries([gone], "model 'm'")


def test_the_config_documents_report_the_libraries_in_process():
    from corral.protocol.grpc_codec import encode_model_config
    from corral.protocol.json.documents import config_doc
    from corral.protocol.types import ModelConfiguration

    libraries = ("/models/m/libops.so", "onnxruntime_extensions")
    config = ModelConfiguration(
        name="m",
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        max_batch_size=0,
        inputs=(),
        outputs=(),
        op_library_filenames=libraries,
    )
    assert config_doc(config)["model_operations"] == {"op_library_filename": list(libraries)}
    message = encode_model_config(config).config
    assert list(message.model_operations.op_library_filename) == list(libraries)
    plain = ModelConfiguration("m", "onnxruntime_onnx", "onnxruntime", 0, (), ())
    assert "model_operations" not in config_doc(plain)
    assert not encode_model_config(plain).config.HasField("model_operations")


# -- a library replaced on disk --------------------------------------------------------------

# A stand-in library: its RegisterCustomOps registers nothing and notes which build it is.
MARKING_LIBRARY = r"""
#include <stdio.h>
#include <stdlib.h>
void *RegisterCustomOps(void *options, const void *api) {
    const char *mark = getenv("CORRAL_TEST_OP_MARK");
    FILE *file = mark ? fopen(mark, "a") : NULL;
    if (file) { fputs("%s\n", file); fclose(file); }
    return NULL;
}
"""


def build_marking_library(folder: Path, mark: str) -> Path:
    """A shared library whose registration appends ``mark`` to $CORRAL_TEST_OP_MARK."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build a stand-in operator library")
    source = folder / f"ops{mark}.c"
    source.write_text(MARKING_LIBRARY % mark)
    library = folder / f"libops{mark}.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=60
    )
    return library


def test_a_session_registers_the_library_file_its_path_names_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    first, second = (build_marking_library(tmp_path, mark) for mark in ("A", "B"))
    marks = tmp_path / "marks.txt"
    monkeypatch.setenv("CORRAL_TEST_OP_MARK", str(marks))
    library = tmp_path / "libops.so"
    shutil.copy(first, library)
    model = build_linear()
    with corral.Session(model, custom_op_libraries=[str(library)]):
        with corral.Session(model, custom_op_libraries=[str(library)]):
            pass  # the same file again: loaded once, by its own path
        shutil.copy(second, tmp_path / "libops.so.new")
        os.replace(tmp_path / "libops.so.new", library)
        # The old library is still loaded (the first session holds it): dlopen of the same
        # path would hand it back.
        for _ in range(2):
            with corral.Session(model, custom_op_libraries=[str(library)]):
                pass
    assert marks.read_text().split() == ["A", "A", "B", "B"]


def test_a_library_replaced_on_disk_is_registered_as_the_new_one_on_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    builds = tmp_path / "builds"
    builds.mkdir()
    first, second = (build_marking_library(builds, mark) for mark in ("A", "B"))
    marks = tmp_path / "marks.txt"
    monkeypatch.setenv("CORRAL_TEST_OP_MARK", str(marks))
    root = tmp_path / "repo"
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.onnx").write_bytes(build_linear())
    (root / "m" / "model.toml").write_text('custom_op_libraries = ["libops.so"]\n')
    shutil.copy(first, root / "m" / "libops.so")
    x = np.ones((1, 4), np.float32)
    with corral.Host(root) as host:
        host.infer("m", {"X": x})
        assert marks.read_text().split() == ["A"]
        # A new release of the library, put in place as deployments and the store's cache do,
        # while the model's first version still holds the old one.
        shutil.copy(second, root / "m" / "libops.so.new")
        os.replace(root / "m" / "libops.so.new", root / "m" / "libops.so")
        host.refresh()
        host.infer("m", {"X": x})
    assert marks.read_text().split() == ["A", "B"]
