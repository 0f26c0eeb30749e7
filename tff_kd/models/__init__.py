"""Classifiers with separable feature extractor and head (the library's CNN
and ResNet-11, Keras Applications as `keras:<name>`, any functional Keras
model through `from_keras`, a user's own model function as
`py:<module>:<function>`), their pretrained initial weights, generators,
and the DaFKD discriminator head.

The package imports its modules at the first use of one of their names
(PEP 562), so that `tff_kd.models.names` (the model and weights settings as
text, and their checks) and the names it exports here import no
TensorFlow: a config can be checked without it.
"""

from tff_kd import lazy

# Each public name, and the module of this package it comes from.
_EXPORTS = {
    # Text only (no TensorFlow).
    'APPLICATIONS': 'names',
    'IMAGENET': 'names',
    'KERAS_PREFIX': 'names',
    'MODELS': 'names',
    'NOISE_KINDS': 'names',
    'NORMS': 'names',
    'PY_PREFIX': 'names',
    'check_model_name': 'names',
    'check_py_model': 'names',
    'check_weights': 'names',
    'check_weights_list': 'names',
    'is_application': 'names',
    'is_py_model': 'names',
    'parse_model_list': 'names',
    'parse_weights_list': 'names',
    # TensorFlow.
    'Classifier': 'classifiers',
    'architecture_digest': 'classifiers',
    'build_classifier': 'classifiers',
    'num_parameters': 'classifiers',
    'build_dcgan_generator': 'generators',
    'build_discriminator_head': 'generators',
    'build_feature_generator': 'generators',
    'build_image_generator': 'generators',
    'sample_noise': 'generators',
    'from_keras': 'keras_models',
    'classifier_builder': 'pretrained',
    'model_fn_of': 'pretrained',
}
# The package's modules, also reachable as attributes (`models.pretrained`).
_MODULES = ('base', 'classifiers', 'generators', 'keras_models', 'names',
            'pretrained', 'pretraining', 'py_models')

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy.exports(globals(), __name__, _EXPORTS, _MODULES)
