"""Triton Python models (``model.py``) run in-process.

corral's ``triton_python_backend_utils`` (:mod:`.backend_utils`), and the Session that runs a
model's instances (:mod:`.session`).
"""
