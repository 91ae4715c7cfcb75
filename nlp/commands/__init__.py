"""The translation commands: ``tfx-train-nmt`` (`train`), ``tfx-translate`` (`translate`),
``tfx-evaluate-nmt`` (`evaluate`); each module's ``main(argv=None)`` returns the exit code.

Importing this package loads no TensorFlow: each command silences its start-up lines first.
"""
