"""Data: WordPiece tokenizer, embedded corpus, pretraining shards and their tf.data reader.

Import the submodules directly (`from electra_tf.data.tokenizer import WordpieceTokenizer`);
this package keeps its import light so `electra_tf.data.corpus` works without TensorFlow.
"""
