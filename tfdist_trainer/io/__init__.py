"""io/ (TF-free at import): model_dir files through tf.io.gfile: storage, records, markers, checkpoint names.

Its modules: model_dir: `storage` (every read and write, through `tf.io.gfile`, imported only
when a path is touched), `model_dir` (the one model_dir check), `records` (metrics.jsonl),
`checkpoint_names` (checkpoint steps and the newest, read without TF), `markers`
(`training_done`, a preempted ps's save request and the chief's answer)
"""
