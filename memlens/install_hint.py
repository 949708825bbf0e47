"""The command that adds one of memlens's optional extras (``mcp``, ``dask`` ...) to the memlens that is
running: a clone (an editable install, or the source tree on ``PYTHONPATH``) takes it from that clone, an
install from the package index from the index."""
from __future__ import annotations

from pathlib import Path


def source_tree(package_dir: Path | None = None) -> Path | None:
    """The clone memlens runs from (the directory holding ``pyproject.toml`` beside the ``memlens``
    package, `package_dir`: default the running one), or None for an install into site-packages."""
    root = Path(package_dir or Path(__file__).resolve().parent).parent
    return root if (root / "pyproject.toml").is_file() and (root / "memlens" / "__init__.py").is_file() else None


def extra_install_command(extra: str) -> str:
    """``pip install -e '/path/to/clone[extra]'`` when memlens runs from a clone, else
    ``pip install 'memlens[extra]'``."""
    root = source_tree()
    if root is not None:
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install 'memlens[{extra}]'"
