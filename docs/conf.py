"""Sphinx configuration of the nemo_polar docs (MyST markdown), built strictly by `make lint`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "nemo_polar"
author = "the nemo_polar authors"
extensions = ["myst_parser", "sphinxarg.ext", "hydra_conf"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # [text](page.md#a-section) links checked by the strict build
myst_enable_extensions = ["colon_fence"]
html_theme = "nvidia_sphinx_theme"
html_title = "nemo_polar"
html_show_sourcelink = False
