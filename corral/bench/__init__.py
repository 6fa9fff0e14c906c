"""Benchmarks and the demo: tiny model builders and the scenarios behind ``corral demo``.

Needs the ``bench`` extra (``pip install 'corral[bench]'``).
"""
