"""Classifiers with separable feature extractor and head (the library's CNN
and ResNet-11, Keras Applications as `keras:<name>`, any functional Keras
model through `from_keras`), their pretrained initial weights, generators,
and the DaFKD discriminator head."""

from tff_kd.models.classifiers import APPLICATIONS
from tff_kd.models.classifiers import Classifier
from tff_kd.models.classifiers import KERAS_PREFIX
from tff_kd.models.classifiers import MODELS
from tff_kd.models.classifiers import NORMS
from tff_kd.models.classifiers import build_classifier
from tff_kd.models.classifiers import check_model_name
from tff_kd.models.classifiers import is_application
from tff_kd.models.classifiers import num_parameters
from tff_kd.models.classifiers import parse_model_list
from tff_kd.models.generators import build_dcgan_generator
from tff_kd.models.generators import build_discriminator_head
from tff_kd.models.generators import build_feature_generator
from tff_kd.models.generators import build_image_generator
from tff_kd.models.generators import sample_noise
from tff_kd.models.keras_models import from_keras
from tff_kd.models.pretrained import IMAGENET
from tff_kd.models.pretrained import check_weights
from tff_kd.models.pretrained import check_weights_list
from tff_kd.models.pretrained import classifier_builder
from tff_kd.models.pretrained import model_fn_of
from tff_kd.models.pretrained import parse_weights_list
