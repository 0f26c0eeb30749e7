"""The program's public API: the one module users, binaries and studies import.

Everything else in `tff_kd.program` is imported only inside the package (a
test checks it). The run's validated settings are the currency: a config
(`configs/`, the command line, a saved `config.json`) is validated once
into `Settings` (`from_config`), and everything below reads those.

* Settings: `default_config` (every key with its default, as
  `configs/base.py`), `with_overrides` and `parse_value` (`key=value`
  changes), `from_config` (the one validation; `Settings`).
* Runs: `set_context` (the TFF context the runtime section asks for),
  `prepare` (loads, holds out and partitions the data, writes the clients'
  and server's arrays, builds the method's process and the evaluations:
  an `Experiment`; or takes a TFF `ClientData`'s own clients,
  `prepare(settings, root_dir, client_data=..., test_data=...)`), `run`
  (prepare and run the rounds), `run_experiment` (the rounds of an
  experiment prepared elsewhere: FedJAX's shape, for a notebook that
  brings its own process or data), `RunResult`, `evaluate`, `warm_up`,
  `build_dataset_process` (the process with dataset-taking clients, for
  `tff.learning.programs.train_model`), `split_arrays` (the clients',
  test and server arrays a run of a central dataset uses, in memory:
  `Split`).
* Run folders: `load_state` (the newest checkpointed state),
  `last_saved_round`, `locked` (one run per folder).
* Results: `read_metrics`, `best_round`, `group_runs`, `plot_runs`,
  `plot_histories` (curves of histories held in memory).
* `sample_clients`: the seeded client sample of a round.
* Studies (the `compare` command; `tff_kd.program.compare`): `StudyEntry`,
  `study_entries` and `parse_variant` (methods and named variants),
  `parse_seeds`, `plan_study` (every run's config validated before any
  run: `StudyRun`s), `study_lock`, `run_study` (each run in
  `<out>/runs/<label>_s<seed>/`, finished runs skipped, a stopped one
  resumed), `write_study_summary` (`summary.md`, `summary.csv`,
  `curves.png`; `StudySummary`), `summarize_study`, `LINK_ALIASES` (the
  link table's names a method reports under its own); the statistics over
  seeds the study scripts share: `mean_std`, `finite_mean`, `last_mean`,
  `mean_curve`, `seconds_per_round`.
* TFF's program logic (`tff.learning.programs.train_model`):
  `ClientDataSource`, `build_evaluation_manager`, `native_context`.

`run(settings, root_dir)` loads and partitions the data (every user error
surfaces there, before any TFF computation); resumes from the newest
checkpoint in `root_dir/checkpoints` or initialises from the seeded Keras
model; per round samples clients from (seed, round), runs `process.next`,
evaluates the global model, releases the metrics to CSV, TensorBoard and
the log, and checkpoints; and exports the final global model as a Keras
SavedModel.

Each name is imported from the module that defines it at its first use, so
that e.g. `plot` reads results without importing TensorFlow Federated, and
a run that plots nothing does not import Matplotlib.
"""

from tff_kd import lazy

# Public name -> the `tff_kd.program` module that defines it.
_EXPORTS = {
    'Settings': 'settings', 'default_config': 'settings',
    'from_config': 'settings', 'parse_value': 'settings',
    'with_overrides': 'settings',
    'Experiment': 'setup', 'build_dataset_process': 'setup',
    'prepare': 'setup', 'set_context': 'setup', 'Split': 'setup',
    'split_arrays': 'setup',
    'RunResult': 'loop', 'evaluate': 'loop', 'run': 'loop',
    'run_experiment': 'loop', 'warm_up': 'loop',
    'last_saved_round': 'checkpoints', 'load_state': 'checkpoints',
    'locked': 'run_folder',
    'best_round': 'plots', 'group_runs': 'plots', 'plot_histories': 'plots',
    'plot_runs': 'plots', 'read_metrics': 'plots',
    'sample_clients': 'sampling',
    'CLIENTS': 'compare', 'StudyEntry': 'compare', 'StudyRun': 'compare',
    'StudySummary': 'compare', 'VARIANT_SYNTAX': 'compare',
    'LINK_ALIASES': 'compare', 'fast_clients': 'compare',
    'finite_mean': 'compare',
    'last_mean': 'compare', 'mean_curve': 'compare', 'mean_std': 'compare',
    'parse_seeds': 'compare', 'parse_variant': 'compare',
    'plan_study': 'compare', 'run_study': 'compare',
    'seconds_per_round': 'compare', 'study_entries': 'compare',
    'study_lock': 'compare', 'summarize_study': 'compare',
    'write_study_summary': 'compare',
    'ClientDataSource': 'tff_programs',
    'build_evaluation_manager': 'tff_programs',
    'native_context': 'tff_programs',
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy.exports(globals(), 'tff_kd.program', _EXPORTS)
