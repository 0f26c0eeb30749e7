"""FedFTG data-free server fine-tuning (Zhang et al., 2022)."""
