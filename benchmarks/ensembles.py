"""What an ensemble costs beside its client calling its two steps itself, in one Host.

One Host serves ``first`` (an ONNX linear model, X [N,4] -> Y [N,4]), ``second`` (an ONNX MLP,
X [N,4] -> Y [N,1]) and ``chain``, a Triton ensemble of the two (``first``'s Y into
``second``'s X). For each way of asking, rounds in turn (so that other work on this shared
machine falls on all alike):

- ``infer``: ``Host.infer`` from one thread: ``chain`` once, against ``first`` then ``second``
  (both on the calling thread either way);
- ``submit``: ``--threads`` threads each submitting and waiting (the queued path the server
  takes): ``chain`` once, against ``first``, its answer waited for, then ``second``.

Every answer is checked against the two models run by hand. Figures are medians over rounds of
the microseconds per request (one ensemble request, or the two step requests)::

    python benchmarks/ensembles.py [--rounds 5] [--requests 2000] [--threads 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

import corral
from corral.testing import build_linear, build_mlp

# Run as a script (`python benchmarks/ensembles.py`): its helpers import as benchmarks.timing.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.timing import per_call_us, print_medians  # noqa: E402

X = np.arange(4, dtype=np.float32).reshape(1, 4)

CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "first"
      model_version: -1
      input_map { key: "X" value: "IN" }
      output_map { key: "Y" value: "mid" }
    },
    {
      model_name: "second"
      model_version: -1
      input_map { key: "X" value: "mid" }
      output_map { key: "Y" value: "OUT" }
    }
  ]
}
"""

#: One request's way through: the ensemble, or its two steps asked by the client.
Ask = Callable[[corral.Host], np.ndarray]


def ensemble_infer(host: corral.Host) -> np.ndarray:
    """The ensemble, on the calling thread."""
    return host.infer("chain", {"IN": X})["OUT"]


def steps_infer(host: corral.Host) -> np.ndarray:
    """The two steps asked by the client, on the calling thread."""
    mid = host.infer("first", {"X": X})["Y"]
    return host.infer("second", {"X": mid})["Y"]


def ensemble_submit(host: corral.Host) -> np.ndarray:
    """The ensemble, queued and waited for."""
    return host.submit("chain", {"IN": X}).result(timeout=30)["OUT"]


def steps_submit(host: corral.Host) -> np.ndarray:
    """The two steps asked by the client, each queued and waited for."""
    mid = host.submit("first", {"X": X}).result(timeout=30)["Y"]
    return host.submit("second", {"X": mid}).result(timeout=30)["Y"]


def timed(host: corral.Host, ask: Ask, expected: np.ndarray, requests: int, threads: int) -> float:
    """Microseconds per request asked by ``threads`` threads, each waiting for its answer."""
    np.testing.assert_array_equal(ask(host), expected)
    return per_call_us(lambda: ask(host), requests, threads)


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name, model in (("first", build_linear(4, 4, seed=1)), ("second", build_mlp(seed=2))):
            (root / name / "1").mkdir(parents=True)
            (root / name / "1" / "model.onnx").write_bytes(model)
        (root / "chain" / "1").mkdir(parents=True)
        (root / "chain" / "config.pbtxt").write_text(CHAIN)
        runs: dict[tuple[str, str], list[float]] = {}
        with corral.Host(root) as host:
            expected = steps_infer(host)
            cases: dict[tuple[str, str], tuple[Ask, int]] = {
                ("infer", "ensemble"): (ensemble_infer, 1),
                ("infer", "two steps"): (steps_infer, 1),
                ("submit", "ensemble"): (ensemble_submit, args.threads),
                ("submit", "two steps"): (steps_submit, args.threads),
            }
            for _ in range(args.rounds):
                for key, (ask, threads) in cases.items():
                    figure = timed(host, ask, expected, args.requests, threads)
                    runs.setdefault(key, []).append(figure)
    print_medians(runs, "asked as", 10)


if __name__ == "__main__":
    main()
