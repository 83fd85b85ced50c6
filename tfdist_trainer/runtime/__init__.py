"""What a task does once TensorFlow runs: the training task (`train/`), serving (`serve`), evaluating (`evaluate`), and the machinery they share."""
