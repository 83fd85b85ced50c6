"""What a user subclasses or names: `Trainer`, `KerasTrainer`, what a Trainer takes from a compiled model, input helpers."""
