"""FedGen data-free feature-generator KD (Zhu et al., 2021)."""
