"""The benchmark cases: one module each (``layers``, ``nmt``, ``detr``, ``engines``,
``formats``, ``serving``), run by ``benchmarks/harness.py``; a case's helper modules are named
after it (``engines_marian.py``, ``serving_client.py``...)."""
