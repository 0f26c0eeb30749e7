"""FedAvg (McMahan et al., AISTATS 2017)."""
