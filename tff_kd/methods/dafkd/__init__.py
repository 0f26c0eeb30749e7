"""DaFKD domain-aware data-free KD (Wang et al., 2023)."""
