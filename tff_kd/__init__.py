"""tff_kd: federated knowledge distillation as TensorFlow Federated processes.

Importing the package has no side effects. Programs (the binaries, the
tests, notebooks, benchmarks) opt in to the process set-up they want by
calling `tff_kd.program.context.install()` first thing: it defers importing
tensorflow_probability to its first use and makes every TFF `worker_binary`
started by the process die with it.
"""

__version__ = '0.1.0'
