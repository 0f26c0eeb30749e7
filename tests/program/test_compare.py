"""`tff_kd.program.compare` without running anything: entries, variants,
the plan's validated configs, and the statistics over seeds.

The binary and a real study: tests/binaries/test_compare.py.
"""

import ast
import logging
import math
import pathlib

from absl import logging as absl_logging
import pytest

from tests import helpers
from tff_kd import errors
from tff_kd.methods import registry
from tff_kd.program import compare
from tff_kd.program import experiment


def test_a_variant_is_a_method_and_its_overrides():
  entry = experiment.parse_variant(
      'dafkd_features:dafkd:dafkd.generator=feature;dafkd.aux_weight=1.0;'
      'local.amount=2;model.name=py:my_models:build')
  assert entry.label == 'dafkd_features' and entry.method == 'dafkd'
  # Values are parsed as train's --config.<key>=<value>; a value keeps its
  # colons.
  assert dict(entry.overrides) == {
      'dafkd.generator': 'feature', 'dafkd.aux_weight': 1.0,
      'local.amount': 2, 'model.name': 'py:my_models:build'}
  assert experiment.parse_variant('plain:fedavg').overrides == {}


@pytest.mark.parametrize('text,message', [
    ('fedavg', 'malformed'),
    (':fedavg', 'malformed'),
    ('x:fedavg:rounds', 'malformed'),
    ('x:fedavg:=1', 'malformed'),
    ('a b:fedavg', "the label 'a b' must start"),
    ('x:fedfoo', "method 'fedfoo' is unknown"),
    ('x:fedavg:rounds=1;rounds=2', "sets 'rounds' twice"),
    ('x:feddf:fedgen.hidden=8', "is in the fedgen method's section"),
    ('x:fedprox:distill.steps=3', 'fedprox has no distillation step'),
    ('x:fedftg:distill.steps=3', 'fedftg reads only distill.'),
])
def test_a_bad_variant_is_one_config_error(text, message):
  with pytest.raises(errors.ConfigError) as raised:
    experiment.parse_variant(text)
  assert message in str(raised.value)


def test_the_plan_validates_every_run_and_applies_its_overrides():
  entries = experiment.study_entries(
      ['fedavg'], ['fedprox_mu:fedprox:fedprox.mu=0.5;local.amount=2'])
  config = helpers.digits_config()
  plan = experiment.plan_study(config, entries, [3, 4], rounds=7)
  assert [(r.name, r.settings.run.method, r.settings.run.seed)
          for r in plan] == [('fedavg_s3', 'fedavg', 3),
                             ('fedavg_s4', 'fedavg', 4),
                             ('fedprox_mu_s3', 'fedprox', 3),
                             ('fedprox_mu_s4', 'fedprox', 4)]
  assert {r.settings.run.rounds for r in plan} == {7}
  assert plan[2].settings.hparams.mu == 0.5
  assert plan[2].settings.local.amount == 2
  assert plan[0].settings.local.amount == 1
  assert config.method == 'fedavg' and config.rounds == 2  # Unchanged.
  # A bad value names the entry and the seed.
  bad = experiment.study_entries([], ['x:fedprox:fedprox.mu=-1'])
  with pytest.raises(errors.ConfigError, match=r'^x \(fedprox\), seed 3: '):
    experiment.plan_study(config, bad, [3])
  wrong_type = experiment.study_entries([], ['x:fedavg:rounds=many'])
  with pytest.raises(errors.ConfigError, match="bad value 'many' for 'rounds'"):
    experiment.plan_study(config, wrong_type, [0])


def test_a_warning_about_the_config_is_logged_once_per_study(caplog):
  # dafkd.variant left unset with a dafkd key set: one warning for the
  # study, not one per seed; a warning outside the plan still shows.
  config = helpers.digits_config(**{'dafkd.aux_weight': 2.0})
  entries = experiment.study_entries(['dafkd', 'fedavg'])
  with caplog.at_level(logging.WARNING):
    plan = experiment.plan_study(config, entries, [0, 1, 2])
  assert len(plan) == 6
  unset = [r.getMessage() for r in caplog.records
           if 'dafkd.variant is unset' in r.getMessage()]
  assert unset == [
      "dafkd.variant is unset: the default preset 'features' runs "
      "(docs/variants.md), with this config's dafkd.aux_weight; name a "
      'preset to choose another'], unset
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    experiment.plan_study(config, entries[:1], [0])
    absl_logging.warning('after the plan')
    absl_logging.warning('after the plan')
  assert caplog.text.count('dafkd.variant is unset') == 1  # Its own study.
  assert caplog.text.count('after the plan') == 2


def test_every_kd_method_has_a_run_that_fills_its_link_table():
  # `link_checks.assert_fills_the_link_table(run, '<method>')` checks a real
  # run's row of the summary's link table; it is called on runs other tests
  # make. Every method with a server step must have one.
  checked = set()
  for path in pathlib.Path(__file__).resolve().parents[1].rglob('test_*.py'):
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == 'assert_fills_the_link_table'):
        checked.add(ast.literal_eval(node.args[1]))
  assert checked == {m.name for m in registry.METHODS.values()
                     if m.server_step}


def test_a_method_s_own_names_of_links_fill_the_shared_columns():
  # DaFKD's names for its own ensemble and the probability average: the same
  # values under the link table's names; its own stay, and a method that
  # logs the shared name keeps its value.
  history = {'round': [1, 2], 'test/accuracy': [0.5, 0.6],
             'distill/ensemble_accuracy_weighted': [0.7, float('nan')],
             'distill/ensemble_accuracy_uniform': [0.4, 0.6],
             'distill/labeled_accuracy_before': [0.5, 0.5],
             'distill/labeled_accuracy_after': [0.6, 0.4]}
  stats = compare.run_stats(0, history)['diagnostics']
  assert stats['distill/ensemble_labeled_accuracy'] == 0.7
  assert stats['distill/ensemble_labeled_accuracy_probs'] == 0.5
  assert stats['distill/ensemble_accuracy_weighted'] == 0.7
  assert stats['distill/ensemble_accuracy_uniform'] == 0.5
  shared = dict(history, **{'distill/ensemble_labeled_accuracy': [0.1, 0.3]})
  assert compare.run_stats(0, shared)['diagnostics'][
      'distill/ensemble_labeled_accuracy'] == pytest.approx(0.2)
  row = compare.summarize_entry(compare.StudyEntry('dafkd', 'dafkd'),
                                [compare.run_stats(0, history)])
  markdown = compare.study_markdown([row], title='t')
  assert ('| entry | ensemble_labeled_accuracy | '
          'ensemble_labeled_accuracy_probs | labeled_accuracy_before | '
          'labeled_accuracy_after | after > before |') in markdown
  assert '| dafkd | 0.7000 | 0.5000 | 0.5000 | 0.5000 | 0.50 |' in markdown


def test_seeds_are_integers_given_once():
  assert experiment.parse_seeds(['2', ' 0', '1']) == [2, 0, 1]
  for items, message in ((['0', '1.5'], "got '1.5'"), ([], 'is empty'),
                         (['1', '1'], 'listed twice')):
    with pytest.raises(errors.ConfigError) as raised:
      experiment.parse_seeds(items)
    assert message in str(raised.value)


def test_statistics_over_seeds_skip_what_is_not_a_number():
  mean, std = experiment.mean_std([0.5, 0.7, math.nan])
  assert mean == pytest.approx(0.6) and std == pytest.approx(0.1414213562)
  assert experiment.mean_std([0.4]) == (0.4, 0.0)
  assert math.isnan(experiment.mean_std([])[0])
  assert experiment.finite_mean([1.0, math.inf, 3.0]) == 2.0
  # The last 5 evaluated rounds (NaN: a round not evaluated).
  assert experiment.last_mean([0.0, 1.0, math.nan, 2, 3, 4, 5]) == 3.0
  assert experiment.mean_curve([[0.0, 1.0, 2.0], [2.0, 3.0]]) == [1.0, 2.0]
  # Round 1 traces: left out, unless it is the only one.
  assert experiment.seconds_per_round([9.0, 1.0, 2.0]) == 1.5
  assert experiment.seconds_per_round([9.0]) == 9.0


def test_a_run_s_numbers_come_from_its_metrics():
  history = {
      'round': [1.0, 2.0, 3.0],
      'test/accuracy': [0.5, 0.8, 0.7],
      'time/train_s': [5.0, 1.0, 3.0],
      'distill/labeled_accuracy_before': [0.4, 0.5, -1.0],  # -1: unmeasured.
      'distill/labeled_accuracy_after': [0.6, 0.4, -1.0],
      'distill/last_loss': [0.2, 0.4, math.nan],
  }
  stats = compare.run_stats(1, history)
  assert (stats['final'], stats['best'], stats['best_round']) == (0.7, 0.8, 2)
  assert stats['seconds_per_round'] == 2.0 and stats['rounds'] == 3
  assert stats['diagnostics'] == {
      'distill/labeled_accuracy_before': pytest.approx(0.45),
      'distill/labeled_accuracy_after': pytest.approx(0.5),
      'distill/last_loss': pytest.approx(0.3)}
  assert stats['raised'] == 0.5


def test_fast_clients_group_and_fuse_where_the_method_allows(monkeypatch):
  """`clients='fast'` (compare's default): G = ceil(K / 2) clients per call,
  fused where the method's clients and the model allow, in turn where the
  method only groups them; the rest, and a config that sets the runtime
  keys itself, stay as they are."""
  entries = experiment.study_entries(
      ['fedavg', 'fedgen', 'dafkd'],
      ['het:fedd3a:fedd3a.client_models=cnn;server_data.proxy=split;'
       'server_data.proxy_size=100',
       'own:fedprox:runtime.clients_per_call=2'])
  config = helpers.digits_config(clients_per_round=5)
  runtime = {r.entry.label: (r.settings.runtime.clients_per_call,
                             r.settings.runtime.client_execution)
             for r in experiment.plan_study(config, entries, [0])}
  assert runtime == {'fedavg': (3, 'fused'), 'fedgen': (3, 'fused'),
                     'dafkd': (1, 'sequential'),
                     'het': (1, 'sequential'), 'own': (2, 'sequential')}
  # A method that groups its clients but does not fuse them (none is
  # registered so now) runs them in turn.
  monkeypatch.setitem(registry.METHODS, 'fedgen', registry.METHODS[
      'fedgen']._replace(fuses_clients=False))
  (only,) = experiment.plan_study(config, entries[1:2], [0])
  assert (only.settings.runtime.clients_per_call,
          only.settings.runtime.client_execution) == (3, 'sequential')
  kept = experiment.plan_study(config, entries, [0], clients='config')
  assert {(r.settings.runtime.clients_per_call,
           r.settings.runtime.client_execution) for r in kept
          if r.entry.label != 'own'} == {(1, 'sequential')}
  with pytest.raises(errors.ConfigError,
                     match=r"clients='fused' is unknown; choose one of "
                     'fast, config'):
    experiment.plan_study(config, entries, [0], clients='fused')
