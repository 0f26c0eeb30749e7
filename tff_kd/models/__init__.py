"""Classifiers with separable feature extractor and head (and, later, GANs)."""

from tff_kd.models.classifiers import Classifier
from tff_kd.models.classifiers import MODELS
from tff_kd.models.classifiers import NORMS
from tff_kd.models.classifiers import build_classifier
from tff_kd.models.classifiers import num_parameters
