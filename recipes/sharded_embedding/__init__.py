"""Sharded-embedding recipe: a click-through model over self-sharding tables (see trainer.py)."""
