"""Exact-match response cache: a hash of the normalised request maps to one complete answer,
kept in Redis (behind the one breaker) or in an in-process LRU. A cache that cannot answer is
a miss, never an error."""
