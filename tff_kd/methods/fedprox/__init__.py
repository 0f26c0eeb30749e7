"""FedProx (Li et al., MLSys 2020)."""
