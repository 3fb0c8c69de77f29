"""The one HTTP call every client of a generation server makes: JSON in, JSON out, retried.

Retried: connection errors, timeouts, HTTP 5xx, and 429 (rate limited, worth waiting for). Never
other 4xx: the request itself is wrong, and sending it again cannot help.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any, Mapping

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """A server answered with an error, or could not be reached after all retries; names the URL.
    `status`: the HTTP status of an answered error, else None."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    timeout_s: float = 600.0  # Per HTTP request; a long generation batch needs minutes.
    max_retries: int = 5  # On connection errors, timeouts, 5xx and 429; never on other 4xx.
    backoff_s: float = 0.5  # First retry delay; doubles each time up to max_backoff_s.
    max_backoff_s: float = 30.0
    batch_size: int = 64  # Prompt copies per /generate request (SGLang client).
    concurrency: int = 4  # /generate requests in flight at once (SGLang client).


def request_json(url: str, method: str, body: Any = None, *, config: ClientConfig = ClientConfig(),
                 retry: bool = True, headers: Mapping[str, str] | None = None) -> Any:
    """`method url` with `body` as JSON; the decoded JSON answer (None for an empty body)."""
    data = None if body is None else json.dumps(body).encode()
    head = {"Content-Type": "application/json", **(headers or {})}
    delay = config.backoff_s
    attempts = 1 + (config.max_retries if retry else 0)
    for attempt in range(attempts):
        req = urllib.request.Request(url, data=data, method=method, headers=head)
        try:
            with urllib.request.urlopen(req, timeout=config.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            if e.code < 500 and e.code != 429:
                raise ServerError(f"{url}: HTTP {e.code}: {detail}", status=e.code) from None
            why = f"HTTP {e.code}: {detail}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            why = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        if attempt + 1 < attempts:
            log.warning("%s failed (%s); retry %d/%d in %.1fs", url, why, attempt + 1, attempts - 1, delay)
            time.sleep(delay)
            delay = min(delay * 2, config.max_backoff_s)
    raise ServerError(f"{url}: failed after {attempts} attempt(s): {why}")
