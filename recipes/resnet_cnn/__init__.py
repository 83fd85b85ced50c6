"""A ResNet-style CNN with BatchNormalization and skip connections (the model zoo's image model)."""
