"""One package per method.

Each of `tff_kd/methods/<m>/` holds `<m>_tf.py` (the pure-TF maths, tested
eagerly), `<m>_tff.py` (the TFF stages, the builder and the registry entry
`METHOD`) and `hparams.py` (its config section as a frozen dataclass).
Method packages import only the shared building blocks (`tff_kd.core`,
`tff_kd.federated`, `tff_kd.models`, `tff_kd.hparams` and
`tff_kd.methods.common`), never each other; a variant may import its base
(FedProx imports FedAvg). tests/test_layout.py checks this.
"""
