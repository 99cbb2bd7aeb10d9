"""The docs build's own checks (docs/_ext/hooks.py, run by ``mkdocs build --strict``) catch what
they claim: text meant for another renderer on a built page, and an API page that leaves out a
parameter's ``Args:`` entry or a type that a documented name returns."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
API_PAGE = (ROOT / "docs/api.md").read_text()


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs/_ext/hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("page_html", "what"),
    [
        ("<td>Default</td><td><code>Sentinel.UNSET</code></td>", "click's sentinel"),
        ("<p>about 45%% more time per episode</p>", "a doubled %"),
        ("<p>Returns a :class:`DatasetMeta`.</p>", "a Sphinx role"),
        ("<p>see <code>:func:`convert`</code></p>", "a Sphinx role"),
    ],
    ids=["no default", "doubled percent", "role", "role in code"],
)
def test_a_page_showing_another_renderers_text_is_caught(hooks, page_html, what):
    found = hooks.leftovers(page_html)
    assert len(found) == 1 and found[0].startswith(what), found


def test_a_clean_page_passes(hooks):
    page_html = "<p>45% more; <a href='#x'><code>DatasetMeta</code></a>; <code>a:b</code></p>"
    assert hooks.leftovers(page_html) == []


def test_the_api_page_leaves_nothing_out(hooks):
    assert hooks.reference_gaps(hooks.documented_objects(API_PAGE)) == []


def test_a_returned_type_left_off_the_api_page_is_a_gap(hooks):
    """``ds.meta`` is a ``DatasetMeta``: without its block, the page has a gap."""
    block = re.search(r"^::: [\w.]+\.DatasetMeta\n(?:    .*\n)*", API_PAGE, re.M)
    page = API_PAGE.replace(block[0], "")
    gaps = hooks.reference_gaps(hooks.documented_objects(page))
    assert any(g.endswith("returns lerobot_shards.reader.meta.metadata.DatasetMeta, which the "
                          "page does not document") for g in gaps), gaps  # fmt: skip


def test_a_parameter_without_its_args_entry_is_a_gap(hooks):
    import griffe

    code = '''
def documented(a, b=1):
    """A function.

    Args:
        a: the first.
        b: the second.
    """

def forgotten(a, b=1):
    """A function.

    Args:
        a: the first.
    """

class Thing:
    """A class.

    Args:
        size: how big.
    """

    def __init__(self, size, colour="red"):
        pass
'''
    with griffe.temporary_visited_module(code, docstring_parser="google") as module:
        assert hooks.undocumented_parameters(module["documented"]) == []
        assert hooks.undocumented_parameters(module["forgotten"]) == ["b"]
        assert hooks.undocumented_parameters(module["Thing"]) == ["colour"]
