"""Triton Python models (``model.py``), run in-process or, on request, in worker processes.

corral's ``triton_python_backend_utils`` (:mod:`.backend_utils`), the Session that runs a
model's instances (:mod:`.session`), and an instance's child process (:mod:`.worker`, the
parent's side; :mod:`.worker_child`, the child's) for ``corral_isolation: process``.
"""
