"""The deployment: the inventory contract, its checks and the cohort plan rendered from it."""
