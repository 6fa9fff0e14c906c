"""A missing extra's hint installs its packages by name: corral itself is not on the index."""

from __future__ import annotations

import tomllib

from corral._base import install_hint
from tests.helpers import ROOT


def test_the_s3_hint_names_obstore_with_corrals_bound():
    # It said pip install 'corral[s3]', which finds no project on the index for a corral
    # installed from its clone (a wheel in an image, say).
    assert install_hint("s3") == "pip install 'obstore>=0.12'"


def test_every_extras_hint_names_its_packages_and_never_corral():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, requirements in extras.items():
        if extra == "dev":  # names corral's own extras: a clone's, not a hint's
            continue
        hint = install_hint(extra)
        assert "corral" not in hint, (extra, hint)
        for requirement in requirements:
            name = requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip()
            assert name in hint, (extra, hint)
