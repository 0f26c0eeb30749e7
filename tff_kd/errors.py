"""User-facing error types.

Every problem a user can cause (a bad flag, config value, data file or
checkpoint) raises a subclass of `UserError` with a one-line message naming
the bad value, before any training starts. The `train` binary prints that
line and exits non-zero without a traceback; anything else is a bug and keeps
its traceback.
"""


class UserError(ValueError):
  """Base class of errors caused by user input."""


class ConfigError(UserError):
  """An unknown method, config key or an impossible setting."""


class CheckpointError(UserError):
  """A checkpoint that cannot be read or does not match the experiment."""


class TrainingError(UserError):
  """Training produced a non-finite loss or weights."""


class DataError(UserError):
  """A dataset that is unknown, missing, corrupt or cannot be downloaded."""


class RunFolderError(UserError):
  """A run folder (`--root_dir`) that cannot be used: empty, a file, not
  writable, or in use by another run."""


class StorageError(UserError):
  """The run folder could not be written mid-run (disk full, read-only)."""
