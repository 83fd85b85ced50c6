"""What to run, decided before TensorFlow starts (TF-free): the experiment, strategies, the cluster, plans."""
