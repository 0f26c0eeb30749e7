"""The docs a user works from: a short README whose links all resolve.

The README holds what the library is, the quick start, running your own
config, the methods in one line each, the headline results and links; the
rest lives in `docs/`. Every relative Markdown link in the README and in
`docs/` must point at a file of the checkout (and a `#fragment` at one of
its headings), so moving a section cannot leave a dead link.
"""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / 'README.md', *sorted((REPO / 'docs').rglob('*.md'))]
_LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
_README_MAX_LINES = 250


def _anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading's text."""
  text = re.sub(r'[^\w\- ]', '', heading.strip().lower())
  return text.replace(' ', '-')


def _anchors(page: pathlib.Path) -> set[str]:
  return {_anchor(line.lstrip('#')) for line in page.read_text().splitlines()
          if line.startswith('#')}


def test_the_readme_is_short():
  lines = len((REPO / 'README.md').read_text().splitlines())
  assert lines <= _README_MAX_LINES, (
      f'README.md has {lines} lines; move details into docs/')


def _prose(page: pathlib.Path) -> str:
  """The page without code: fenced blocks and inline code spans."""
  text = re.sub(r'(?ms)^```.*?^```', '', page.read_text())
  return re.sub(r'`[^`]*`', '', text)


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
  dead = []
  for target in _LINK.findall(_prose(page)):
    if re.match(r'^[a-z]+:', target):  # http:, mailto: ...
      continue
    path, _, fragment = target.partition('#')
    linked = (page.parent / path).resolve() if path else page
    if not linked.exists():
      dead.append(target)
    elif fragment and linked.suffix == '.md' and (
        fragment not in _anchors(linked)):
      dead.append(target)
  assert not dead, f'{page.name} links to missing targets: {dead}'
