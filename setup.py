"""Build hook: the repository's top-level data folders travel inside the wheel as package data.

``recipes/``, ``evaluation/``, ``benchmarks/scenarios/`` and ``data_cards/`` stay where they are in the
repository; ``build_py`` copies them into ``areal_cli/_shipped/`` of the build, where
``areal_cli.foundations.resources.shipped_dir`` finds them in an installed wheel. Editable installs read the repository's
folders directly, so nothing is copied for them. Everything else is in ``pyproject.toml``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# keep in sync with areal_cli.foundations.resources.SHIPPED (checked by tests/test_wheel_install.py)
SHIPPED = {"recipes": "recipes", "evaluation": "evaluation", "scenarios": "benchmarks/scenarios",
           "data_cards": "data_cards"}


class BuildPyWithShippedData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "areal_cli" / "_shipped"
        for name, rel in SHIPPED.items():
            src = ROOT / rel
            if not src.is_dir():
                raise SystemExit(f"error: {src}: shipped folder missing (is this a complete checkout or sdist?)")
            shutil.rmtree(dest / name, ignore_errors=True)
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithShippedData})
