"""The shared mechanisms every layer leans on: the clock, the failure taxonomy, the circuit
breaker, the sliding window, the retry budget, backoff and `Retry-After` parsing,
and the cache of remote resource handles. Nothing here imports any other part of Ballast."""
