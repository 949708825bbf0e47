"""Install hints fit how memlens was installed: a clone gets ``pip install -e 'CLONE[extra]'``, an install
from the package index ``pip install 'memlens[extra]'``."""
from __future__ import annotations

from pathlib import Path

from memlens.install_hint import extra_install_command, source_tree

ROOT = Path(__file__).resolve().parents[2]


def test_a_clone_is_named_by_its_directory():
    assert source_tree() == ROOT  # the tests run memlens from this clone
    assert extra_install_command("mcp") == f"pip install -e '{ROOT}[mcp]'"


def test_site_packages_is_not_a_clone(tmp_path):
    site = tmp_path / "site-packages"
    (site / "memlens").mkdir(parents=True)
    (site / "memlens" / "__init__.py").write_text("")
    assert source_tree(site / "memlens") is None
    (site / "pyproject.toml").write_text("")  # a clone: pyproject.toml beside the package
    assert source_tree(site / "memlens") == site


def test_the_mcp_verb_help_gives_the_hint(capsys):
    import pytest

    from memlens.cli import main
    with pytest.raises(SystemExit):
        main(["mcp", "--help"])
    assert extra_install_command("mcp") in " ".join(capsys.readouterr().out.split())
