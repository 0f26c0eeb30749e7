"""Studies use only the library's public API, checked on the source.

From `tff_kd.program` a study imports only the program's public module,
`tff_kd.program.experiment`; from the other `tff_kd` packages, any module.
No study reads an underscore attribute of a `tff_kd` module (e.g.
`setup._partition`), imports one by name, or assigns to an attribute of a
`tff_kd` module (monkeypatching).
"""

import ast
import pathlib

STUDIES = pathlib.Path(__file__).resolve().parents[2] / 'studies'
PROGRAM_PUBLIC = {'tff_kd.program', 'tff_kd.program.experiment'}


def _problems(path: pathlib.Path) -> list[str]:
  """What `path` does against the rule, one line each."""
  tree = ast.parse(path.read_text())
  tff_names = set()  # Local names bound to a tff_kd module or its members.
  problems = []

  def check_module(module: str, line: int) -> None:
    if module.startswith('tff_kd.program') and module not in PROGRAM_PUBLIC:
      problems.append(f'{path}:{line} imports {module}')

  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        check_module(a.name, node.lineno)
        if a.name.startswith('tff_kd'):
          tff_names.add(a.asname or a.name.split('.')[0])
    elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith(
        'tff_kd'):
      for a in node.names:
        check_module(f'{node.module}.{a.name}'
                     if node.module == 'tff_kd.program' else node.module,
                     node.lineno)
        if a.name.startswith('_'):
          problems.append(f'{path}:{node.lineno} imports {a.name}')
        tff_names.add(a.asname or a.name)
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      root = node
      while isinstance(root, ast.Attribute):
        root = root.value
      if not (isinstance(root, ast.Name) and root.id in tff_names):
        continue
      if node.attr.startswith('_') and not node.attr.startswith('__'):
        problems.append(f'{path}:{node.lineno} reads {node.attr}')
      if isinstance(node.ctx, (ast.Store, ast.Del)):
        problems.append(f'{path}:{node.lineno} assigns {root.id}.{node.attr}')
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
        node.func.id in ('setattr', 'delattr') and node.args and
        isinstance(node.args[0], ast.Name) and node.args[0].id in tff_names):
      problems.append(f'{path}:{node.lineno} calls {node.func.id} on '
                      f'{node.args[0].id}')
  return problems


def test_studies_use_only_public_api():
  files = sorted(STUDIES.rglob('*.py'))
  assert files
  problems = [p for f in files for p in _problems(f)]
  assert not problems, '\n'.join(problems)


def test_the_check_finds_what_it_forbids(tmp_path):
  bad = tmp_path / 'bad.py'
  bad.write_text(
      'from tff_kd.program import setup\n'
      'from tff_kd.program import experiment\n'
      'from tff_kd.methods.dafkd import dafkd_tf\n'
      'import tff_kd.program.loop\n'
      'dafkd_tf._start_round()\n'
      'experiment.prepare = None\n'
      'setattr(experiment, "run", None)\n')
  assert len(_problems(bad)) == 5, _problems(bad)
