"""URLs in files, messages and logs without their credentials."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_SECRET_PARAMS = re.compile(r"(^|&)((?:password|passwd|pwd|api[_-]?key|key|token|access[_-]?token"
                            r"|auth|secret|sig|signature)=)[^&]*", re.IGNORECASE)


def redact(url: str) -> str:
    """The URL with its password (``:pw@``) and secret query values (``?password=``,
    ``?api_key=``, ``?token=``, ...) replaced by ***, for files, messages and logs."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    query = _SECRET_PARAMS.sub(r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))
