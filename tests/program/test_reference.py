"""The configuration reference: docs/CONFIG.md is current and complete."""

import subprocess
import sys

import ml_collections

from tff_kd import hparams as hp
from tff_kd.program import reference
from tff_kd.program import settings


def _flat_keys(config: ml_collections.ConfigDict,
               prefix: str = '') -> set[str]:
  """The dotted keys of `config`'s values (sub-dicts are not keys)."""
  keys = set()
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys |= _flat_keys(value, f'{prefix}{name}.')
    else:
      keys.add(prefix + name)
  return keys


def _reference_keys() -> set[str]:
  """The keys the reference lists: its rows' and the renamed ones'."""
  return {key for section in reference.sections()
          for key in [r.key for r in section.rows] +
          [old for old, _ in section.aliases]}


def test_the_checked_in_page_is_current():
  path = reference.output_path()
  regenerate = f'regenerate it with `{reference.COMMAND}`'
  assert path.is_file(), f'{path} is missing; {regenerate}'
  assert path.read_bytes() == reference.markdown().encode('utf-8'), (
      f'{path} does not match the settings tree; {regenerate}')


def test_it_lists_exactly_the_default_config_keys():
  config_keys = _flat_keys(settings.default_config())
  keys = _reference_keys()
  assert not config_keys - keys, 'not in the reference'
  assert not keys - config_keys, 'not in the default config'
  page = reference.markdown()
  assert [k for k in sorted(keys) if f'`{k}`' not in page] == []


def test_every_section_and_key_is_documented():
  sections = reference.sections()
  assert [s.cls for s in sections] == list(reference.section_classes())
  assert settings.RunSettings in reference.section_classes()
  assert [s.title for s in sections if not s.summary] == []
  undocumented = [r.key for s in sections for r in s.rows if not r.doc]
  assert not undocumented, ('add them to the Attributes: docstrings',
                            undocumented)
  assert [r.key for s in sections for r in s.rows if not r.check] == []


def test_program_set_fields_are_not_keys():
  keys = _reference_keys()
  assert 'distill.steps' in keys
  assert 'distill.seed' not in keys


def test_checks_name_choices_and_method_sections_their_method():
  section = next(s for s in reference.sections() if s.cls.SECTION == 'dafkd')
  assert section.title.startswith('dafkd: DaFKD')
  assert ('dafkd.no_sharing', 'dafkd.shared_extractor') in section.aliases
  assert reference.check_text(hp.one_of('', 'sgd')) == "One of '', 'sgd'."
  assert reference.check_text(hp.positive_int).startswith('An integer >= 1')


def test_attribute_docs_join_continuations_and_stop_at_the_next_section():

  class Documented:
    """Summary.

    Attributes:
      a: One
        line | two.
      b: Three.

    Raises:
      c: Not an attribute.
    """

  assert reference.attribute_docs(Documented) == {'a': 'One line | two.',
                                                  'b': 'Three.'}


def test_the_module_prints_the_page():
  done = subprocess.run(
      [sys.executable, '-m', 'tff_kd.program.reference'],
      capture_output=True, text=True, check=True)
  assert done.stdout == reference.markdown()
