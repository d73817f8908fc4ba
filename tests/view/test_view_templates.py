"""The view's pages come from templates that escape by construction (issue 42): no module
under orchestrator/view/ holds an HTML tag in a string (docstrings aside), no template marks a
value safe, the environment escapes every template, and every answer carries the CSP that
forbids inline script."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from cli_support import ROOT, Outcome
from starlette.testclient import TestClient

from lanefold.execution import open_store
from lanefold.view._app import CSP, create_app
from lanefold.view._templates import pages

VIEW = ROOT / "orchestrator" / "view"
TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9-]*(\s|>|/>|$)|<!|&[a-z]+;|&#")
# A template that marks a value safe, turns escaping off, or builds Markup: each a way around it.
UNESCAPED = re.compile(r"\|\s*safe\b|\bMarkup\b|autoescape\s+false|\|\s*tojson\b", re.IGNORECASE)


def _docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def html_in_strings(source: str, name: str = "<source>") -> list[str]:
    """Each string literal (an f-string's literal parts too; docstrings aside) holding an HTML
    tag or entity, and each name of markupsafe's or jinja2's way to mark a string safe."""
    tree = ast.parse(source, filename=name)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if TAG.search(node.value):
                found.append(f"{name}:{node.lineno} {node.value[:60]!r}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("markupsafe", "html"):
            found.append(f"{name}:{node.lineno} imports {node.module}")
        elif isinstance(node, ast.Name | ast.Attribute | ast.alias):
            named = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else node.name
            )
            if named in ("Markup", "markupsafe", "escape"):
                found.append(f"{name}:{getattr(node, 'lineno', 0)} uses {named}")
    return found


def test_the_scan_sees_html_in_every_kind_of_string() -> None:
    caught = html_in_strings(
        '"""A docstring may say <b>."""\n'
        "a = '<p>' + x\n"
        'b = f"<td>{x}</td>"\n'
        "c = '</div>'\n"
        "d = '&amp;'\n"
        "from markupsafe import Markup\n"
        "e = Markup(x)\n"
        "f = 'a < b and 3<4'\n"
    )
    lines = sorted({int(hit.split()[0].split(":")[1]) for hit in caught})
    assert lines == [2, 3, 4, 5, 6, 7], caught  # not the docstring (1), not a comparison (8)


def test_no_view_module_builds_html_in_python() -> None:
    modules = sorted(VIEW.rglob("*.py"))
    assert modules, VIEW
    found = [hit for path in modules for hit in html_in_strings(path.read_text(), path.name)]
    assert found == []


@pytest.mark.parametrize("template", sorted(p.name for p in (VIEW / "templates").glob("*.html")))
def test_no_template_marks_a_value_safe(template: str) -> None:
    text = (VIEW / "templates" / template).read_text()
    assert UNESCAPED.findall(text) == []


def test_the_scan_of_templates_sees_each_way_around_escaping() -> None:
    for text in (
        "{{ x|safe }}",
        "{{ x | safe }}",
        "{% autoescape false %}",
        "{{ Markup(x) }}",
        "{{ x|tojson }}",
    ):
        assert UNESCAPED.search(text), text


def test_every_template_escapes_whatever_its_name() -> None:
    env = pages.env
    assert all(
        env.autoescape(name) if callable(env.autoescape) else env.autoescape for name in ("a.html", "a.txt")
    )
    rendered = env.from_string("{{ x }}<i title='{{ x }}'></i>").render(x="<b>'\"&")
    assert rendered == "&lt;b&gt;&#39;&#34;&amp;<i title='&lt;b&gt;&#39;&#34;&amp;'></i>"


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/runs/done",
        "/runs/nope",
        "/runs/bad%20id",
        "/evals",
        "/evals/nope",
        "/budgets",
        "/login",
        "/static/view.js",
        "/none",
    ],
)
def test_every_answer_carries_the_policy(finished: Outcome, runs: Path, path: str) -> None:
    answer = TestClient(create_app(open_store(None, runs))).get(path)
    assert answer.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert answer.headers["x-content-type-options"] == "nosniff"


def test_the_live_feed_and_a_refusal_behind_the_key_carry_it_too(finished: Outcome, runs: Path) -> None:
    client = TestClient(create_app(open_store(None, runs), api_key="sesame"))
    assert client.get("/").headers["content-security-policy"] == CSP  # the login form, 401
    with client.stream("GET", "/live/runs/done", headers={"Authorization": "Bearer sesame"}) as feed:
        assert feed.headers["content-security-policy"] == CSP


def test_no_page_holds_an_inline_script_or_style(finished: Outcome, runs: Path) -> None:
    client = TestClient(create_app(open_store(None, runs)))
    for path in ("/", "/runs/done", "/evals", "/budgets", "/login"):
        text = client.get(path).text
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", text) == [], path
        assert " style=" not in text and "<style" not in text and " on" + "load=" not in text, path
