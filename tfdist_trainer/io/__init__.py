"""io/ (TF-free at import): model_dir files through tf.io.gfile: storage, records, markers, checkpoint names."""
