"""FedD3A domain-aware distillation (Su et al., 2023)."""
