#!/usr/bin/env bash
# Serve the documentation site locally (http://127.0.0.1:8000) and rebuild it on every change to docs/.
# The tutorial notebooks are executed once and cached under build/docs-notebooks/ (a few minutes the first
# time); MEMLENS_DOCS_NOTEBOOKS=stored shows them as stored, without outputs, at once.
# `bash scripts/docs.sh build` builds the site into build/site/ with --strict instead, as .ci/run does.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/mkdocs ] || bash scripts/install.sh docs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the API reference and the notebooks use this checkout
if [ "${1:-serve}" = "build" ]; then
  exec .venv/bin/mkdocs build --strict
fi
exec .venv/bin/mkdocs serve "$@"
