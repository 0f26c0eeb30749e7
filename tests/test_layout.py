"""The package layout the redesign promised, checked on the source.

* A method package (`tff_kd/methods/<m>/`) imports only shared modules,
  never another method's package; a variant may import its base (FedProx
  imports FedAvg).
* The shared layers (`tff_kd.core`, `tff_kd.federated`, `tff_kd.models`,
  `tff_kd.data`) import no method package.
* Every method package has its `<m>_tff.py` with a registry entry, and the
  registry lists each package once.
* The tests follow the layout: every method package has its tests in
  `tests/methods/<m>/`, and every folder there is a method package's.
* `tff_kd.runtime` (TFF runtime glue) imports no program or method module;
  binaries and notebooks import only the program's entry module,
  `tff_kd.program.experiment`.
* No package's modules import each other in a circle, counting the imports
  inside functions: e.g. `tff_kd.models` imports in one direction, `names`
  (text) <- `base` <- `keras_models` <- `py_models` <- `classifiers` <-
  `pretraining` <- `pretrained`.
"""

import ast
import json
import pathlib

import pytest

from tff_kd.methods import registry

ROOT = pathlib.Path(__file__).resolve().parents[1] / 'tff_kd'
TESTS = pathlib.Path(__file__).resolve().parent
METHODS_DIR = ROOT / 'methods'
VARIANT_BASES = {'fedprox': {'fedavg'}}


def _imported_modules(path: pathlib.Path) -> set[str]:
  return _imported_modules_of(path.read_text())


def _imported_modules_of(source: str) -> set[str]:
  tree = ast.parse(source)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f'{node.module}.{a.name}' for a in node.names)
    elif isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
  return names


def _packages() -> list[str]:
  return sorted(p.name for p in METHODS_DIR.iterdir()
                if p.is_dir() and (p / '__init__.py').exists())


def _method_imports(path: pathlib.Path) -> set[str]:
  """The method packages a module imports."""
  found = set()
  for name in _imported_modules(path):
    parts = name.split('.')
    if parts[:2] == ['tff_kd', 'methods'] and len(parts) > 2 and (
        parts[2] in _packages()):
      found.add(parts[2])
  return found


def test_method_packages_import_no_other_method():
  wrong = []
  for package in _packages():
    allowed = {package} | VARIANT_BASES.get(package, set())
    for module in (METHODS_DIR / package).glob('*.py'):
      for other in _method_imports(module) - allowed:
        wrong.append(f'{module.relative_to(ROOT)} imports {other}')
  assert not wrong, wrong


def test_shared_layers_import_no_method():
  wrong = []
  for layer in ('core', 'federated', 'models', 'data'):
    for module in (ROOT / layer).glob('*.py'):
      for other in _method_imports(module):
        wrong.append(f'{module.relative_to(ROOT)} imports {other}')
  assert not wrong, wrong


def test_every_method_package_is_registered_once():
  for package in _packages():
    assert (METHODS_DIR / package / f'{package}_tff.py').exists()
  assert sorted(registry.METHODS) == _packages()


def test_the_library_imports_no_config_file():
  # Defaults live in the settings tree; configs/ only starts from it.
  wrong = [str(m.relative_to(ROOT)) for m in ROOT.rglob('*.py')
           if any(n == 'configs' or n.startswith('configs.')
                  for n in _imported_modules(m))]
  assert not wrong, wrong


def test_methods_and_shared_layers_import_no_program_module():
  wrong = []
  for layer in ('core', 'federated', 'models', 'data', 'methods'):
    for module in (ROOT / layer).rglob('*.py'):
      if any(n.startswith('tff_kd.program') for n in _imported_modules(module)):
        wrong.append(str(module.relative_to(ROOT)))
  assert not wrong, wrong


def test_every_method_package_has_its_tests_folder():
  missing = [
      f'tests/methods/{package}/'
      for package in _packages()
      if not (TESTS / 'methods' / package / '__init__.py').exists()
      or not list((TESTS / 'methods' / package).glob('test_*.py'))]
  assert not missing, f'method packages without tests: {missing}'
  folders = sorted(p.name for p in (TESTS / 'methods').iterdir()
                   if p.is_dir() and p.name != '__pycache__')
  assert folders == _packages()


def test_the_runtime_glue_imports_no_program_or_method():
  # `tff_kd.runtime` serves the program; it knows no config or method.
  wrong = [f'{m.relative_to(ROOT)} imports {n}'
           for m in (ROOT / 'runtime').rglob('*.py')
           for n in _imported_modules(m)
           if n.startswith(('tff_kd.program', 'tff_kd.methods'))]
  assert not wrong, wrong


def _program_imports_outside(folder: pathlib.Path) -> list[str]:
  """`tff_kd.program` modules other than the entry module that the Python
  files and notebooks under `folder` import."""
  found = []
  for path in sorted(folder.rglob('*')):
    if path.suffix == '.py':
      names = _imported_modules(path)
    elif path.suffix == '.ipynb':
      cells = json.loads(path.read_text())['cells']
      source = '\n'.join(''.join(c['source']) for c in cells
                         if c['cell_type'] == 'code')
      names = _imported_modules_of(source)
    else:
      continue
    for name in names:
      parts = name.split('.')
      if parts[:2] == ['tff_kd', 'program'] and len(parts) > 2 and (
          parts[2] != 'experiment'):
        found.append(f'{path.relative_to(ROOT.parent)} imports {name}')
  return found


@pytest.mark.parametrize('folder', ['binaries', 'notebooks'])
def test_users_of_the_program_import_only_its_entry_module(folder):
  wrong = _program_imports_outside(ROOT.parent / folder)
  assert not wrong, wrong


def test_the_entry_module_exports_what_it_lists():
  from tff_kd.program import experiment  # pylint: disable=g-import-not-at-top
  for name in experiment.__all__:
    assert getattr(experiment, name) is not None, name
  with pytest.raises(AttributeError):
    experiment.validate_config  # pylint: disable=pointless-statement


def _package_imports(folder: pathlib.Path) -> dict[str, set[str]]:
  """The modules of a package (the `.py` files of `folder`) -> those of
  them it imports, anywhere in its source (inside functions too)."""
  package = ['tff_kd', *folder.relative_to(ROOT).parts]
  modules = {p.stem for p in folder.glob('*.py') if p.stem != '__init__'}
  graph = {}
  for module in sorted(modules):
    graph[module] = set()
    for name in _imported_modules(folder / f'{module}.py'):
      parts = name.split('.')
      rest = parts[len(package):]
      if parts[:len(package)] == package and rest and rest[0] in modules:
        graph[module].add(rest[0])
    graph[module].discard(module)
  return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The import circles of a module graph: its strongly connected
  components of more than one module (Tarjan's algorithm), each sorted."""
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(module: str) -> None:
    index[module] = low[module] = len(index)
    stack.append(module)
    on_stack.add(module)
    for imported in sorted(graph[module]):
      if imported not in index:
        visit(imported)
        low[module] = min(low[module], low[imported])
      elif imported in on_stack:
        low[module] = min(low[module], index[imported])
    if low[module] == index[module]:
      component = []
      while not component or component[-1] != module:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        cycles.append(sorted(component))

  for module in sorted(graph):
    if module not in index:
      visit(module)
  return cycles


def test_the_cycle_finder_finds_a_circle():
  # tff_kd/models before issue 60: names -> pretraining -> (names, and
  # classifiers inside a function) and classifiers -> py_models (inside a
  # function) -> keras_models -> classifiers.
  graph = {'names': {'pretraining'}, 'pretraining': {'names', 'classifiers'},
           'classifiers': {'names', 'py_models'},
           'py_models': {'classifiers', 'keras_models', 'names'},
           'keras_models': {'classifiers'}, 'generators': {'classifiers'}}
  assert import_cycles(graph) == [
      ['classifiers', 'keras_models', 'names', 'pretraining', 'py_models']]
  # After: one direction.
  graph = {'names': set(), 'base': set(), 'keras_models': {'base'},
           'py_models': {'base', 'keras_models', 'names'},
           'classifiers': {'base', 'names', 'py_models'},
           'pretraining': {'classifiers', 'names'},
           'generators': {'classifiers', 'names'}}
  assert not import_cycles(graph)


@pytest.mark.parametrize('package', sorted(
    str(p.parent.relative_to(ROOT)) for p in ROOT.rglob('__init__.py')))
def test_no_package_imports_itself_in_a_circle(package):
  cycles = import_cycles(_package_imports(ROOT / package))
  assert not cycles, f'tff_kd/{package} imports in a circle: {cycles}'


MAX_ARGUMENTS = 10  # TFF's largest builder takes 10.
# Functions allowed more arguments, as '<path under tff_kd>:<name>'.
TOO_MANY_ARGUMENTS_ALLOWED = set()


def _argument_count(args: ast.arguments) -> int:
  """Positional and keyword-only parameters, without a leading self/cls."""
  positional = [a.arg for a in args.posonlyargs + args.args]
  if positional and positional[0] in ('self', 'cls'):
    positional = positional[1:]
  return len(positional) + len(args.kwonlyargs)


def test_no_function_takes_more_than_ten_arguments():
  # Arguments that always travel together are grouped (e.g.
  # `tff_kd.federated.learning.Training`), as TFF groups its own.
  wrong = []
  for module in sorted(ROOT.rglob('*.py')):
    for node in ast.walk(ast.parse(module.read_text())):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                               ast.Lambda)):
        continue
      name = getattr(node, 'name', '<lambda>')
      where = f'{module.relative_to(ROOT).as_posix()}:{name}'
      count = _argument_count(node.args)
      if count > MAX_ARGUMENTS and where not in TOO_MANY_ARGUMENTS_ALLOWED:
        wrong.append(f'{where} (line {node.lineno}) takes {count}')
  assert not wrong, wrong
