"""The configuration reference, generated from the settings tree.

`markdown()` renders every key of an experiment config as one Markdown
page, section by section in the generated config's order
(`tff_kd.program.settings.default_config`): the top-level keys, the shared
sections, `distill` and each registered method's section. A key's row
gives its default, its check (the summary of its checker's docstring) and
its documentation (its entry in the `Attributes:` section of its class's
docstring). `docs/CONFIG.md` is this page; regenerate it with

  python -m tff_kd.program.reference --write

(`tests/program/test_reference.py` fails while it is stale). Without
`--write` the page is printed.
"""

import argparse
import inspect
import pathlib
import re
from typing import Any, NamedTuple, Optional, Sequence

from tff_kd import hparams as hp
from tff_kd.methods import registry
from tff_kd.program import settings

COMMAND = 'python -m tff_kd.program.reference --write'
# The page, relative to the repository root.
OUTPUT = pathlib.PurePosixPath('docs/CONFIG.md')
# The prefix some checkers' docstrings start with, e.g. 'A checker: '.
_CHECKER_PREFIX = re.compile(r'^A checker( \([^)]*\))?: ')
_ENTRY = re.compile(r'  (\w+):(.*)')
_CODE_SPAN = re.compile(r'(`[^`]*`)')

_INTRO = (
    'Every key of an experiment config: its default, what it accepts and '
    'what it does. This page is generated from the settings tree '
    '(`tff_kd/program/settings.py`, `tff_kd/core/distillation.py` and '
    '`tff_kd/methods/<m>/hparams.py`, whose classes\' docstrings document '
    f'the keys) by `{COMMAND}`; do not edit it by hand. Set a key on the '
    '`train` command line as `--config.<section>.<key>=value` (a top-level '
    'key as `--config.<key>=value`), or in a config file whose '
    '`get_config()` starts from `configs/base.py`\'s. A method\'s section is '
    'used only when `method` names that method; the other methods\' keys '
    'are only checked to exist.')


class Row(NamedTuple):
  """One config key of the reference.

  Attributes:
    key: The full dotted key, e.g. 'dataset.data_dir'.
    default: Its default.
    check: What its checker accepts, in words.
    doc: Its documentation, on one line.
  """

  key: str
  default: Any
  check: str
  doc: str


class Section(NamedTuple):
  """One section of the reference.

  Attributes:
    cls: Its `hp.Hparams` class.
    title: Its heading, e.g. 'dataset' or 'dafkd: DaFKD ...' (with the
      description of the method it belongs to).
    summary: The summary of the class's docstring, on one line.
    rows: Its config keys, in declaration order.
    aliases: (old key, new key) of each renamed key (`hp.Hparams.ALIASES`).
  """

  cls: type[hp.Hparams]
  title: str
  summary: str
  rows: tuple[Row, ...]
  aliases: tuple[tuple[str, str], ...]


def section_classes() -> tuple[type[hp.Hparams], ...]:
  """Every section class, in the order `settings.default_config` builds."""
  return (settings.RunSettings,) + settings.all_sections()


def _summary(doc: Optional[str]) -> str:
  """The first paragraph of a docstring, on one line ('' if none)."""
  paragraph = inspect.cleandoc(doc or '').split('\n\n', 1)[0]
  return ' '.join(paragraph.split())


def check_text(checker: hp.Checker) -> str:
  """What `checker` accepts, in words: its docstring's summary (without a
  leading 'A checker: '), or else its name."""
  return (_CHECKER_PREFIX.sub('', _summary(checker.__doc__)) or
          checker.__name__)


def attribute_docs(cls: type) -> dict[str, str]:
  """Each entry of the `Attributes:` section of `cls`'s docstring.

  Returns:
    Attribute name -> its text joined onto one line, in docstring order;
    empty if the docstring has no `Attributes:` section.
  """
  lines = inspect.cleandoc(cls.__doc__ or '').splitlines()
  if 'Attributes:' not in lines:
    return {}
  entries: dict[str, list[str]] = {}
  name = None
  for line in lines[lines.index('Attributes:') + 1:]:
    if line and not line.startswith(' '):
      break  # The next section.
    match = _ENTRY.fullmatch(line)
    if match:
      name = match[1]
      entries[name] = [match[2]]
    elif name is not None:
      entries[name].append(line)
  return {n: ' '.join(' '.join(parts).split()) for n, parts in entries.items()}


def _title(cls: type[hp.Hparams]) -> str:
  """A section's heading: names the method whose section it is."""
  if not cls.SECTION:
    return 'Top-level keys'
  for method in registry.METHODS.values():
    if method.hparams is cls:
      return f'{cls.SECTION}: {method.description}'
  return cls.SECTION


def sections() -> list[Section]:
  """The reference's sections, in `section_classes()` order."""
  out = []
  for cls in section_classes():
    docs = attribute_docs(cls)
    defaults = cls()
    rows = tuple(
        Row(key=cls.key(f.name), default=getattr(defaults, f.name),
            check=check_text(f.metadata['check']), doc=docs.get(f.name, ''))
        for f in hp.config_fields(cls))
    aliases = tuple(
        (cls.key(old), alias.new if alias.moved else cls.key(alias.new))
        for old, alias in cls.ALIASES.items())
    out.append(Section(cls=cls, title=_title(cls),
                       summary=_summary(cls.__doc__), rows=rows,
                       aliases=aliases))
  return out


def _escape(text: str) -> str:
  """`text` safe in a Markdown table cell: pipes escaped, and `<` outside
  code spans, which would open an HTML tag."""
  parts = _CODE_SPAN.split(text.replace('|', r'\|'))
  return ''.join(part if i % 2 else part.replace('<', r'\<')
                 for i, part in enumerate(parts))


def _section_markdown(section: Section) -> list[str]:
  lines = [f'## {section.title}', '', _escape(section.summary), '',
           '| key | default | check | doc |', '| --- | --- | --- | --- |']
  for row in section.rows:
    cells = (f'`{row.key}`', f'`{row.default!r}`', row.check, row.doc)
    lines.append('| ' + ' | '.join(_escape(c) for c in cells) + ' |')
  recipes = [(m.name, m.distill_defaults)
             for m in registry.METHODS.values() if m.distill_defaults]
  if section.cls.SECTION == 'distill' and recipes:
    lines += ['', 'Methods with defaults of their own (in force where the '
              'config leaves the key unset, None):', '']
    lines += [f'* {name}: ' + ', '.join(f'`{k}={v!r}`'
                                        for k, v in defaults.items())
              for name, defaults in recipes]
  variants = section.cls.VARIANTS
  if variants:
    lines += ['', f'Presets (`{section.cls.key("variant")}`, '
              '[variants.md](variants.md)); a key a preset sets is unset '
              '(None) in the generated config, so that a value the config '
              'sets wins, and a key no preset in force sets takes the '
              'default above:', '']
    lines += [f'* `{name}`: {variant.summary} Sets ' + (', '.join(
        f'`{k}={v!r}`' for k, v in variant.keys.items()) or 'nothing') + '.'
              for name, variant in variants.items()]
  if section.aliases:
    lines += ['', 'Renamed or moved keys (old -> new), still read with a '
              'warning:', '']
    lines += [f'* `{old}` -> `{new}`' for old, new in section.aliases]
  return lines + ['']


def markdown() -> str:
  """The whole configuration reference as Markdown (`docs/CONFIG.md`)."""
  lines = ['# Configuration reference', '', _INTRO, '']
  for section in sections():
    lines += _section_markdown(section)
  return '\n'.join(lines)


def output_path() -> pathlib.Path:
  """`docs/CONFIG.md` of the checkout this module is in."""
  return pathlib.Path(__file__).resolve().parents[2] / OUTPUT


def write() -> pathlib.Path:
  """Writes `markdown()` to `output_path()`.

  Returns:
    The path written.

  Raises:
    FileNotFoundError: the module is not in a source checkout (no docs/
      folder next to the `tff_kd` package).
  """
  path = output_path()
  if not path.parent.is_dir():
    raise FileNotFoundError(
        f'{path.parent} does not exist: --write needs a source checkout of '
        'tff_kd (docs/ next to the tff_kd package)')
  path.write_text(markdown(), encoding='utf-8', newline='\n')
  return path


def main(argv: Optional[Sequence[str]] = None) -> None:
  """Prints the reference, or writes it to docs/CONFIG.md (`--write`)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--write', action='store_true',
                      help=f'write {OUTPUT} instead of printing the page')
  args = parser.parse_args(argv)
  if not args.write:
    print(markdown(), end='')
    return
  try:
    print(f'wrote {write()}')
  except FileNotFoundError as e:
    parser.error(str(e))


if __name__ == '__main__':
  main()
