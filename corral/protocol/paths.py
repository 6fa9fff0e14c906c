"""Error texts as a client may read them: the server's folders named relative, never absolute.

A load failure, a malformed config or a missing file says where it happened, with the file's
absolute path: the server's log keeps that text whole. A client is told the same thing with
the repository's folder left out (``/srv/models/fraud/1/model.onnx`` becomes
``fraud/1/model.onnx``, the folder itself "the repository") and an upload's private folder
named by its model (``/tmp/corral-uploads-x1/fraud.3/1/model.onnx`` becomes
``fraud/1/model.onnx``): it names models and tensors, and tells an attacker nothing of the
server's layout.

Example::

    public_text(host, "could not load model /srv/models/fraud/1/model.onnx: ...")
    # 'could not load model fraud/1/model.onnx: ...'
"""

from __future__ import annotations

import os
import re
import tempfile

from corral._host import Host

__all__ = ["public_text"]

# An upload's folder, as corral._host.uploads.Uploads makes it:
# <tmp>/corral-uploads-*/<name>.<n> What may follow a path in a message: the end, a space, a quote
# or punctuation.
_PATH_ENDS = r"(?=$|[\s'\":,;)\]])"
_UPLOAD_FOLDER = re.compile(r"/corral-uploads-[^/\s]+/([^/\s]+)\.\d+")


def public_text(host: Host, text: str) -> str:
    """``text`` with ``host``'s repository folder and upload folders named relative."""
    if "/" not in text:
        return text
    repository = host.repository
    roots = {str(repository.given), str(repository.root)}
    for root in sorted(roots, key=len, reverse=True):
        if root in text:
            # The root itself, not a sibling that starts with its name (/srv/models2).
            text = text.replace(root + os.sep, "")
            text = re.sub(re.escape(root) + _PATH_ENDS, "the repository", text)
    if "corral-uploads-" in text:
        temporary = {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
        for folder in sorted(temporary, key=len, reverse=True):
            text = re.sub(re.escape(folder) + _UPLOAD_FOLDER.pattern, r"\1", text)
        text = _UPLOAD_FOLDER.sub(r"\1", text)  # a TMPDIR other than the one seen here
    return text
