"""keras-rs click recipe: a DLRM / DCN-v2 model written with keras-rs, its tables sharded (see trainer.py)."""
