"""tfdist-launch (TF-free): local clusters of tfdist-train tasks, their supervision, Kubernetes manifests."""
