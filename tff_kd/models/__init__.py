"""Classifiers with separable feature extractor and head; generators; the
DaFKD discriminator head."""

from tff_kd.models.classifiers import Classifier
from tff_kd.models.classifiers import MODELS
from tff_kd.models.classifiers import NORMS
from tff_kd.models.classifiers import build_classifier
from tff_kd.models.classifiers import num_parameters
from tff_kd.models.classifiers import parse_model_list
from tff_kd.models.generators import build_dcgan_generator
from tff_kd.models.generators import build_discriminator_head
from tff_kd.models.generators import build_feature_generator
from tff_kd.models.generators import build_image_generator
from tff_kd.models.generators import sample_noise
