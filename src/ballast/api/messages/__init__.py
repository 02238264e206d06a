"""The Anthropic Messages API in front of any chat upstream: request.py (Messages -> chat),
answer.py (a chat answer -> a Message), stream.py (chat SSE -> Anthropic's events),
errors.py, shape.py (the Shape the pipeline runs it through) and count.py (count_tokens)."""

from ballast.api.messages.count import COUNTING, CountTokens
from ballast.api.messages.shape import MESSAGES, MessagesShape

__all__ = ["COUNTING", "MESSAGES", "CountTokens", "MessagesShape"]
