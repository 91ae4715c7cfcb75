"""The detection commands: ``tfx-train-detr`` (`train`), ``tfx-detect`` (`detect`),
``tfx-evaluate-detr`` (`evaluate`); each module's ``main(argv=None)`` returns the exit code.

Importing this package loads no TensorFlow: each command silences its start-up lines first.
"""
