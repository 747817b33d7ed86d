#!/usr/bin/env bash
# Builds the documentation site with mkdocs (Material + mkdocstrings), strictly: a broken link, a page
# missing from the nav or a docstring mkdocstrings cannot render fails the build.
#   bash .ci/docs.sh [PYTHON]   (PYTHON: a venv with the `docs` extra; default `python`)
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-python}"
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 "$py" -m mkdocs build --strict --site-dir "$site"
echo "docs.sh: site built ($(find "$site" -name '*.html' | wc -l) pages)" >&2
