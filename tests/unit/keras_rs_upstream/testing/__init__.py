from keras_rs_upstream.testing.test_case import TestCase  # tfdist: was keras_rs.src.testing
from keras_rs_upstream.testing.test_case import uses_gpu  # tfdist: was keras_rs.src.testing
