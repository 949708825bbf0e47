"""MkDocs hooks: the tutorial notebooks in notebooks/ become the site's pages tutorials/NAME.ipynb, with outputs.

The notebooks are kept in the repository without outputs. Each build hands mkdocs-jupyter an executed copy
(nbclient, in a temporary copy of notebooks/ so that the files a notebook writes stay out of the repo), cached
under build/docs-notebooks/<hash>/tutorials/ by a hash of the notebook, its data files and memlens's sources: a
rebuild with nothing changed executes nothing. Nothing is written into docs/ or notebooks/.

MEMLENS_DOCS_NOTEBOOKS=stored renders the notebooks as stored (no outputs, no execution) for a quick preview.
A notebook whose execution fails fails the build, naming the notebook and the cell.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CACHE = ROOT / "build" / "docs-notebooks"
CELL_TIMEOUT_S = 600  # one cell; a kernel on a loaded 2-core machine is slow
log = logging.getLogger("mkdocs.hooks.notebooks")


def _inputs_hash(notebook: Path) -> str:
    """A hash of what the executed notebook's outputs depend on: itself, its data files, memlens's sources."""
    digest = hashlib.sha256(notebook.read_bytes())
    sources = sorted((NOTEBOOKS / "data").glob("*")) + sorted((ROOT / "memlens").rglob("*.py"))
    for path in sources:
        if path.is_file():
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _execute(notebook: Path, out: Path) -> None:
    """Run ``notebook`` top to bottom in a temporary copy of notebooks/ and write it, with outputs, to ``out``."""
    import nbclient
    import nbformat

    env_path = os.environ.get("PYTHONPATH")
    # the kernel imports this checkout's memlens, whatever else the environment has installed
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env_path]))
    try:
        with tempfile.TemporaryDirectory(prefix="memlens-docs-") as tmp:
            work = Path(tmp) / "notebooks"
            shutil.copytree(NOTEBOOKS, work, ignore=shutil.ignore_patterns("*.memlens", "*.html",
                                                                            ".ipynb_checkpoints"))
            nb = nbformat.read(work / notebook.name, as_version=4)
            client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, startup_timeout=180, kernel_name="python3",
                                             resources={"metadata": {"path": str(work)}})
            try:
                client.execute()
            except nbclient.exceptions.CellExecutionError as exc:
                raise PluginError(f"{notebook.relative_to(ROOT)}: a cell failed while building the docs:\n{exc}")
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_path
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".partial")
    nbformat.write(nb, tmp_out)
    tmp_out.replace(out)


def executed_copy(notebook: Path) -> Path:
    """The executed copy of ``notebook``, CACHE/<hash>/tutorials/NAME.ipynb (from the cache when its inputs have
    not changed)."""
    out = CACHE / _inputs_hash(notebook) / "tutorials" / notebook.name
    if not out.exists():
        log.info("executing %s for the docs (cached under %s)", notebook.relative_to(ROOT), out.parent)
        _execute(notebook, out)
    return out


def stored_copy(notebook: Path) -> Path:
    """``notebook`` as stored (no outputs), CACHE/stored/tutorials/NAME.ipynb."""
    out = CACHE / "stored" / "tutorials" / notebook.name
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(notebook, out)
    return out


# before mkdocs-jupyter's own on_files, which wraps every .ipynb file it is handed
@event_priority(100)
def on_files(files: Files, config) -> Files:
    stored = os.environ.get("MEMLENS_DOCS_NOTEBOOKS") == "stored"
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        source = stored_copy(notebook) if stored else executed_copy(notebook)
        # a File with its own src_dir (not File.generated): mkdocs-jupyter's wrapper finds the source path
        # only through src_dir
        files.append(File(f"tutorials/{notebook.name}", src_dir=str(source.parents[1]), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files
