"""Example training recipes built on tfdist_trainer."""
