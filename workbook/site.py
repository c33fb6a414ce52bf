"""The course site: the README, ``docs/`` and the lessons as one static site.

    python -m workbook.site build [-o DIR] [--executed DIR]

builds it into ``site/`` (or DIR) with MkDocs, the Material theme and mkdocs-jupyter, all
configured in ``mkdocs.yml`` at the repository root. Why those tools: ``docs/site.md``.

What a build does, in order:

1. lays the pages out in a scratch folder: ``README.md`` becomes the home page, ``docs/*`` the
   pages beside it, ``lessons/README.md`` the lessons' index and every ``lessons/NN_name.ipynb``
   a lesson page, with a first cell that says how to run it and which lab it ends with;
2. rewrites each relative link between those files to where the file lands on the site; a link
   to any other file of the repository (a lab, a script) gets a copy of that file on the site;
3. adds the lessons to the navigation of ``mkdocs.yml``;
4. writes the lessons' TeX math as MathML (``latex2mathml``), which browsers draw with no
   script, and, when a lesson carries figures, copies plotly.js (from the ``plotly`` package) into
   the site: no page loads a script from the network;
5. runs MkDocs in strict mode: a broken link between pages fails the build.

Lessons are never executed here (the test command runs every lesson; see
``tests/package/test_notebooks.py``): a lesson page shows its text, its math and its code. With
``--executed DIR``, a notebook ``DIR/NN_name.ipynb`` (the same lesson, run and saved: from
JupyterLab, ``jupyter nbconvert --execute`` or CI) is shown in its place with its outputs. Its
plotly figures are drawn again from their data with the site's own plotly.js; its ipywidgets,
which need a running kernel, become a line that says so.

Exit status: 0 built, 1 the build failed (MkDocs's message says why), 2 a usage error or a
missing tool (the message names the package to install).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import re
import shutil
import sys
import tempfile
import time
from html import unescape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "mkdocs.yml"
DEFAULT_OUT = ROOT / "site"

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: a Markdown link or image: [text](target) / ![alt](target); the target has no spaces
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
LAB_OF_LESSON = re.compile(r"check_your_work\(\s*[\"'](?P<lab>\w+)[\"']")
EXTERNAL = ("http://", "https://", "mailto:", "#", "/")


class SiteError(Exception):
    """A usage error or a missing tool: one line that says what to do (exit status 2)."""


# --------------------------------------------------------------------------------------------
# where each file of the repository lands on the site
# --------------------------------------------------------------------------------------------

def lesson_notebooks(root: Path = ROOT) -> list[Path]:
    """Every lesson notebook, in course order (``lessons/NN_name.ipynb``)."""
    return sorted((root / "lessons").glob("[0-9][0-9]_*.ipynb"))


def site_path(repo_path: str) -> str:
    """Where a file of the repository (a path relative to the root, ``/``-separated) lands in the
    site's source folder: README.md is the home page, docs/ is the top level, lessons/README.md
    the lessons' index; a lesson's script ``NN_name.py`` is shown as its notebook page. Any other
    file keeps its path under ``repo/``."""
    if repo_path == "README.md":
        return "index.md"
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path == "lessons/README.md":
        return "lessons/index.md"
    if re.fullmatch(r"lessons/\d\d_\w+\.(ipynb|py)", repo_path):
        return repo_path.rsplit(".", 1)[0] + ".ipynb"
    return "repo/" + repo_path


def _relative(from_dir: str, to_path: str) -> str:
    return os.path.relpath(to_path, from_dir or ".").replace(os.sep, "/")


def rewrite_links(text: str, repo_path: str, root: Path, extra: set[str]) -> str:
    """The Markdown ``text`` of the file ``repo_path`` with its relative links pointed at where
    their targets land on the site. A target outside the site's pages is added to ``extra`` (a
    copy of it goes on the site); a link to a folder becomes its text in code, since a static
    site cannot list a folder."""
    here = os.path.dirname(repo_path)
    site_here = os.path.dirname(site_path(repo_path))

    def fix(m: re.Match) -> str:
        target = m.group("target")
        if target.startswith(EXTERNAL):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(here, path)).replace(os.sep, "/")
        if resolved.startswith("..") or not (root / resolved).exists():
            return m.group(0)                    # left for MkDocs's strict check to report
        if (root / resolved).is_dir():
            return m.group("bang") + f"`{m.group('text')}`"
        dest = site_path(resolved)
        if dest.startswith("repo/"):
            extra.add(resolved)
        new = _relative(site_here, dest) + (f"#{anchor}" if anchor else "")
        return f"{m.group('bang')}[{m.group('text')}]({new})"

    out, fence = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        out.append(line if fence else LINK.sub(fix, line))
    return "".join(out)


# --------------------------------------------------------------------------------------------
# lesson pages
# --------------------------------------------------------------------------------------------

def _lab_of(nb) -> str | None:
    for cell in nb.cells:
        if cell.cell_type == "code":
            m = LAB_OF_LESSON.search(cell.source)
            if m:
                return m.group("lab")
    return None


def _header_cell(nbformat, name: str, lab: str | None, executed: bool, plotly_js: str | None):
    """The note at the top of a lesson page: how to run it, and its lab. Raw HTML, since a
    notebook's Markdown is rendered by nbconvert, which knows no admonitions; the theme styles
    the ``admonition`` classes."""
    run = (f"This page is the lesson's text and code. To run it: "
           f"<code>.venv/bin/jupyter lab lessons/{name}</code>.")
    if lab:
        run += (f" It ends with the lab <code>labs/{lab}.py</code>: self-check it with "
                f"<code>workbook run {lab}</code>, grade it with "
                f"<code>workbook grade --lab {lab}</code>.")
    run += (" Outputs: from a run of the notebook, saved; interactive controls need a running "
            "kernel, so they are not shown." if executed else
            " Outputs are not shown here: the site does not run the lessons.")
    source = ('<div class="admonition note">\n<p class="admonition-title">Run this lesson</p>\n'
              f"<p>{run}</p>\n</div>")
    if plotly_js:
        source += f'\n\n<script src="{plotly_js}"></script>'
    return nbformat.v4.new_markdown_cell(source)


def _plotly_html(figure: dict) -> str:
    import plotly.io as pio
    return pio.to_html(figure, config=figure.get("config"), include_plotlyjs=False,
                       full_html=False, default_width="100%",
                       default_height=figure.get("layout", {}).get("height") or 450,
                       validate=False)


def _static_outputs(nb) -> bool:
    """Outputs a static page can show: plotly figures drawn from their data (with the site's own
    plotly.js, loaded once by the header cell), ipywidgets replaced by a line that says they need
    a kernel. Returns whether the notebook has a plotly figure."""
    has_plotly = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            data = out.get("data")
            if not data:
                continue
            if PLOTLY_MIME in data:
                has_plotly = True
                figure = data[PLOTLY_MIME]
                out["data"] = {"text/html": _plotly_html(figure)}
            elif WIDGET_MIME in data:
                out["data"] = {"text/markdown": "*(an interactive control: it needs a running "
                                                "kernel; open the lesson in JupyterLab)*"}
    nb.metadata.pop("widgets", None)
    return has_plotly


def stage_lesson(src: Path, dest: Path, executed_dir: Path | None) -> bool:
    """Write lesson ``src`` (or its executed copy from ``executed_dir``) to ``dest`` with its header
    cell. Returns whether it needs plotly.js."""
    import nbformat
    executed = executed_dir is not None and (executed_dir / src.name).is_file()
    nb = nbformat.read(executed_dir / src.name if executed else src, as_version=4)
    lab = _lab_of(nb)
    has_plotly = _static_outputs(nb) if executed else False
    if not executed:
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0,
                    _header_cell(nbformat, src.name, lab, executed,
                                 "../assets/plotly.min.js" if has_plotly else None))
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return has_plotly


def _lesson_title(nb_path: Path) -> str:
    nb = json.loads(nb_path.read_text())
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            src = "".join(cell.get("source", []))
            m = re.search(r"^#\s+(.+)$", src, re.M)
            if m:
                return m.group(1).strip()
    return nb_path.stem


def _toc_items(toc):
    for item in toc:
        yield item
        yield from _toc_items(item.children)


def align_toc(html: str, toc) -> None:
    """Point a lesson page's table of contents at its headings. mkdocs-jupyter makes the table
    from the notebook's Markdown with the code in a heading left out (``exercise-the-lab``) while
    nbconvert's heading ids keep it (``exercise-the-tp-lab``); each entry takes the id of the next
    heading whose id holds the entry's words in the same order."""
    ids = re.findall(r'<h[1-6][^>]*\sid="([^"]+)"', html)

    def holds(heading: str, entry: str) -> bool:
        words = iter(heading.split("-"))
        return all(w in words for w in entry.split("-"))

    at = 0
    for item in _toc_items(toc):
        for j in range(at, len(ids)):
            if holds(ids[j], item.id):
                item.id, at = ids[j], j + 1
                break


#: nbconvert's MathJax loader (a script from a CDN, and its configuration)
MATHJAX_BLOCK = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
#: where no math is looked for: code, scripts, styles
NOT_MATH = re.compile(r"<(pre|code|script|style)\b.*?</\1>", re.S)
#: $$display$$ and $inline$ math, as a notebook's Markdown writes it (nbconvert leaves it as text)
MATH = re.compile(r"\$\$(?P<display>[^<$]+?)\$\$|(?<![\\$\w])\$(?P<inline>[^$<\n]+?)\$(?![\w$])")


def math_to_mathml(html: str) -> str:
    """A lesson page's TeX math as MathML, which browsers draw without a script (latex2mathml),
    and nbconvert's MathJax loader removed: the page loads nothing from the network. A formula
    latex2mathml cannot read stays as its TeX text."""
    from latex2mathml.converter import convert

    def one(m: re.Match) -> str:
        tex = m.group("display") or m.group("inline")
        try:
            return convert(unescape(tex).strip(), display="block" if m.group("display") else "inline")
        except Exception:                              # noqa: BLE001 - keep the TeX as text
            return m.group(0)

    html = MATHJAX_BLOCK.sub("", html)
    out, at = [], 0
    for skip in NOT_MATH.finditer(html):
        out += [MATH.sub(one, html[at:skip.start()]), skip.group(0)]
        at = skip.end()
    out.append(MATH.sub(one, html[at:]))
    return "".join(out)


def _lesson_pages_plugin():
    """A small MkDocs plugin, added to the build's plugins, for every lesson page: its math as
    MathML (``math_to_mathml``) and its table of contents pointed at its headings
    (``align_toc``)."""
    from mkdocs.plugins import BasePlugin

    class LessonPages(BasePlugin):
        def on_page_content(self, html, page, config, files):
            if not page.file.src_path.endswith(".ipynb"):
                return html
            if page.toc:
                align_toc(html, page.toc)
            return math_to_mathml(html)

    return LessonPages()


# --------------------------------------------------------------------------------------------
# the build
# --------------------------------------------------------------------------------------------

def stage(dest: Path, root: Path = ROOT, executed_dir: Path | None = None) -> list:
    """Lay the site's pages out in ``dest``; returns the lessons' part of the navigation."""
    extra: set[str] = set()
    pages = [("README.md", root / "README.md"), ("lessons/README.md", root / "lessons" / "README.md")]
    pages += [(p.relative_to(root).as_posix(), p) for p in sorted((root / "docs").rglob("*"))
              if p.is_file()]
    for repo_path, path in pages:
        out = dest / site_path(repo_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".md":
            out.write_text(rewrite_links(path.read_text(), repo_path, root, extra))
        else:
            shutil.copy2(path, out)
    nav, plotly = [{"About the lessons": "lessons/index.md"}], False
    for nb in lesson_notebooks(root):
        target = dest / "lessons" / nb.name
        plotly |= stage_lesson(nb, target, executed_dir)
        nav.append({_lesson_title(target): f"lessons/{nb.name}"})
    for repo_path in sorted(extra):               # files the pages link to: a lab, a script
        out = dest / site_path(repo_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / repo_path, out)
    assets = dest / "assets"
    if plotly:
        import plotly as plotly_pkg
        assets.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(plotly_pkg.__file__).parent / "package_data" / "plotly.min.js",
                     assets / "plotly.min.js")
    return nav


@contextlib.contextmanager
def _templates_compiled_once():
    """nbconvert makes a new Jinja environment for every notebook it converts (two per lesson:
    its HTML and its table of contents), and each compiled the same templates again: a fifth of
    a build's CPU. While this is open, each exporter class keeps its compiled templates in a
    Jinja bytecode cache in memory; Jinja checks each entry against its template's source (a
    checksum), so a template that differs is compiled afresh."""
    import jinja2
    from nbconvert.exporters.templateexporter import TemplateExporter

    class Compiled(jinja2.BytecodeCache):
        def __init__(self):
            self.code: dict[str, bytes] = {}

        def load_bytecode(self, bucket):
            if bucket.key in self.code:
                bucket.bytecode_from_string(self.code[bucket.key])

        def dump_bytecode(self, bucket):
            self.code[bucket.key] = bucket.bytecode_to_string()

    original, caches = TemplateExporter._create_environment, {}

    def create_environment(exporter):
        environment = original(exporter)
        environment.bytecode_cache = caches.setdefault(type(exporter), Compiled())
        return environment

    TemplateExporter._create_environment = create_environment
    try:
        yield
    finally:
        TemplateExporter._create_environment = original


def build(out: Path = DEFAULT_OUT, executed_dir: Path | None = None, quiet: bool = True) -> Path:
    """Build the site into ``out``: a new or empty folder, or an earlier build, which is replaced.
    Returns ``out``."""
    if not CONFIG.is_file():                         # a student release (workbook release)
        raise SiteError(f"no {CONFIG.name} in {ROOT}: the course site is built from the course "
                        f"repository, not from a student release")
    import importlib.util
    missing = [name for name in ("mkdocs", "material", "mkdocs_jupyter", "latex2mathml")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise SiteError(f"the site needs MkDocs, mkdocs-material, mkdocs-jupyter and latex2mathml "
                        f"({', '.join(missing)} missing): pip install -e '.[dev]'")
    # Material for MkDocs prints a notice about MkDocs 2.0 on every build; docs/site.md says what
    # it means for this site (mkdocs is held below 2 in the dev extra).
    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    os.environ.setdefault("DISABLE_MKDOCS_2_WARNING", "true")
    import logging

    import yaml
    from mkdocs.commands.build import build as mkdocs_build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort, ConfigurationError

    out = Path(out).resolve()
    # MkDocs empties the output folder first: never a folder that holds anything but a site
    if out == ROOT or out in ROOT.parents or (out.is_dir() and any(out.iterdir())
                                             and not (out / "sitemap.xml").is_file()):
        raise SiteError(f"{out} is not empty and holds no earlier build of the site, which "
                        f"would be deleted: choose a new or empty folder")
    with tempfile.TemporaryDirectory(prefix="workbook-site-") as tmp:
        src = Path(tmp) / "src"
        lessons_nav = stage(src, ROOT, executed_dir)
        nav = copy.deepcopy(yaml.safe_load(CONFIG.read_text())["nav"])
        nav.append({"Lessons": lessons_nav})
        # MkDocs's warnings (a broken link, a missing page) are printed; in strict mode each
        # one fails the build
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        mk_log = logging.getLogger("mkdocs")
        mk_log.addHandler(handler)
        mk_log.setLevel(logging.WARNING if quiet else logging.INFO)
        try:
            cfg = load_config(str(CONFIG), docs_dir=str(src), site_dir=str(out), nav=nav)
            cfg.plugins["workbook-lesson-pages"] = _lesson_pages_plugin()
            with _templates_compiled_once():
                mkdocs_build(cfg)
        except (Abort, ConfigurationError) as exc:
            raise RuntimeError(f"the site did not build: {exc}") from None
        finally:
            mk_log.removeHandler(handler)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="workbook site", description="Build the course site (README, docs/, lessons) with "
        "MkDocs into site/ or DIR. The lessons are not executed.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build the site")
    p.add_argument("-o", "--out", default=str(DEFAULT_OUT), metavar="DIR",
                   help="where the site goes (default: site/ at the repository root): a new or empty "
                        "folder, or an earlier build, which is replaced")
    p.add_argument("--executed", default=None, metavar="DIR",
                   help="a folder of executed lesson notebooks (NN_name.ipynb) to show, with "
                        "their outputs, in place of the stripped ones")
    p.add_argument("-v", "--verbose", action="store_true", help="MkDocs's own log lines too")
    args = parser.parse_args(argv)
    executed = Path(args.executed) if args.executed else None
    if executed is not None and not executed.is_dir():
        print(f"workbook site: --executed {executed}: no such folder", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        out = build(Path(args.out), executed, quiet=not args.verbose)
    except SiteError as exc:
        print(f"workbook site: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"workbook site: {exc}", file=sys.stderr)
        return 1
    pages = sum(1 for _ in out.rglob("*.html"))
    print(f"site built in {time.perf_counter() - t0:.1f} s: {pages} pages in {out} "
          f"(open {out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
