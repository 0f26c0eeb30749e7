"""FedDF ensemble distillation (Lin et al., 2020)."""
