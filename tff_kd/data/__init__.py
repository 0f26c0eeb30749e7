"""Datasets (tfds, raw files, bundled digits) and seeded client partitions."""

from tff_kd.data.datasets import DATASETS
from tff_kd.data.datasets import Dataset
from tff_kd.data.datasets import load_dataset
from tff_kd.data.datasets import load_domains
from tff_kd.data.datasets import load_tff
from tff_kd.data.datasets import normalise
from tff_kd.data.datasets import resize_images
from tff_kd.data.datasets import TFF_DATASETS
from tff_kd.data.partition import dirichlet_partition
from tff_kd.data.partition import domain_partition
from tff_kd.data.partition import fedgen_partition
from tff_kd.data.partition import iid_partition
from tff_kd.data.partition import label_counts
