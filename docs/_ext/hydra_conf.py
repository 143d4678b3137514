"""``{hydra-conf}``: the reference page of the Hydra config, generated from the files under ``conf/``.

The primary config first, then one section per config group with each option's file as it ships, so the page
cannot list a group or option that does not exist, or miss one that does.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

CONF = Path(__file__).resolve().parents[2] / "conf"


def _literal(path: Path) -> nodes.literal_block:
    text = path.read_text()
    block = nodes.literal_block(text, text, language="yaml")
    block["source"] = str(path)
    return block


class HydraConf(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for primary in sorted(CONF.glob("*.yaml")):
            self.env.note_dependency(str(primary))
            section = nodes.section(ids=[f"conf-{primary.stem}"])
            section += nodes.title(text=f"{primary.name} (the primary config)")
            section += _literal(primary)
            out.append(section)
        for group in sorted(p for p in CONF.iterdir() if p.is_dir()):
            section = nodes.section(ids=[f"group-{group.name}"])
            options = sorted(group.glob("*.yaml"))
            section += nodes.title(text=f"{group.name}=")
            section += nodes.paragraph(text="options: " + ", ".join(f"{group.name}={p.stem}" for p in options))
            for option in options:
                self.env.note_dependency(str(option))
                section += nodes.paragraph("", "", nodes.literal(text=f"conf/{group.name}/{option.name}"))
                section += _literal(option)
            out.append(section)
        return out


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("hydra-conf", HydraConf)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
