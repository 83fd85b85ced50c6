"""MNIST recipe: data loading and model for tfdist_trainer examples."""
