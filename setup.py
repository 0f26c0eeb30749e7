"""Installs tff_kd and the `train`, `plot` and `compare` console commands.

Dependencies are deliberately not declared in `install_requires`: TFF 0.87
pins jax/jaxlib 0.4.14, which the package registry no longer serves, so the
environment is installed from the fully pinned `requirements.txt` with
`pip install --no-deps` (see docs/DEVELOPING.md and the Makefile).
"""

import setuptools

setuptools.setup(
    name='tff_kd',
    version='0.1.0',
    description='Federated knowledge distillation (DaFKD, FedD3A, FedDF, '
    'FedGen, FedFTG) as TensorFlow Federated learning processes.',
    python_requires='>=3.11,<3.12',
    packages=setuptools.find_packages(
        include=['tff_kd', 'tff_kd.*', 'binaries', 'configs']),
    entry_points={'console_scripts': ['train = binaries.train:run',
                                      'plot = binaries.plot:run',
                                      'compare = binaries.compare:run',
                                      'tff_kd_worker = binaries.worker:run']},
)
