"""The trained detector for other processes: the Detector SavedModel (written by
`vision.export.saved_model`, loaded by `vision.export.load`) and its LiteRT and ONNX files."""
